"""A cpp_itfs module's C++ API, read from the tree being built, and the wrapper and public header
qola generates from it.

The registry names what a module exports (``exports``) and the tree header that declares it
(``api_header``); :func:`resolve` reads the declarations there (:mod:`qola.plan.cdecl`) when the plan
is made, so the API follows the AITER commit: AITER's pre-2026 twelve-parameter ``mha_fwd``, the
two-parameter ``mha_fwd(mha_fwd_args, const ck_tile::stream_config&)`` of every TE pin since, and
whatever comes next. ``provides`` entries are functions qola defines itself where the tree has
what their body needs (``mha_bwd_workspace_size`` from CK's ``fmha_bwd_launcher``).

:func:`render_header` and :func:`render_wrapper` turn the :class:`Api` into text: for each
declaration ``qola::<ns>::f`` with the tree's parameter types, forwarding to the tree's
``aiter::f``; a class the tree takes by value is taken by const reference (QoLA's and TE's
hand-written entry points take ``const aiter::mha_fwd_args&``), everything else (scalars, enums,
pointers, references) as the tree declares it. Types and default arguments are spelled as the tree
spells them, looked up where the tree looks them up: in a helper namespace inside the declaration's
own namespace (``aiter::qola_api_<ns>``), which holds one alias per type; the symbol's mangled
name is the same as QoLA's ``qola::<ns>::mha_fwd(const aiter::mha_fwd_args&, const
ck_tile::stream_config&)``.
Declarations under preprocessor conditions keep them (``#if ENABLE_CK``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qola.core import inputs
from qola.core.errors import QolaError
from qola.plan.cdecl import Decl, DeclError, Header, literal_default, parse, read_header
from qola.plan.ctext import TYPE_WORDS

HEADER_SUFFIXES = (".h", ".hpp", ".hh", ".cuh", ".hxx")


@dataclass(frozen=True)
class Api:
    """What a cpp_itfs module exports, as the tree declares it."""

    header: str  # the tree header read, relative to the tree's meta dir
    include: str  # how the public header includes it ("mha_fwd.h")
    public_header: str  # the header qola generates ("qola_mha_fwd.h")
    decls: tuple[Decl, ...]  # forwarded to the tree's functions
    provided: tuple[Decl, ...] = ()  # defined by qola (Decl.body), where the tree has what they use
    includes: tuple[str, ...] = ()  # more headers the public header includes (registry api_includes)
    reads: tuple[str, ...] = ()  # the files the API was read from (absolute): a change re-plans

    @property
    def from_source(self) -> bool:
        """The API is declared in a source file (an entry-point macro), not a header: the public
        header includes ``includes`` only, the wrapper declares the tree's functions itself."""
        return not self.header.endswith(HEADER_SUFFIXES)

    def to_json(self) -> dict[str, Any]:
        return {
            "header": self.header,
            "include": self.include,
            "public_header": self.public_header,
            "decls": [d.to_json() for d in self.decls],
            "provided": [d.to_json() for d in self.provided],
            "includes": list(self.includes),
            "reads": list(self.reads),
            "signatures": [d.signature() for d in (*self.decls, *self.provided)],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Api:
        return cls(
            data["header"],
            data["include"],
            data["public_header"],
            tuple(Decl.from_json(d) for d in data["decls"]),
            tuple(Decl.from_json(d) for d in data.get("provided", [])),
            tuple(data.get("includes", [])),
            tuple(data.get("reads", [])),
        )


@dataclass(frozen=True)
class Provide:
    """A registry ``provides`` entry: a function qola defines in the module's library."""

    name: str
    returns: str
    params: str  # "const ::fmha_bwd_traits& traits"
    body: str
    include: str  # the header (as the api header includes it) that declares what the body uses
    requires: str = ""  # "Struct::member" that header must declare ("" = none)


_NAME = re.compile(r"[A-Za-z_]\w*\Z")
_FILE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]*\Z")
TORCH = re.compile(r"\b(?:torch|at|c10|pybind11|py)::")


@dataclass(frozen=True)
class ApiSpec:
    """What qola's registry says of a module's C++ API: the tree header that declares it
    (``api_header``), the functions it exports, the public header qola generates, the functions qola
    provides, the headers the public header includes and the macros that define a C entry point."""

    module: str
    api_header: str
    exports: Sequence[str]
    public_header: str
    provides: Sequence[Provide] = ()
    includes: Sequence[str] = ()
    entry_macros: Mapping[str, str] | None = None
    if_declared: Sequence[str] = ()  # exported where the header declares them; else a note names each


def _if_declared(spec: ApiSpec, path: Path, parsed: Header, notes: list[str] | None) -> list[str]:
    """The names of ``spec.if_declared`` the header declares; a note for each it does not (one it
    declares in a form the reader cannot represent is an error: :func:`read_header` names it)."""
    found = []
    for name in spec.if_declared:
        if parsed.named(name) or name in parsed.problems:
            found.append(name)
        elif notes is not None:
            notes.append(
                f"module {spec.module}: {path.name} declares no {name} (QoLA exports it where AITER has it): "
                f"not exported; a consumer that declares qola::<ns>::{name} gets a link error naming it"
            )
    return found


def resolve(spec: ApiSpec, meta_dir: Path, include_dirs: Sequence[str], notes: list[str] | None = None) -> Api:
    """Read ``spec.exports`` from the tree's ``api_header``: an error names the header and the function."""
    module = spec.module
    _check_names(spec)
    path = meta_dir / spec.api_header
    text = _read_api_header(spec, path)
    names = [*spec.exports, *_if_declared(spec, path, parse(text, spec.entry_macros), notes)]
    try:
        found = read_header(text, names, spec.entry_macros)
    except DeclError as exc:
        raise QolaError(
            f"module {module}: {path}: {exc}",
            hint="qola forwards the functions its registry lists for the module to the tree's "
            "declarations of them; a declaration it cannot read is not guessed",
        ) from None
    decls = tuple(d for name in names for d in found[name])
    for d in decls:
        if TORCH.search(" ".join([d.returns, *(p.type for p in d.params)])):
            raise QolaError(
                f"module {module}: {path}:{d.line}: {d.signature()} takes or returns PyTorch types: "
                "this tree's module is not torch-free",
                hint='build it with mode = "pybind", or from an AITER whose entry point takes '
                "aiter_tensor_t (a ctypes entry point)",
            )
    parsed = parse(text)
    provided = []
    reads = [str(path)]
    for p in spec.provides:
        got = _provide(module, p, parsed, include_dirs, path, reads)
        if isinstance(got, str):
            if notes is not None:
                notes.append(got)
        else:
            provided.append(got)
    return Api(
        header=spec.api_header,
        include=_spelling(path, include_dirs) if spec.api_header.endswith(HEADER_SUFFIXES) else "",
        public_header=spec.public_header,
        decls=decls,
        provided=tuple(provided),
        includes=tuple(spec.includes),
        reads=tuple(dict.fromkeys(reads)),
    )


def _check_names(spec: ApiSpec) -> None:
    for name in (*spec.exports, *spec.if_declared):
        if not _NAME.match(name):
            raise QolaError(f"registry: module {spec.module}: export {name!r} is not a C++ identifier")
    if not _FILE.match(spec.public_header):
        raise QolaError(
            f"registry: module {spec.module}: public_header {spec.public_header!r} is not a plain file name"
        )


def _read_api_header(spec: ApiSpec, path: Path) -> str:
    try:
        return inputs.read_checked(path, limit=inputs.MAX_SOURCE, what="API header").decode("utf-8", "replace")
    except OSError as exc:
        raise QolaError(
            f"module {spec.module}: cannot read {path}, the header that declares its C++ API "
            f"({', '.join(spec.exports)}): {exc.strerror or exc}",
            hint="this tree does not have the header qola's registry names for the module; "
            'build the module with mode = "pybind", or a tree that has it',
        ) from None


def _spelling(path: Path, include_dirs: Sequence[str]) -> str:
    """How a consumer includes ``path``: relative to the include dir of the module that holds it."""
    for d in include_dirs:
        try:
            rel = path.resolve().relative_to(Path(d).resolve())
        except (ValueError, OSError):
            continue
        return rel.as_posix()
    return path.name


def _provide(
    module: str, p: Provide, parsed: Header, include_dirs: Sequence[str], api_path: Path, reads: list[str]
) -> Decl | str:
    """The provided function, or the note saying why the tree does not have what it needs (``reads``
    gets the file it looked in)."""
    inc = next((i for i in parsed.includes if i.target == p.include), None)
    if inc is None:
        return f"module {module}: {api_path.name} does not include {p.include}: {p.name} not provided"
    where = next(
        (Path(d) / p.include for d in (str(api_path.parent), *include_dirs) if (Path(d) / p.include).is_file()), None
    )
    if where is None:
        return f"module {module}: {p.include} not found on the module's include path: {p.name} not provided"
    reads.append(str(where))
    if p.requires:
        struct, _, member = p.requires.rpartition("::")
        members = parse(
            inputs.read_checked(where, limit=inputs.MAX_SOURCE, what="header").decode("utf-8", "replace")
        ).members.get(struct, set())
        if member not in members:
            return f"module {module}: {where} declares no {p.requires} (this CK predates it): {p.name} not provided"
    try:
        (decl,) = read_header(f"{p.returns} {p.name}({p.params});", [p.name])[p.name]
    except (DeclError, ValueError) as exc:
        raise QolaError(f"registry: module {module}: provides {p.name}: {exc}") from None
    return Decl(name=p.name, scope=(), returns=decl.returns, params=decl.params, conditions=inc.conditions, body=p.body)


# -- rendering ----------------------------------------------------------------------------------


def _helper_ns(ns: str) -> str:
    return f"qola_api_{ns}"


def _alias(d: Decl, k: int, what: str) -> str:
    return f"{d.name}_{k}_{what}"


def _qual(d: Decl, ns: str, name: str) -> str:
    return "::" + "::".join((*d.scope, _helper_ns(ns), name))


def _open(d: Decl, ns: str) -> tuple[str, str]:
    """Open the helper namespace inside the declaration's own (an inline one reopened inline)."""
    names = [*d.scope, _helper_ns(ns)]
    inline = set(d.inline_ns)
    return " ".join(f"{'inline ' if n in inline else ''}namespace {n} {{" for n in names), "}" * len(names)


def _open_scope(d: Decl) -> tuple[str, str]:
    if not d.scope:
        return "", ""
    inline = set(d.inline_ns)
    begin = " ".join(f"{'inline ' if n in inline else ''}namespace {n} {{" for n in d.scope)
    return begin + " ", " " + "}" * len(d.scope)


def _guarded(conds: Sequence[str], text: str) -> str:
    if not conds:
        return text
    joined = " && ".join(f"({c})" if re.search(r"&&|\|\||\?", c) else c for c in conds)
    return f"#if {joined}\n{text}#endif\n"


def _numbered(decls: Sequence[Decl]) -> list[tuple[Decl, int]]:
    count: dict[str, int] = {}
    out = []
    for d in decls:
        out.append((d, count.get(d.name, 0)))
        count[d.name] = count.get(d.name, 0) + 1
    return out


_WORD = re.compile(r"\w+|\S")


def by_value(ptype: str) -> bool:
    """A parameter type that may be a class passed by value: no reference, pointer, array or function
    declarator outside template arguments, and not spelled with built-in type words alone. Whether
    it is a class is the compiler's call (``std::is_class``, in the generated header)."""
    depth, outer = 0, []
    for t in _WORD.findall(ptype):
        if t == "<":
            depth += 1
        elif t == ">":
            depth -= 1
        elif depth == 0:
            outer.append(t)
    if any(t in ("&", "*", "(", "[") for t in outer):
        return False
    return not all(t in TYPE_WORDS for t in outer)


def _exported(d: Decl, k: int, i: int) -> str:
    """The alias of parameter ``i`` as qola exports it: ``c<i>`` (a class by value becomes a const
    reference, as QoLA's hand-written entry points take it), else the tree's own ``p<i>``."""
    return _alias(d, k, f"c{i}" if by_value(d.params[i].type) else f"p{i}")


def _params_text(d: Decl, k: int, ns: str, *, names: str, defaults: bool, exported: bool = True) -> str:
    parts = []
    for i, p in enumerate(d.params):
        name = p.name if names == "tree" else f"a{i}"
        alias = _exported(d, k, i) if exported else _alias(d, k, f"p{i}")
        text = f"{_qual(d, ns, alias)} {name}".rstrip()
        if defaults and p.default is not None:
            default = p.default if literal_default(p.default) else f"{_qual(d, ns, _alias(d, k, f'd{i}'))}()"
            text += f" = {default}"
        parts.append(text)
    return "".join(f"\n    {t}," for t in parts)[:-1]


def _helpers(d: Decl, k: int, ns: str) -> str:
    """The aliases (and default-argument functions) of one declaration, in its own namespace."""
    begin, end = _open(d, ns)
    lines = [f"using {_alias(d, k, 'r')} = {d.returns};"]
    for i, p in enumerate(d.params):
        lines.append(f"using {_alias(d, k, f'p{i}')} = {p.type};")
        if by_value(p.type):
            t = _alias(d, k, f"p{i}")
            lines.append(
                f"using {_alias(d, k, f'c{i}')} = ::std::conditional<::std::is_class<{t}>::value, const {t}&, {t}>::type;"
            )
        if p.default is not None and not literal_default(p.default):
            lines.append(f"inline auto {_alias(d, k, f'd{i}')}() {{ return {p.default}; }}")
    return begin + "\n" + "".join(f"    {line}\n" for line in lines) + end + "\n"


def _prototype(d: Decl, k: int, ns: str, *, names: str, defaults: bool, exported: bool = True) -> str:
    """``qola::<ns>::f`` as exported (``exported``), else the tree's own ``f`` as the tree declares it."""
    params = _params_text(d, k, ns, names=names, defaults=defaults, exported=exported)
    return f"{_qual(d, ns, _alias(d, k, 'r'))} {d.name}({params})"


def guard_macro(ns: str, public_header: str) -> str:
    return "QOLA_" + re.sub(r"\W", "_", f"{ns}_{public_header}").upper()


def render_header(api: Api, ns: str, module: str, tree_header: str) -> str:
    """The public header: the tree's declarations re-declared in ``qola::<ns>::``."""
    guard = guard_macro(ns, api.public_header)
    out = [
        f"/* {api.public_header} - generated by qola, do not edit: the C++ API of {ns}_{module}.\n",
        f" * Read from the tree's {tree_header}; each function forwards to the tree's own.\n",
        " * A consumer compiles with the include dirs the tree header needs (docs/integration.md). */\n",
        f"#ifndef {guard}\n#define {guard}\n",
    ]
    if any(by_value(p.type) for d in api.decls for p in d.params):
        out.append("#include <type_traits>\n")
    out.append('#include "qola_common.h"\n')
    if not api.from_source:
        out.append(f'#include "{api.include}"\n')
    out += [f'#include "{i}"\n' for i in api.includes]
    for d, k in _numbered(api.decls):
        text = f"/* {d.signature()} */\n" + _helpers(d, k, ns)
        text += f"QOLA_NS_BEGIN\nQOLA_VISIBLE {_prototype(d, k, ns, names='tree', defaults=True)};\nQOLA_NS_END\n"
        out.append("\n" + _guarded(d.conditions, text))
    for d in api.provided:
        params = ", ".join(f"{p.type} {p.name}".rstrip() + (f" = {p.default}" if p.default else "") for p in d.params)
        text = f"QOLA_NS_BEGIN\nQOLA_VISIBLE {d.returns} {d.name}({params});\nQOLA_NS_END\n"
        out.append("\n" + _guarded(d.conditions, text))
    out.append(f"\n#endif /* {guard} */\n")
    return "".join(out)


def render_wrapper(api: Api, ns: str, module: str) -> str:
    """The wrapper source compiled into the library: each ``qola::<ns>::f`` calls the tree's ``f``."""
    out = [
        f"// generated by qola, do not edit: qola::{ns}:: entry points of {ns}_{module}, forwarding to\n",
        f"// the tree's declarations in {api.header}. Everything else in the library stays local.\n",
        f'#include "{api.public_header}"\n\nQOLA_DEFINE_VERSION()\n',
    ]
    for d, k in _numbered(api.decls):
        if api.from_source:  # no header of the tree declares it: the wrapper does
            begin, end = _open_scope(d)
            proto = _prototype(d, k, ns, names="own", defaults=False, exported=False)
            lang = 'extern "C" ' if d.linkage == "C" else ""
            out.append("\n" + _guarded(d.conditions, f"{begin}{lang}{proto};{end}\n"))
        args = ",".join(
            f"\n        a{i}" if "[" in p.type else f"\n        static_cast<{_qual(d, ns, _exported(d, k, i))}&&>(a{i})"
            for i, p in enumerate(d.params)
        )
        text = (
            f"QOLA_NS_BEGIN\n{_prototype(d, k, ns, names='own', defaults=False)}\n{{\n"
            f"    return {d.qualified}({args});\n}}\nQOLA_NS_END\n"
        )
        out.append("\n" + _guarded(d.conditions, text))
    for d in api.provided:
        params = ", ".join(f"{p.type} {p.name}".rstrip() for p in d.params)
        text = f"QOLA_NS_BEGIN\n{d.returns} {d.name}({params})\n{{\n    {d.body}\n}}\nQOLA_NS_END\n"
        out.append("\n" + _guarded(d.conditions, text))
    return "".join(out)


def wrapper_name(module: str) -> str:
    return f"qola_{module}_itfs.cu"
