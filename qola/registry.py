"""qola's source registry (``registry.toml``): what cpp_itfs mode swaps into a module — and where
the files qola ships live in the package:

* ``qola/runtime/``   C/C++ compiled into the libraries qola builds: ``qola_common.h`` and the JIT
  runtime (``runtime/jit/``);
* ``qola/templates/`` sources qola adds to a module (``templates/wrappers/``, the cpp_itfs API
  wrappers the registry names) or runs around a generator (``templates/genwrap/``).
"""

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


def runtime_dir() -> Path:
    """``qola/runtime``: ``qola_common.h`` (an include dir of every cpp_itfs module) and ``jit/``."""
    return Path(str(resources.files("qola") / "runtime"))


def templates_dir() -> Path:
    """``qola/templates``: the registry's ``add_srcs`` / ``headers`` / ``add_includes`` are relative to it."""
    return Path(str(resources.files("qola") / "templates"))


def genwrap_script(name: str) -> Path:
    """``qola/templates/genwrap/<name>``: a script qola runs around a kernel tree's generator."""
    return templates_dir() / "genwrap" / name


REGISTRY = "qola/registry.toml"  # how messages name it
data_dir = runtime_dir  # the include dir holding qola_common.h, by the name qola.plan calls it


@dataclass(frozen=True)
class RegistryEntry:
    add_srcs: tuple[str, ...] = ()
    headers: tuple[str, ...] = ()
    add_includes: tuple[str, ...] = ()
    drop_srcs: tuple[str, ...] = ()
    embed: tuple[str, ...] = ()
    tree_headers: tuple[str, ...] = ()
    # appended to the module's lists (after a manifest override replaced them, after drop_directions
    # and receipt), as QoLA's registry does; plain values or expressions (qola.tree.overrides)
    add_flags_extra_hip: tuple[str, ...] = ()
    add_flags_extra_cc: tuple[str, ...] = ()
    add_blob_gen_cmd: tuple[str, ...] = ()

    def apply_sources(self, sources: list[str]) -> list[str]:
        kept = [s for s in sources if not any(fnmatch.fnmatch(Path(s).name, p) for p in self.drop_srcs)]
        return kept + [str(templates_dir() / s) for s in self.add_srcs]

    def include_dirs(self) -> list[str]:
        return [str(runtime_dir())] + [str(templates_dir() / d) for d in self.add_includes]

    def header_paths(self, meta_dir: Path) -> list[str]:
        return [str(templates_dir() / h) for h in self.headers] + [str(meta_dir / h) for h in self.tree_headers]


@lru_cache(maxsize=1)
def load() -> dict[str, RegistryEntry]:
    raw = tomllib.loads((Path(str(resources.files("qola"))) / "registry.toml").read_text())
    return {name: RegistryEntry(**{k: tuple(v) for k, v in entry.items()}) for name, entry in raw.items()}


def entry(module: str) -> RegistryEntry | None:
    return load().get(module)
