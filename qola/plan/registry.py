"""qola's source registry (``registry.toml``): what cpp_itfs mode swaps into a module — and where
the files qola ships live in the package:

* ``qola/runtime/``   C/C++ compiled into the libraries qola builds: ``qola_common.h`` and the JIT
  runtime (``runtime/jit/``);
* ``qola/templates/`` sources qola adds to a module (``templates/wrappers/``, the hand-written
  cpp_itfs wrappers of the example tree) or runs around a generator (``templates/genwrap/``).

An AITER module's API is not kept here: the entry names the tree header that declares it
(``api_header``) and the functions exported (``exports``), and :mod:`qola.plan.itfs` generates the
wrapper and public header from the tree's declarations.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from qola.core import tomlfile
from qola.plan.itfs import Provide


def runtime_dir() -> Path:
    """``qola/runtime``: ``qola_common.h`` (an include dir of every cpp_itfs module) and ``jit/``."""
    return Path(str(resources.files("qola") / "runtime"))


def templates_dir() -> Path:
    """``qola/templates``: the registry's ``add_srcs`` / ``headers`` / ``add_includes`` are relative to it."""
    return Path(str(resources.files("qola") / "templates"))


def genwrap_script(name: str) -> Path:
    """``qola/templates/genwrap/<name>``: a script qola runs around a kernel tree's generator."""
    return templates_dir() / "genwrap" / name


data_dir = runtime_dir  # the include dir holding qola_common.h, by the name qola.plan.planner calls it


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
    # the API qola generates from the tree (qola.plan.itfs): the header declaring it (relative to the
    # meta dir), the functions forwarded, the public header's name, qola's own functions
    api_header: str | None = None
    exports: tuple[str, ...] = ()
    exports_if_declared: tuple[str, ...] = ()  # exported where api_header declares them, else a plan note
    public_header: str | None = None
    api_includes: tuple[str, ...] = ()
    provides: tuple[Provide, ...] = ()
    entry_macros: tuple[tuple[str, str], ...] = ()  # macros that define a C entry point: (macro, return type)
    # what the module needs to contain kernels, applied where the tree's sources ask (qola.plan.needs):
    switches: tuple[str, ...] = ()  # -D<NAME>=1 where a source gates code on NAME (#if NAME)
    generators: tuple[NeededGenerator, ...] = ()  # run where a source includes what they write

    def apply_sources(self, sources: list[str]) -> list[str]:
        kept = [s for s in sources if not any(fnmatch.fnmatch(Path(s).name, p) for p in self.drop_srcs)]
        return kept + [str(templates_dir() / s) for s in self.add_srcs]

    def include_dirs(self) -> list[str]:
        return [str(runtime_dir())] + [str(templates_dir() / d) for d in self.add_includes]

    def header_paths(self, meta_dir: Path) -> list[str]:
        return [str(templates_dir() / h) for h in self.headers] + [str(meta_dir / h) for h in self.tree_headers]


SCALARS = ("api_header", "public_header")


def _entry(entry: dict[str, Any]) -> RegistryEntry:
    special = ("provides", "entry_macros", "generators")
    fields: dict[str, Any] = {k: (v if k in SCALARS else tuple(v)) for k, v in entry.items() if k not in special}
    fields["provides"] = tuple(Provide(**p) for p in entry.get("provides", []))
    fields["entry_macros"] = tuple(sorted(entry.get("entry_macros", {}).items()))
    fields["generators"] = tuple(
        NeededGenerator(str(g["writes"]), str(g["command"])) for g in entry.get("generators", ())
    )
    return RegistryEntry(**fields)


@lru_cache(maxsize=1)
def load() -> dict[str, RegistryEntry]:
    raw = tomlfile.loads(Path(__file__).with_name("registry.toml").read_text())  # beside this module
    return {name: _entry(entry) for name, entry in raw.items()}


def entry(module: str) -> RegistryEntry | None:
    return load().get(module)
