"""The JIT table a library records — the authority on what its deferred units are.

The generated table source (:func:`qola.jit.table.render_table`) puts, next to the C struct the
runtime uses, the same table as text in the ELF section ``.qola_jit`` (referenced from the struct,
so the linker keeps it)::

    "qola-jit-table 1\\n" + JSON {module, jit_dir_rel, lang, arch, compiler, compiler_id, headers,
                                  headers_sha256, headers_digest, flags, units: [{name, source,
                                  source_sha256, entry_symbol, content_key, n_funcs}]} + "\\n" NUL

Modules linked into one library concatenate their records. ``qola jit`` reads them with
pyelftools from shared objects and from the members of static archives, and trusts them over
``OUT/jit/<module>/index.json``: :func:`check_index` refuses an index that disagrees.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from qola.core.errors import QolaError
from qola.jit import format as fmt
from qola.jit import safeio, schema


@dataclass(frozen=True)
class LibUnit:
    name: str
    source: str
    source_sha256: str
    entry_symbol: str
    content_key: str
    n_funcs: int


@dataclass(frozen=True)
class LibModule:
    """One module's table as a library recorded it."""

    library: Path
    module: str
    jit_dir_rel: str
    lang: str
    arch: str
    compiler: str
    compiler_id: str
    headers: str  # "headers.tar.gz" or "" (no bundle)
    headers_sha256: str
    headers_digest: str  # qola.jit.key.headers_digest over every bundled file
    flags: tuple[str, ...]
    units: dict[str, LibUnit]

    def same_table(self, other: LibModule) -> bool:
        return {**vars(self), "library": None} == {**vars(other), "library": None}


def render_record(fields: dict[str, Any]) -> str:
    """The record text (ASCII) for the table source; ``fields`` as in the module docstring."""
    return fmt.RECORD_HEAD + json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=True) + "\n"


def parse_record(text: str, library: Path) -> LibModule:
    where = f"{library} (section {fmt.SECTION})"
    data = schema.loads(text[len(fmt.RECORD_HEAD) :].encode(), where)
    schema.check(data, schema.RECORD, where)
    units = schema.unique_units(data["units"], where)
    return LibModule(
        library=library, module=data["module"], jit_dir_rel=data["jit_dir_rel"], lang=data["lang"],
        arch=data["arch"], compiler=data["compiler"], compiler_id=data["compiler_id"], headers=data["headers"],
        headers_sha256=data["headers_sha256"], headers_digest=data["headers_digest"], flags=tuple(data["flags"]),
        units={n: LibUnit(n, u["source"], u["source_sha256"], u["entry_symbol"], u["content_key"], u["n_funcs"])
               for n, u in units.items()},
    )  # fmt: skip


class _Slice:
    """A read-only window [start, start+size) of a binary file (one member of an ar archive):
    the seek/tell/read that pyelftools uses."""

    def __init__(self, f: BinaryIO, start: int, size: int):
        self.f, self.start, self.size, self.pos = f, start, size, 0

    def seek(self, off: int, whence: int = 0) -> int:
        self.pos = max(0, off if whence == 0 else self.pos + off if whence == 1 else self.size + off)
        return self.pos

    def tell(self) -> int:
        return self.pos

    def read(self, n: int = -1) -> bytes:
        n = self.size - self.pos if n is None or n < 0 else min(n, self.size - self.pos)
        if n <= 0:
            return b""
        self.f.seek(self.start + self.pos)
        data = self.f.read(n)
        self.pos += len(data)
        return data


def _ar_members(f: BinaryIO, total: int) -> Iterator[tuple[int, int]]:
    """(offset, size) of the members of a System V / GNU ar archive, symbol tables skipped."""
    pos = 8
    while pos + 60 <= total:
        f.seek(pos)
        head = f.read(60)
        if len(head) < 60 or head[58:60] != b"`\n":
            return
        name = head[:16].rstrip()
        try:
            size = int(head[48:58].decode("ascii").strip() or "0")
        except ValueError:
            return
        data = pos + 60
        if name.startswith(b"#1/"):  # BSD: the name precedes the data
            n = int(name[3:] or b"0")
            data, size = data + n, size - n
        if name not in (b"/", b"//", b"/SYM64/", b"__.SYMDEF", b"__.SYMDEF SORTED") and size > 0:
            yield data, size
        pos = data + size + (size & 1)


def _sections(stream: BinaryIO) -> bytes | None:
    from elftools.common.exceptions import ELFError  # lazy: paid only by the callers that need it
    from elftools.elf.elffile import ELFFile  # lazy: paid only by the callers that need it

    try:
        sec = ELFFile(stream).get_section_by_name(fmt.SECTION)
        return None if sec is None or sec["sh_type"] == "SHT_NOBITS" else sec.data()
    except (ELFError, OSError, EOFError):
        return None  # not an ELF object pyelftools can read: it records nothing
    except Exception:
        return None


def read_library(path: Path) -> list[LibModule]:
    """The JIT tables recorded in a shared object or static archive (``[]`` if none)."""
    blobs: list[bytes] = []
    with safeio.open_regular(path, max_size=fmt.MAX_OBJECT, follow=True) as (fd, st), os.fdopen(os.dup(fd), "rb") as f:
        magic = f.read(8)
        if magic.startswith(b"\x7fELF"):
            f.seek(0)
            blobs.append(_sections(f) or b"")
        elif magic == b"!<arch>\n":
            for start, size in _ar_members(f, st.st_size):
                f.seek(start)
                if f.read(4) == b"\x7fELF":
                    blobs.append(_sections(_Slice(f, start, size)) or b"")  # type: ignore[arg-type]
    mods = []
    for blob in blobs:
        for chunk in blob.split(b"\0"):
            text = chunk.decode("ascii", errors="replace")
            if text.startswith(fmt.RECORD_HEAD):
                mods.append(parse_record(text, Path(path)))
    return mods


def library_files(lib_dir: Path) -> list[Path]:
    """Shared objects and static archives directly in ``lib_dir``."""
    try:
        names = sorted(os.listdir(lib_dir))
    except OSError:
        return []
    return [lib_dir / n for n in names if n.endswith((".so", ".a")) or ".so." in n]


def tables_for(jit_dirs: Sequence[Path], libraries: Iterable[Path] = ()) -> dict[Path, LibModule]:
    """jit dir -> the table of the library it belongs to: the given ``libraries``, else the
    shared objects / archives in ``<jit dir>/../../lib`` (OUT/lib for OUT/jit/<module>) whose
    table names the module and resolves its jit_dir_rel to that dir."""
    by_dir: dict[Path, LibModule] = {}
    cache: dict[Path, list[LibModule]] = {}
    explicit = [Path(p) for p in libraries]
    for d in jit_dirs:
        d_abs = Path(os.path.abspath(d))
        cands = explicit or library_files(d_abs.parent.parent / "lib")
        found: list[LibModule] = []
        for lib in cands:
            if lib not in cache:
                try:
                    cache[lib] = read_library(lib)
                except safeio.Refused:
                    if explicit:
                        raise
                    cache[lib] = []  # e.g. a FIFO or a dangling link among the libraries: not ours
            for m in cache[lib]:
                target = Path(os.path.normpath(Path(os.path.abspath(lib)).parent / m.jit_dir_rel))
                here = target == d_abs or os.path.realpath(target) == os.path.realpath(d_abs)
                if m.module == d_abs.name and (explicit or here):
                    found.append(m)
        if not found:
            where = ", ".join(map(str, explicit)) if explicit else f"{d_abs.parent.parent / 'lib'}"
            raise QolaError(f"no library records the JIT module of {d} (looked in {where})",
                            hint="give the library the module was built into with --library PATH "
                                 "(OUT/jit is only trusted as far as its library vouches for it)")  # fmt: skip
        if any(not found[0].same_table(m) for m in found[1:]):
            libs = ", ".join(sorted({str(m.library) for m in found}))
            raise QolaError(f"libraries disagree about JIT module {found[0].module}: {libs}",
                            hint="pick one with --library PATH")  # fmt: skip
        by_dir[d] = found[0]
    return by_dir


def check_index(index: schema.JitIndex, table: LibModule, where: str) -> None:
    """Refuse an ``index.json`` (:func:`qola.jit.layout.read_index`) that says anything else than the library's table."""

    def differ(what: str, a: object, b: object) -> QolaError:
        return QolaError(f"{where} does not match the library {table.library}: {what} is {a!r} in index.json "
                         f"but {b!r} in the library",
                         hint="OUT/jit was modified or belongs to another build: restore it from the build "
                              "that produced the library (or rebuild)")  # fmt: skip

    pairs = [("module", index.module, table.module), ("lang", index.lang, table.lang),
             ("arch", index.arch, table.arch), ("the flags", list(index.flags), list(table.flags)),
             ("the compiler identity", index.compiler_identity, table.compiler_id),
             ("the header bundle", index.headers_bundle, table.headers),
             ("the header bundle's sha256", index.headers_sha256, table.headers_sha256)]  # fmt: skip
    for what, a, b in pairs:
        if a != b:
            raise differ(what, a, b)
    units = index.units
    if set(units) != set(table.units):
        extra, missing = sorted(set(units) - set(table.units)), sorted(set(table.units) - set(units))
        raise differ("the unit list", extra[:3] or "-", missing[:3] or "-")
    for name, u in units.items():
        t = table.units[name]
        for key, got, mine in (("source", u.source, t.source), ("source_sha256", u.source_sha256, t.source_sha256),
                               ("entry_symbol", u.entry_symbol, t.entry_symbol),
                               ("content_key", u.content_key, t.content_key)):  # fmt: skip
            if got != mine:
                raise differ(f"unit {name}: {key}", got, mine)
