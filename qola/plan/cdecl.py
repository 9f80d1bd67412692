"""Read the C++ function declarations a kernel tree's header makes, without a compiler.

A cpp_itfs module's API is what the tree being built declares (AITER's ``csrc/include/mha_fwd.h``
of that commit), not a copy qola keeps: :func:`read_header` finds the named functions' namespace,
return type, parameters (type, name, default argument), language linkage and the preprocessor
conditions they are declared under, and :class:`Decl` carries them as data (into the plan, then
into the generated wrapper and public header).

The reader is deliberately small: comments and line continuations are removed, directives are
tracked only for their conditions (``#if``/``#ifdef``/``#elif``/``#else``; an include guard and
``#if 0`` are recognised), and the code is tokenised and scanned at namespace scope. It knows
namespaces (nested, inline, ``a::b``), ``extern "C"`` (block and single), attributes
(``__attribute__((...))``, ``[[...]]``, ``alignas``, ``__declspec``), visibility or export macros
(an upper-case identifier that precedes the type: ``AITER_API float f(...)``), references,
pointers, cv-qualifiers, template arguments in types, function-pointer parameters, arrays, unnamed
parameters, default arguments and trailing return types. Classes, enums, typedefs, using,
templates and bodies are skipped. What it cannot represent (a function template, a variadic
function, a declaration it cannot split) is reported, never guessed: :class:`DeclError`.
``entry_macros`` add entry points a source defines with a macro (AITER's ctypes
``AITER_CTYPES_DEFINE_ENTRYPOINT_VOID(name, (params), (args))``).

Why not the compiler (``-E``) or libclang: the plan spawns no process and needs no toolchain; a
header must be readable without its full include path (CK, a torch-tainted source whose entry point
is torch-free); and the conditions must be kept, not resolved, because the public header is
compiled again by the consumer under its own defines (``#if ENABLE_CK``). Standard library only.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from qola.plan.ctext import (
    CV,
    ELABORATED,
    LITERAL_DEFAULT,
    MACRO_LIKE,
    SPECIFIERS,
    TYPE_WORDS,
    Include,
    attr_at,
    code_with_conditions,
    depth0,
    end_of_declaration,
    is_id,
    render,
    skip_attr,
    skip_group,
    split_top,
    strip_attributes,
    to_semicolon,
)

_Scopes = list[tuple[str, tuple[str, ...]]]  # the open scopes: (kind, names)


class DeclError(ValueError):
    """A declaration the reader cannot represent (the message names the function and the line)."""


@dataclass(frozen=True)
class Param:
    type: str  # the type as an abstract declarator: "const ck_tile::stream_config&", "void (*)(int)"
    name: str = ""  # as the tree names it ("" when unnamed)
    default: str | None = None  # the default argument's text


@dataclass(frozen=True)
class Decl:
    """One function declaration of the tree."""

    name: str
    scope: tuple[str, ...]  # enclosing namespaces, outermost first (("aiter",)); () = global
    returns: str
    params: tuple[Param, ...]
    conditions: tuple[str, ...] = ()  # preprocessor conditions it is declared under (all hold)
    linkage: str = "C++"  # "C" inside extern "C"
    line: int = 0
    body: str | None = None  # qola's own definition (a registry ``provides`` entry), else None
    inline_ns: tuple[str, ...] = ()  # which of ``scope`` are inline namespaces

    @property
    def qualified(self) -> str:
        return "::" + "::".join((*self.scope, self.name))

    def signature(self) -> str:
        params = ", ".join(_spelled(p) + (f" = {p.default}" if p.default else "") for p in self.params)
        return f"{self.returns} {'::'.join((*self.scope, self.name))}({params})"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Decl:
        fields = dict(data)
        fields["params"] = tuple(Param(**p) for p in data["params"])
        fields["scope"] = tuple(data["scope"])
        fields["conditions"] = tuple(data.get("conditions", ()))
        fields["inline_ns"] = tuple(data.get("inline_ns", ()))
        return cls(**fields)


def _spelled(p: Param) -> str:
    """A parameter as C++ spells it: the name inside a function pointer's declarator."""
    for hole in ("(*)", "(&)", "(&&)"):
        if p.name and hole in p.type:
            return p.type.replace(hole, f"{hole[:-1]}{p.name})", 1)
    return " ".join(x for x in (p.type, p.name) if x)


@dataclass
class Header:
    """What :func:`parse` found: every function declaration, the includes, struct members."""

    decls: list[Decl] = field(default_factory=list)
    includes: list[Include] = field(default_factory=list)
    members: dict[str, set[str]] = field(default_factory=dict)  # "ns::Struct" and "Struct" -> member names
    problems: dict[str, str] = field(default_factory=dict)  # function name -> why it was not read

    def named(self, name: str) -> list[Decl]:
        return [d for d in self.decls if d.name == name]


# -- declarations -------------------------------------------------------------------------------


def parse(text: str, entry_macros: Mapping[str, str] | None = None) -> Header:
    """Every namespace-scope function declaration (and definition) of a header's text.
    ``entry_macros``: {macro: return type} of macros that define a C entry point from
    ``MACRO(name, (params...), (args...)) {...}`` (AITER's ctypes entry points)."""
    macros = dict(entry_macros or {})
    header = Header()
    toks = code_with_conditions(text, header.includes)
    words = [t for t, _, _ in toks]
    scopes: list[tuple[str, tuple[str, ...]]] = []  # ("ns", names) | ("extern", ()) | ("other", ())
    i, n = 0, len(words)
    while i < n:
        t = words[i]
        if t == ";":
            i += 1
        elif t == "}":
            if scopes:
                scopes.pop()
            i += 1
        elif t == "namespace" or (t == "inline" and i + 1 < n and words[i + 1] == "namespace"):
            j = i + (2 if t == "inline" else 1)
            names: list[str] = []
            while j < n and words[j] != "{" and words[j] != ";" and words[j] != "=":
                if is_id(words[j]) and words[j] != "inline":
                    names.append(words[j])
                j = skip_attr(words, j) if attr_at(words, j) else j + 1
            if j < n and words[j] == "{":
                scopes.append(("inline" if t == "inline" else "ns", tuple(names)))
                i = j + 1
            else:
                i = to_semicolon(words, j)
        elif t == "extern" and i + 1 < n and words[i + 1].startswith('"'):
            if i + 2 < n and words[i + 2] == "{":
                scopes.append(("extern", ()))
                i += 3
            else:
                i = _declaration(words, toks, i + 2, scopes, header, linkage="C")
        elif t == "template":
            j = skip_group(words, i + 1) if i + 1 < n and words[i + 1] == "<" else i + 1
            end = end_of_declaration(words, j)
            for k in range(j, end):
                if words[k] == "(" and k > j and is_id(words[k - 1]):
                    header.problems.setdefault(words[k - 1], f"line {toks[i][1]}: a function template")
                    break
            i = end
        elif t in ("struct", "class", "union", "enum"):
            i = _record(words, i, scopes, header)
        elif t in ("typedef", "using", "static_assert", "asm", "__asm__"):
            i = end_of_declaration(words, i)
        elif t in macros and i + 1 < n and words[i + 1] == "(":
            i = _entry_macro(words, toks, i, macros[t], scopes, header)
        else:
            end = end_of_declaration(words, i)
            at = next((k for k in range(i + 1, end) if words[k] in macros and k + 1 < n and words[k + 1] == "("), None)
            if at is not None:  # an object-like macro before an entry-point macro (AITER_CTYPES_ERROR_DEF)
                i = at
                continue
            i = _declaration(
                words, toks, i, scopes, header, linkage="C" if any(k == "extern" for k, _ in scopes) else "C++"
            )
    return header


def _entry_macro(w: Sequence[str], toks: Sequence[Any], i: int, returns: str, scopes: _Scopes, header: Header) -> int:
    """``MACRO(name, (params), (args))`` and the body after it: a C entry point ``returns name(params)``."""
    end = skip_group(w, i + 1)
    args = split_top(list(w[i + 2 : end - 1]), ",")
    line, conds = toks[i][1], toks[i][2]
    if len(args) >= 2 and len(args[0]) == 1 and is_id(args[0][0]) and args[1][:1] == ["("] and args[1][-1:] == [")"]:
        name = args[0][0]
        try:
            params = _params(args[1][1:-1], name)
            header.decls.append(
                Decl(
                    name=name,
                    scope=_ns(scopes),
                    returns=returns,
                    params=params,
                    conditions=conds,
                    linkage="C",
                    line=line,
                    inline_ns=_inline(scopes),
                )
            )
        except DeclError as exc:
            header.problems.setdefault(name, f"line {line}: {exc}")
    if end < len(w) and w[end] == "{":
        end = skip_group(w, end)
    return end


def _ns(scopes: list[tuple[str, tuple[str, ...]]]) -> tuple[str, ...]:
    return tuple(n for kind, names in scopes if kind in ("ns", "inline") for n in names)


def _inline(scopes: list[tuple[str, tuple[str, ...]]]) -> tuple[str, ...]:
    return tuple(names[-1] for kind, names in scopes if kind == "inline" and names)


def _record(w: Sequence[str], i: int, scopes: _Scopes, header: Header) -> int:
    """A struct/class/union/enum: its data member names noted (for ``requires``), body skipped."""
    j = i + 1
    name = ""
    while j < len(w) and w[j] not in ("{", ";", ":"):
        if attr_at(w, j):
            j = skip_attr(w, j)
            continue
        if is_id(w[j]) and w[j] not in ("final", "class", "struct"):
            name = w[j]
        j += 1
    while j < len(w) and w[j] not in ("{", ";"):
        j += 1
    if j < len(w) and w[j] == "{":
        end = skip_group(w, j)
        if w[i] != "enum" and name:
            members = _members(w[j + 1 : end - 1])
            header.members.setdefault(name, set()).update(members)
            header.members.setdefault("::".join((*_ns(scopes), name)), set()).update(members)
        j = end
    return end_of_declaration(w, j) if j < len(w) and w[j] != ";" else j + 1


def _members(body: Sequence[str]) -> set[str]:
    """Names declared at the top level of a class body (data members and member functions)."""
    names: set[str] = set()
    i = 0
    while i < len(body):
        if i + 1 < len(body) and is_id(body[i]) and body[i + 1] == ":":  # public: / private:
            i += 2
            continue
        name = None
        while i < len(body) and body[i] not in (";", "{", "(", "=", "[", ":"):
            if body[i] == "<" and i > 0 and is_id(body[i - 1]):
                i = skip_group(body, i)
                continue
            if is_id(body[i]):
                name = body[i]
            i += 1
        if name:
            names.add(name)
        while i < len(body) and body[i] not in (";", "{"):
            i = skip_group(body, i) if body[i] in ("(", "[") else i + 1
        if i < len(body) and body[i] == "{":
            i = skip_group(body, i)
            if i < len(body) and body[i] == ";":
                i += 1
        else:
            i += 1
    return names


def _declaration(
    w: Sequence[str], toks: Sequence[Any], i: int, scopes: _Scopes, header: Header, *, linkage: str
) -> int:
    """One declaration at namespace scope starting at ``i``: a function's is recorded; returns the
    index after it."""
    end = end_of_declaration(w, i)
    body_at = next((k for k in range(i, end) if w[k] == "{" and depth0(w, i, k)), None)
    head = list(w[i : body_at if body_at is not None else end])
    if head and head[-1] == ";":
        head.pop()
    line, conds = (toks[i][1], toks[i][2]) if i < len(toks) else (0, ())
    try:
        decl = _function(head, _ns(scopes), linkage, line, conds)
    except DeclError as exc:
        name = _function_name(head)
        if name:
            header.problems.setdefault(name, f"line {line}: {exc}")
        return end
    if decl is not None:
        header.decls.append(replace(decl, inline_ns=_inline(scopes)))
    return end


def _name_paren(head: Sequence[str]) -> int | None:
    """Index of the ``(`` that opens the parameter list: the first top-level ``(`` after an
    identifier that is not ``decltype``/``operator``."""
    depth = 0
    for k, t in enumerate(head):
        if (
            t == "("
            and depth == 0
            and k > 0
            and is_id(head[k - 1])
            and head[k - 1] not in ("decltype", "sizeof", "noexcept", "alignof", "typeof", "__typeof__")
            and head[k - 1] not in TYPE_WORDS
        ):
            return k
        if t in ("(", "["):
            depth += 1
        elif t in (")", "]"):
            depth -= 1
        elif t == "<" and k > 0 and is_id(head[k - 1]):
            depth += 1
        elif t == ">" and depth > 0:
            depth -= 1
    return None


def _function_name(head: Sequence[str]) -> str | None:
    k = _name_paren(strip_attributes(list(head)))
    return strip_attributes(list(head))[k - 1] if k else None


def _function(head: list[str], scope: tuple[str, ...], linkage: str, line: int, conds: tuple[str, ...]) -> Decl | None:
    head = strip_attributes(head)
    k = _name_paren(head)
    if k is None or (k >= 2 and head[k - 2] in ("::", "~", "operator")):
        return None  # a variable, or an out-of-line definition of something declared elsewhere
    name = head[k - 1]
    close = skip_group(head, k)
    spec = head[: k - 1]
    if "__global__" in spec or "friend" in spec or "typedef" in spec:
        return None
    if "static" in spec:
        return None  # internal linkage: nothing to forward to from another translation unit
    rtype = [t for t in spec if t not in SPECIFIERS]
    while len(rtype) > 1 and MACRO_LIKE.match(rtype[0]) and (is_id(rtype[1]) or rtype[1] in TYPE_WORDS):
        rtype = rtype[1:]  # AITER_API float -> float: an export/visibility macro before the type
    tail = head[close:]
    if tail[:2] in (["=", "delete"],):
        return None
    if "->" in tail:
        arrow = tail.index("->")
        trailing = [t for t in tail[arrow + 1 :] if t not in ("override", "final")]
        if "=" in trailing:
            trailing = trailing[: trailing.index("=")]
        rtype = trailing
    if not rtype:
        raise DeclError(f"{name}: no return type")
    params = _params(list(head[k + 1 : close - 1]), name)
    return Decl(
        name=name, scope=scope, returns=render(rtype), params=params, conditions=conds, linkage=linkage, line=line
    )


def _params(inner: list[str], fname: str) -> tuple[Param, ...]:
    if not inner or inner == ["void"]:
        return ()
    out = []
    for raw in split_top(inner, ","):
        raw = strip_attributes(raw)
        if not raw:
            raise DeclError(f"{fname}: an empty parameter")
        if raw == ["..."] or raw[-1] == "...":
            raise DeclError(f"{fname}: a variadic parameter list")
        pieces = split_top(raw, "=")
        decl, default = (
            pieces[0],
            (
                render(functools.reduce(operator.iadd, ([*p, "="] for p in pieces[1:]), [])[:-1])
                if len(pieces) > 1
                else None
            ),
        )
        ptype, pname = _declarator(decl, fname)
        out.append(Param(ptype, pname, default))
    return tuple(out)


def _declarator(decl: list[str], fname: str) -> tuple[str, str]:
    """(the type as an abstract declarator, the parameter's name)."""
    # a function pointer or array reference: T (*name)(args), T (&name)[N]
    for k, t in enumerate(decl):
        if t == "(" and k > 0 and k + 1 < len(decl) and decl[k + 1] in ("*", "&", "&&"):
            close = skip_group(decl, k)
            group = decl[k + 1 : close - 1]
            if group and is_id(group[-1]) and group[-1] not in CV:
                return render(decl[: k + 1] + group[:-1] + decl[close - 1 :]), group[-1]
            return render(decl), ""
    arrays: list[str] = []
    body = list(decl)
    while body and body[-1] == "]":
        open_at = max(k for k, t in enumerate(body) if t == "[")
        arrays = body[open_at:] + arrays
        body = body[:open_at]
    if not body:
        raise DeclError(f"{fname}: a parameter without a type")
    last = body[-1]
    named = (
        is_id(last)
        and last not in TYPE_WORDS
        and len(body) > 1
        and body[-2] not in ELABORATED
        and any(t not in CV for t in body[:-1])
    )
    if named:
        return render(body[:-1] + arrays), last
    return render(body + arrays), ""


def read_header(
    text: str, names: Iterable[str], entry_macros: Mapping[str, str] | None = None
) -> dict[str, list[Decl]]:
    """The declarations of ``names`` in a header's text (each name: its overloads, deduplicated).
    A name that is not declared, or declared in a form the reader cannot represent, raises
    :class:`DeclError` naming it."""
    header = parse(text, entry_macros)
    out: dict[str, list[Decl]] = {}
    for name in names:
        found = _unique(header.named(name))
        if not found:
            why = header.problems.get(name)
            raise DeclError(f"{name}: {why}" if why else f"no declaration of a function {name!r}")
        out[name] = found
    return out


def _unique(decls: Iterable[Decl]) -> list[Decl]:
    seen: dict[tuple[Any, ...], Decl] = {}
    for d in decls:
        key = (d.scope, d.returns, tuple(p.type for p in d.params), d.conditions, d.linkage)
        seen.setdefault(key, d)
    return list(seen.values())


def literal_default(text: str) -> bool:
    """A default argument that means the same in any scope (a literal, nullptr, true, ``{}``)."""
    return bool(LITERAL_DEFAULT.match(text.strip()))
