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


data_dir = runtime_dir  # the include dir holding qola_common.h, by the name qola.plan calls it


@dataclass(frozen=True)
class NeededGenerator:
    """A generator a module needs when one of its sources includes the file it ``writes``
    (``asm_fmha_v3_fwd_configs.hpp``); ``command`` is an AITER table expression (safe-evaluated)."""

    writes: str
    command: str


@dataclass(frozen=True)
class RegistryEntry:
    add_srcs: tuple[str, ...] = ()
    headers: tuple[str, ...] = ()
    add_includes: tuple[str, ...] = ()
    drop_srcs: tuple[str, ...] = ()
    embed: tuple[str, ...] = ()
    tree_headers: tuple[str, ...] = ()
    # what the module needs to contain kernels, applied where the tree's sources ask (qola.needs):
    switches: tuple[str, ...] = ()  # -D<NAME>=1 where a source gates code on NAME (#if NAME)
    generators: tuple[NeededGenerator, ...] = ()  # run where a source includes what they write

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
    return {name: _entry(entry) for name, entry in raw.items()}


def _entry(raw: dict) -> RegistryEntry:
    fields = {k: tuple(v) for k, v in raw.items() if k != "generators"}
    fields["generators"] = tuple(NeededGenerator(str(g["writes"]), str(g["command"])) for g in raw.get("generators", ()))
    return RegistryEntry(**fields)


def entry(module: str) -> RegistryEntry | None:
    return load().get(module)
