"""qola's source registry (``registry.toml``): what cpp_itfs mode swaps into a module."""

from __future__ import annotations

import fnmatch
import sys
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def data_dir() -> Path:
    return Path(str(resources.files("qola") / "data"))


@dataclass(frozen=True)
class RegistryEntry:
    add_srcs: tuple[str, ...] = ()
    headers: tuple[str, ...] = ()
    add_includes: tuple[str, ...] = ()
    drop_srcs: tuple[str, ...] = ()
    embed: tuple[str, ...] = ()
    tree_headers: tuple[str, ...] = ()

    def apply_sources(self, sources: list[str]) -> list[str]:
        kept = [s for s in sources if not any(fnmatch.fnmatch(Path(s).name, p) for p in self.drop_srcs)]
        return kept + [str(data_dir() / s) for s in self.add_srcs]

    def include_dirs(self) -> list[str]:
        return [str(data_dir())] + [str(data_dir() / d) for d in self.add_includes]

    def header_paths(self, meta_dir: Path) -> list[str]:
        return [str(data_dir() / h) for h in self.headers] + [str(meta_dir / h) for h in self.tree_headers]


@lru_cache(maxsize=1)
def load() -> dict[str, RegistryEntry]:
    raw = tomllib.loads((Path(str(resources.files("qola"))) / "registry.toml").read_text())
    return {name: RegistryEntry(**{k: tuple(v) for k, v in entry.items()}) for name, entry in raw.items()}


def entry(module: str) -> RegistryEntry | None:
    return load().get(module)
