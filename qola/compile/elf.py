"""ELF export audit: what a built library really exports, and whether each export is allowed.

Reads ELF with pyelftools (no ``nm``/``readelf`` parsing). A shared library's exports are the
defined symbols of ``.dynsym``; a static archive's (or relocatable object's) exports are the
defined global, weak and GNU-unique symbols of every member's ``.symtab`` — hidden visibility
does not help there, a hidden global still collides in a static link.

The allowed set (:class:`ExportRule`) is the one qola's version script exports (see
:func:`qola.compile.link.version_script`); both are generated from this rule so they cannot drift:

* C++ entities of ``qola::<ns>::`` (the demangled name starts with ``qola::<ns>::``),
* their vtables, VTTs, typeinfo objects and typeinfo names, and function templates
  whose demangled name starts with a return type (matched on the mangled prefixes
  ``_ZN4qola<len><ns>``, ``_ZNK…``, ``_ZTVN…``, ``_ZTTN…``, ``_ZTIN…``, ``_ZTSN…``),
* C symbols starting with ``<ns>_``,
* exact extra names the caller adds (``PyInit_<module>`` for Python extension modules).

Nothing else — GNU ld 2.40 with ``local: *`` exports no ``_init``/``_fini``/``_edata``/
``_end``/``__bss_start``, so none of those are allowed.
"""

from __future__ import annotations

import io
import re
import shutil
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from qola.core import proc, rules
from qola.core.errors import BuildFailed, QolaError
from qola.core.rules import check_namespace

MAX_SHOWN = 50  # leaks listed in a BuildFailed message
_BINDINGS = {"STB_GLOBAL": "GLOBAL", "STB_WEAK": "WEAK", "STB_LOOS": "UNIQUE", "STB_GNU_UNIQUE": "UNIQUE"}
_KINDS = {
    "STT_FUNC": "FUNC",
    "STT_OBJECT": "OBJECT",
    "STT_TLS": "TLS",
    "STT_NOTYPE": "NOTYPE",
    "STT_COMMON": "COMMON",
    "STT_LOOS": "IFUNC",
    "STT_GNU_IFUNC": "IFUNC",
}


@dataclass(frozen=True)
class ExportRule:
    """The symbols one qola namespace may export."""

    namespace: str
    c_prefix: str | None = None  # default: "<namespace>_"
    extra: tuple[str, ...] = ()  # exact names, e.g. ("PyInit_mha",)

    def __post_init__(self) -> None:
        check_namespace(self.namespace)
        if self.c_prefix is not None and not rules.is_c_ident(self.c_prefix):
            raise QolaError(f"C prefix {self.c_prefix!r} is not an identifier prefix")

    @property
    def prefix(self) -> str:
        return self.c_prefix if self.c_prefix is not None else f"{self.namespace}_"

    @property
    def cxx_prefix(self) -> str:
        return f"qola::{self.namespace}::"

    @property
    def mangled_prefixes(self) -> tuple[str, ...]:
        nested = f"N4qola{len(self.namespace)}{self.namespace}"
        return (f"_Z{nested}", f"_ZNK{nested[1:]}", f"_ZTV{nested}", f"_ZTT{nested}", f"_ZTI{nested}", f"_ZTS{nested}")

    def allows(self, name: str, demangled: str) -> bool:
        return (
            name.startswith((self.prefix, *self.mangled_prefixes))
            or name in self.extra
            or demangled.startswith(self.cxx_prefix)
        )


@dataclass(frozen=True)
class Sym:
    name: str
    demangled: str
    kind: str  # FUNC OBJECT TLS IFUNC NOTYPE COMMON
    binding: str  # GLOBAL WEAK UNIQUE
    member: str = ""  # archive member that defines it ("" for a shared library)


@dataclass(frozen=True)
class AuditResult:
    path: Path
    namespace: str
    exports: list[Sym]
    leaks: list[Sym] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.leaks and bool(self.exports)

    def problems(self) -> list[str]:
        """One line per leak (demangled name, where it probably comes from); a line for no exports."""
        lines = [
            f"{s.demangled}  [{s.kind} {s.binding}{', ' + s.member if s.member else ''}]: "
            f"{probable_origin(s, self.namespace)}"
            for s in self.leaks
        ]
        if not self.exports:
            lines.append(
                f"exports nothing in qola::{self.namespace}:: or {self.namespace}_* — a version script "
                'with quoted C++ patterns ("qola::ns::*") matches nothing; qola\'s is unquoted'
            )
        return lines

    def raise_for_leaks(self) -> AuditResult:
        if self.ok:
            return self
        lines = self.problems()
        shown = lines[:MAX_SHOWN] + ([f"… and {len(lines) - MAX_SHOWN} more"] if len(lines) > MAX_SHOWN else [])
        body = "\n".join(f"  {line}" for line in shown)
        raise BuildFailed(
            f"{self.path}: {len(self.leaks)} symbol(s) outside the allowed set of namespace {self.namespace!r}:\n{body}"
            if self.leaks
            else f"{self.path}:\n{body}",
            hint=f"only qola::{self.namespace}::… and {self.namespace}_… may be exported; give "
            "helpers internal linkage (static / anonymous namespace) or put them in QOLA_NS_BEGIN/END",
        )


def probable_origin(sym: Sym, namespace: str) -> str:
    d = sym.demangled
    if not sym.name.startswith("_Z"):
        return f"a C symbol without the '{namespace}_' prefix — name it QOLA_C_NAME(...) or make it static"
    if d.startswith(("std::", "__gnu_cxx::", "__cxxabiv1::")) or "std::" in d.split("(")[0]:
        return (
            "a standard-library template instantiation — the artifact was linked without "
            "qola's version script / localisation (isolation off?)"
        )
    other = re.match(r"(?:[\w:<>, ]+ )?qola::(\w+)::", d)
    if other and other.group(1) != namespace:
        return f"belongs to namespace qola::{other.group(1)} — objects of another qola build mixed in"
    if d.startswith(("typeinfo", "vtable", "VTT", "guard variable", "construction vtable")):
        return "type data of a class outside qola::" + namespace + "::"
    return (
        f"a C++ symbol outside qola::{namespace}:: — wrap it in QOLA_NS_BEGIN/QOLA_NS_END or "
        "give it internal linkage (static / anonymous namespace)"
    )


# -- demangling -----------------------------------------------------------------------------


def demangle(names: Sequence[str], cxxfilt: str = "c++filt") -> list[str]:
    """Demangle ``names`` with one ``c++filt`` call (names on stdin). Without c++filt the names come
    back unchanged — the audit then still decides on the mangled prefixes."""
    if not any(n.startswith("_Z") for n in names):
        return list(names)
    exe = shutil.which(cxxfilt)
    if exe is None:
        return list(names)
    try:
        done = proc.run([exe], input="\n".join(names) + "\n", out=proc.SEPARATE, timeout=300)
    except (OSError, proc.TimeoutExpired):
        return list(names)
    out: list[str] = done.stdout.split("\n")
    if done.returncode != 0 or len(out) < len(names):
        return list(names)
    return out[: len(names)]


# -- reading ELF and ar -----------------------------------------------------------------------


def read_ar(data: bytes) -> Iterator[tuple[str, bytes]]:
    """(name, bytes) of each regular member of a System V / GNU (or BSD) ``ar`` archive."""
    if data.startswith(b"!<thin>\n"):
        raise QolaError("thin archives are not supported by the audit", hint="archive with 'ar rcsD'")
    if not data.startswith(b"!<arch>\n"):
        raise QolaError("not an ar archive")
    pos, longnames = 8, b""
    while pos + 60 <= len(data):
        head = data[pos : pos + 60]
        if head[58:60] != b"`\n":
            raise QolaError(f"corrupt ar header at offset {pos}")
        name, size = head[:16].decode("latin-1").rstrip(), int(head[48:58].decode().strip() or 0)
        body, pos = data[pos + 60 : pos + 60 + size], pos + 60 + size + (size & 1)
        if name == "//":
            longnames = body
            continue
        if name in ("/", "/SYM64/", "__.SYMDEF", "__.SYMDEF SORTED"):
            continue
        if name.startswith("#1/"):  # BSD: name stored in front of the data
            n = int(name[3:])
            name, body = body[:n].rstrip(b"\0").decode(), body[n:]
        elif name.startswith("/") and name[1:].isdigit():  # GNU long name
            start = int(name[1:])
            name = longnames[start : longnames.index(b"/\n", start)].decode()
        else:
            name = name[:-1] if name.endswith("/") else name
        yield name, body


def _elf_symbols(stream: BinaryIO, member: str, where: Path) -> Iterator[tuple[str, str, str, str]]:
    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile
    from elftools.elf.sections import SymbolTableSection

    try:
        elf = ELFFile(stream)
        table = elf.get_section_by_name(".dynsym" if elf["e_type"] == "ET_DYN" else ".symtab")
    except ELFError as exc:
        raise QolaError(f"{where}{f'({member})' if member else ''} is not a readable ELF file: {exc}") from exc
    if not isinstance(table, SymbolTableSection):  # None: no symbol table
        return
    for sym in table.iter_symbols():
        bind, kind = sym["st_info"]["bind"], sym["st_info"]["type"]
        if bind not in _BINDINGS or sym["st_shndx"] == "SHN_UNDEF" or not sym.name:
            continue
        if kind in ("STT_SECTION", "STT_FILE"):
            continue
        yield sym.name, _KINDS.get(kind, kind), _BINDINGS[bind], member


def exported_symbols(path: str | Path) -> list[Sym]:
    """Defined exported symbols of a shared library (``.dynsym``), a static archive or a
    relocatable object (global/weak/unique of ``.symtab``), sorted by (member, name)."""
    path = Path(path)
    raw: list[tuple[str, str, str, str]] = []
    try:
        with path.open("rb") as f:
            head = f.read(8)
            if head in (b"!<arch>\n", b"!<thin>\n"):
                for member, body in read_ar(head + f.read()):
                    if not body.startswith(b"\x7fELF"):
                        raise QolaError(
                            f"{path}: member {member} is not an ELF object (LLVM bitcode "
                            "from -flto?) — its symbols cannot be audited"
                        )
                    raw.extend(_elf_symbols(io.BytesIO(body), member, path))
            else:
                f.seek(0)
                raw.extend(_elf_symbols(f, "", path))  # streamed: large libraries are not read whole
    except OSError as exc:
        raise QolaError(f"cannot read {path}: {exc.strerror or exc}") from exc
    raw = sorted(set(raw), key=lambda r: (r[3], r[0]))
    names = demangle([r[0] for r in raw])
    return [Sym(r[0], d, r[1], r[2], r[3]) for r, d in zip(raw, names, strict=False)]


def allowed(sym: Sym, namespace: str, *, c_prefix: str | None = None, extra: Iterable[str] = ()) -> bool:
    return ExportRule(namespace, c_prefix, tuple(extra)).allows(sym.name, sym.demangled)


def audit_artifact(
    path: str | Path, namespace: str, *, c_prefix: str | None = None, extra: Iterable[str] = (), check: bool = True
) -> AuditResult:
    """Exports of ``path`` and those outside the allowed set; with ``check`` a leak (or an artifact
    that exports nothing at all) raises :class:`BuildFailed` naming every leaked symbol."""
    rule = ExportRule(namespace, c_prefix, tuple(extra))
    exports = exported_symbols(path)
    leaks = [s for s in exports if not rule.allows(s.name, s.demangled)]
    result = AuditResult(Path(path), namespace, exports, leaks)
    return result.raise_for_leaks() if check else result


@dataclass(frozen=True)
class ObjectSymbols:
    """Every named symbol of a relocatable object (locals and undefined references too) and its
    section names: what :mod:`qola.compile.hostonly` reads to see whether it holds device code."""

    defined: frozenset[str]
    undefined: frozenset[str]
    sections: frozenset[str]


def object_symbols(path: str | Path, mentioning: Sequence[bytes] = ()) -> ObjectSymbols | None:
    """:class:`ObjectSymbols` of the ELF object ``path``; QolaError when it is not one. With
    ``mentioning``: None when no symbol or section name holds any of those strings (the string
    tables searched as bytes: pyelftools takes about a second per 20,000 symbols)."""
    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile
    from elftools.elf.sections import SymbolTableSection

    defined: set[str] = set()
    undefined: set[str] = set()
    try:
        with Path(path).open("rb") as f:
            elf = ELFFile(f)
            table = elf.get_section_by_name(".symtab")
            if mentioning:
                names = [elf.get_section(elf["e_shstrndx"])]
                names += [elf.get_section(table["sh_link"])] if isinstance(table, SymbolTableSection) else []
                if not any(m in s.data() for s in names for m in mentioning):
                    return None
            sections = frozenset(s.name for s in elf.iter_sections())
            for sym in table.iter_symbols() if isinstance(table, SymbolTableSection) else ():
                if sym.name and sym["st_info"]["type"] not in ("STT_SECTION", "STT_FILE"):
                    (undefined if sym["st_shndx"] == "SHN_UNDEF" else defined).add(sym.name)
    except ELFError as exc:
        raise QolaError(f"{path} is not a readable ELF object: {exc}") from exc
    except OSError as exc:
        raise QolaError(f"cannot read {path}: {exc.strerror or exc}") from exc
    return ObjectSymbols(frozenset(defined), frozenset(undefined), sections)
