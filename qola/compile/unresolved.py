"""What a shared library needs that nothing it loads defines: the ``--no-undefined`` guarantee,
checked on the file after the link, whoever ran the link.

qola links every torch-free library with ``--no-undefined``, but a link can be taken over: ROCm/
ck-jit's interceptor sits at ``$CXX`` and relinks ``*libmha_(fwd|bwd)*.so`` itself, with
``--allow-shlib-undefined``. A library whose entry point calls a function no object defined links
all the same, and fails only in the consumer (a link with ``--no-undefined``, or ``dlopen`` with
``RTLD_NOW``, as Python imports an extension). So after the link the file is read back: each
undefined, non-weak symbol of ``.dynsym`` must be defined by a library in its ``DT_NEEDED`` closure,
each found as the dynamic loader finds it (``DT_RUNPATH``/``DT_RPATH`` with ``$ORIGIN``, the
toolchain's library dirs, the system's). Where a needed library cannot be found the answer is
unknown and nothing is claimed.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from qola.core import inputs
from qola.core.errors import QolaError

SYSTEM_DIRS = (
    "/lib/x86_64-linux-gnu",
    "/usr/lib/x86_64-linux-gnu",
    "/lib/aarch64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/lib64",
    "/usr/lib64",
    "/lib",
    "/usr/lib",
    "/usr/local/lib",
)
MAX_LIBS = 64  # a DT_NEEDED closure larger than this is not followed (unknown)
MAX_LIB = 16 << 30  # one shared library read (its headers and dynamic symbols only)


def _dynamic(path: Path) -> tuple[set[str], set[str], list[str], list[str]]:
    """(defined, undefined non-weak, DT_NEEDED, search dirs from DT_RUNPATH/DT_RPATH) of ``path``."""
    from elftools.common.exceptions import ELFError
    from elftools.elf.dynamic import DynamicSection
    from elftools.elf.elffile import ELFFile
    from elftools.elf.sections import SymbolTableSection

    defined: set[str] = set()
    undefined: set[str] = set()
    needed: list[str] = []
    dirs: list[str] = []
    try:  # the one checked open (a regular file, bounded), then pyelftools reads the descriptor
        fd, _ = inputs.open_checked(path, limit=MAX_LIB, what="shared library", follow=True)
        with os.fdopen(fd, "rb") as f:
            elf = ELFFile(f)
            table = elf.get_section_by_name(".dynsym")
            if isinstance(table, SymbolTableSection):
                for sym in table.iter_symbols():
                    if not sym.name or sym["st_info"]["type"] in ("STT_SECTION", "STT_FILE"):
                        continue
                    if sym["st_shndx"] != "SHN_UNDEF":
                        defined.add(sym.name)
                    elif sym["st_info"]["bind"] == "STB_GLOBAL":
                        undefined.add(sym.name)
            for sec in elf.iter_sections():
                if isinstance(sec, DynamicSection):
                    for tag in sec.iter_tags():
                        kind = tag.entry.d_tag
                        if kind == "DT_NEEDED":
                            needed.append(str(getattr(tag, "needed", "")))
                        elif kind in ("DT_RUNPATH", "DT_RPATH"):
                            run = str(getattr(tag, "runpath" if kind == "DT_RUNPATH" else "rpath", ""))
                            dirs += [d.replace("$ORIGIN", str(path.parent)) for d in run.split(":") if d]
    except (OSError, ELFError, QolaError):
        pass
    return defined, undefined, needed, dirs


def _find(name: str, dirs: Iterable[str]) -> Path | None:
    if "/" in name:
        return None
    for d in dirs:
        p = Path(d) / name
        if p.is_file():
            return p
    return None


def unresolved(path: str | os.PathLike[str], lib_dirs: Sequence[str] = ()) -> list[str] | None:
    """The undefined, non-weak dynamic symbols of the shared library ``path`` that no library of its
    ``DT_NEEDED`` closure defines (mangled, sorted); None when a needed library cannot be found."""
    path = Path(path)
    _, undefined, needed, own_dirs = _dynamic(path)
    if not undefined:
        return []
    dirs = [*own_dirs, *lib_dirs, str(path.parent), *SYSTEM_DIRS]
    seen: dict[str, Path] = {}
    todo = list(needed)
    provided: set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        found = _find(name, dirs)
        if found is None or len(seen) >= MAX_LIBS:
            return None
        seen[name] = found
        defined, _, more, _ = _dynamic(found)
        provided |= defined
        todo += more
    return sorted(undefined - provided)
