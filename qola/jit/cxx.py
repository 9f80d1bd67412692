"""A small, fast reader for generated C++ instance files.

It finds the explicit specialisations of function templates that generators such
as CK's ``generate.py`` write (``template <> RET name<ARGS>(PARAMS) { ... }``) at
namespace scope, with their exact return type, template arguments and
parameters, and classifies the other top-level pieces (preprocessor lines,
``using`` aliases). It is a scanner, not a C++ parser: comments and literals are
masked first, then brackets are matched. Anything it cannot read with certainty
raises :class:`CxxError`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_IDENT = re.compile(r"[A-Za-z_]\w*")
_TOKEN = re.compile(r"[A-Za-z_]\w*|::|&&|\.\.\.|\S")
_CV = {"const", "volatile"}
_BUILTIN = {
    "void", "bool", "char", "short", "int", "long", "float", "double", "signed", "unsigned",
    "auto", "wchar_t", "char8_t", "char16_t", "char32_t", "struct", "class", "enum", "typename",
}  # fmt: skip
_SPECIFIERS = {"inline", "static", "constexpr", "extern", "virtual", "explicit", "__host__", "__inline__"}
_OPEN = {"(": ")", "[": "]", "{": "}", "<": ">"}


class CxxError(ValueError):
    """The file does not have the shape the stubbers can rewrite."""


@dataclass(frozen=True)
class Param:
    type: str  # as written, whitespace-normalised: "const ck_tile::stream_config&"
    name: str | None  # None if unnamed


@dataclass(frozen=True)
class Specialization:
    """``template <> RET NAME<TARGS>(PARAMS) TRAILER { body }`` at namespace scope."""

    start: int  # offset of "template"
    body_start: int  # offset of "{"
    end: int  # offset just after the closing "}"
    namespace: tuple[str, ...]  # enclosing named namespaces, outermost first
    prefix: str  # specifiers + return type, as written
    ret: str  # return type only
    name: str  # the template's name (possibly qualified)
    targs: str  # the template arguments, without the outer <>
    params: tuple[Param, ...]
    trailer: str  # between ")" and "{": noexcept, attributes

    @property
    def param_types(self) -> tuple[str, ...]:
        return tuple(p.type for p in self.params)

    def fn_pointer_type(self) -> str:
        return f"{self.ret} (*)({', '.join(self.param_types)})"

    def specialised_name(self) -> str:
        return f"{self.name}<{self.targs}>"


def normalize(text: str) -> str:
    """Whitespace-normalise a type or expression (for comparisons)."""
    text = " ".join(text.split())
    text = re.sub(r"\s*(::|<|>|,|\(|\)|&&|&|\*|\[|\])\s*", r"\1", text)
    return text.replace(",", ", ")


_MASKED = re.compile(
    r"//[^\n]*"  # line comment
    r"|/\*.*?\*/"  # block comment
    r'|"(?:\\.|[^"\\\n])*"'  # string literal
    r"|'(?:\\.|[^'\\\n])*'"  # char literal
    r"|^[ \t]*\#(?:[^\n]*\\\n)*[^\n]*",  # preprocessor line, with continuations
    re.S | re.M,
)
_BRACKETS = re.compile(r"[()\[\]{}]")


def _blank(s: str) -> str:
    return re.sub(r"[^\n]", " ", s)


def mask(text: str) -> tuple[str, str]:
    """Return (no_comments, structural): comments blanked in both; string/char literal
    contents and preprocessor lines also blanked in ``structural``. Lengths are kept.
    (Raw string literals and digit separators are not understood.)"""
    nc, st = [], []
    pos = 0
    for m in _MASKED.finditer(text):
        a, b, tok = m.start(), m.end(), m.group(0)
        nc.append(text[pos:a])
        st.append(text[pos:a])
        if tok.startswith(("//", "/*")):
            nc.append(_blank(tok))
            st.append(_blank(tok))
        elif tok[0] in "\"'":
            nc.append(tok)
            st.append(tok[0] + _blank(tok[1:-1]) + tok[-1])
        else:
            nc.append(tok)
            st.append(_blank(tok))
        pos = b
    nc.append(text[pos:])
    st.append(text[pos:])
    return "".join(nc), "".join(st)


def _match(st: str, i: int) -> int:
    """Offset just after the bracket that closes the one at ``st[i]`` ((), [], {})."""
    depth = 0
    for m in _BRACKETS.finditer(st, i):
        if m.group(0) in "([{":
            depth += 1
        else:
            depth -= 1
            if depth == 0:
                return m.end()
    raise CxxError(f"unbalanced bracket at offset {i}")


_NS = re.compile(r"namespace\s*([A-Za-z_][\w:]*)?\s*\{")
_EXTERN = re.compile(r'\bextern\s*"C(?:\+\+)?"\s*\{')
_TEMPLATE0 = re.compile(r"\btemplate\s*<\s*>")
_CLASS = re.compile(r"\s*(?:struct|class|union)\b")


def find_specializations(text: str) -> list[Specialization]:
    """All function-template explicit specialisations with a body, at namespace scope."""
    nc, st = mask(text)
    out: list[Specialization] = []
    _scan(nc, st, 0, len(st), (), out)
    return out


_NEXT = re.compile(r"\{|namespace|extern|template")  # literal alternatives: fast to search
_END_DECL = re.compile(r"[{;(\[]")


def _scan(nc: str, st: str, lo: int, hi: int, ns: tuple[str, ...], out: list[Specialization]) -> None:
    i = lo
    while (m := _NEXT.search(st, i, hi)) is not None:
        i, tok = m.start(), m.group(0)
        if tok == "{":
            i = _match(st, i)
            continue
        if i > 0 and (st[i - 1].isalnum() or st[i - 1] == "_"):
            i = m.end()
            continue
        if tok == "namespace":
            nsm = _NS.match(st, i)
            if not nsm:  # namespace alias or using-directive
                i = m.end()
                continue
            close = _match(st, nsm.end() - 1)
            inner = ns + (tuple(nsm.group(1).split("::")) if nsm.group(1) else ("",))
            _scan(nc, st, nsm.end(), close - 1, inner, out)
            i = close
        elif tok == "extern":
            em = _EXTERN.match(st, i)
            if not em:
                i = m.end()
                continue
            close = _match(st, em.end() - 1)
            _scan(nc, st, em.end(), close - 1, ns, out)
            i = close
        else:
            tm = _TEMPLATE0.match(st, i)
            if not tm:
                i = m.end()
                continue
            j = tm.end()
            while (d := _END_DECL.search(st, j, hi)) is not None and d.group(0) in "([":
                j = _match(st, d.start())
            if d is None:
                return
            j = d.start()
            if st[j] == "{":
                end = _match(st, j)
                if not _CLASS.match(nc, tm.end()):  # class specialisations are not stubbed
                    out.append(_parse_header(nc[tm.end() : j], i, j, end, ns))
                i = end
            else:
                i = j + 1


def _split_top(text: str, sep: str = ",") -> list[str]:
    """Split at ``sep`` outside brackets; angle brackets count only outside parentheses."""
    parts: list[str] = []
    stack: list[str] = []
    cur: list[str] = []
    for ch in text:
        if ch in "([{" or (ch == "<" and (not stack or stack[-1] == "<")):
            stack.append(ch)
        elif ch in ")]}":
            while stack and stack.pop() == "<":
                pass
        elif ch == ">" and stack and stack[-1] == "<":
            stack.pop()
        if ch == sep and not stack:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return parts


def _outside_angles(text: str) -> str:
    """The characters of ``text`` that are not inside template argument lists."""
    out: list[str] = []
    stack: list[str] = []
    for ch in text:
        if (ch == "<" and (not stack or stack[-1] == "<")) or (ch == "(" and stack):
            stack.append(ch)
        elif (ch == ")" and stack and stack[-1] == "(") or (ch == ">" and stack and stack[-1] == "<"):
            stack.pop()
        elif not stack:
            out.append(ch)
    return "".join(out)


def _template_open(head: str) -> int:
    """Offset of the "<" matching the ">" that ends ``head`` (parentheses hide angles)."""
    stack: list[str] = []
    for k in range(len(head) - 1, -1, -1):
        c = head[k]
        if c in ")]":
            stack.append(c)
        elif c in "([":
            if stack:
                stack.pop()
        elif c == ">" and (not stack or stack[-1] == ">"):
            stack.append(c)
        elif c == "<" and stack and stack[-1] == ">":
            stack.pop()
            if not stack:
                return k
    return -1


def _parse_header(header: str, start: int, body: int, end: int, ns: tuple[str, ...]) -> Specialization:
    h = header.strip()
    # the parameter list: the last top-level (...) group
    depth, close = 0, -1
    for k in range(len(h) - 1, -1, -1):
        if h[k] == ")":
            if depth == 0 and close < 0:
                close = k
            depth += 1
        elif h[k] == "(":
            depth -= 1
            if depth == 0 and close >= 0:
                open_ = k
                break
    else:
        raise CxxError(f"no parameter list in specialisation: {normalize(h)!r}")
    trailer, params_text, head = h[close + 1 :].strip(), h[open_ + 1 : close], h[:open_].rstrip()
    if trailer.startswith("->"):
        raise CxxError(f"trailing return types are not supported: {normalize(h)!r}")
    if not head.endswith(">"):
        raise CxxError(f"not a template specialisation with explicit arguments: {normalize(h)!r}")
    lt = _template_open(head)
    if lt < 0:
        raise CxxError(f"unbalanced template arguments: {normalize(h)!r}")
    m = re.search(r"((?:::)?[A-Za-z_]\w*(?:\s*::\s*[A-Za-z_]\w*)*)\s*$", head[:lt])
    if not m:
        raise CxxError(f"no function name before the template arguments: {normalize(h)!r}")
    prefix = head[: m.start()].strip()
    ret_tokens = [t for t in _strip_attrs(prefix).split() if t not in _SPECIFIERS]
    ret = normalize(" ".join(ret_tokens))
    if not ret or "(" in ret:
        raise CxxError(f"cannot read the return type of: {normalize(h)!r}")
    params = _parse_params(params_text, h)
    return Specialization(
        start=start, body_start=body, end=end, namespace=ns, prefix=normalize(prefix), ret=ret,
        name=normalize(m.group(1)), targs=normalize(head[lt + 1 : -1]), params=params, trailer=normalize(trailer),
    )  # fmt: skip


def _strip_attrs(text: str) -> str:
    text = re.sub(r"\[\[.*?\]\]", " ", text)
    while (k := text.find("__attribute__")) >= 0:
        p = text.find("(", k)
        text = text[:k] + " " + text[_match(text, p) :]
    return text


def _parse_params(text: str, where: str) -> tuple[Param, ...]:
    if not text.strip() or normalize(text) == "void":
        return ()
    params = []
    for raw in _split_top(text):
        decl = _split_top(raw, "=")[0].strip()  # drop a default argument
        if "(" in _outside_angles(decl) or "[" in decl or "..." in decl:
            raise CxxError(f"unsupported parameter {decl!r} in: {normalize(where)!r}")
        tokens = _TOKEN.findall(decl)
        name = None
        last = tokens[-1] if tokens else ""
        before = tokens[:-1]
        if (
            _IDENT.fullmatch(last)
            and last not in _BUILTIN | _CV
            and before
            and before[-1] != "::"
            and not all(t in _CV for t in before)
            and before[-1] not in {"struct", "class", "enum", "typename"}
        ):
            name = last
            decl = decl[: decl.rfind(last)]
        params.append(Param(type=normalize(decl), name=name))
    return tuple(params)


_ALIAS = re.compile(r"\s*using\s+([A-Za-z_]\w*)\s*=")


def top_level_items(text: str) -> list[tuple[str, int, int]]:
    """Split a file into ("pp" | "alias" | "spec" | "other", start, end) pieces, in order,
    if all its code is at global scope; raises CxxError for nested namespaces."""
    nc, st = mask(text)
    specs = {s.start: s for s in find_specializations(text)}
    if any(s.namespace for s in specs.values()):
        raise CxxError("specialisations inside namespaces")
    items: list[tuple[str, int, int]] = []
    i, n = 0, len(text)
    while i < n:
        if st[i].isspace():
            if nc[i] == "#" and not nc[nc.rfind("\n", 0, i) + 1 : i].strip():
                j = i
                while j < n and not (text[j] == "\n" and text[j - 1] != "\\"):
                    j += 1
                items.append(("pp", i, j))
                i = j
            else:
                i += 1
            continue
        if i in specs:
            items.append(("spec", i, specs[i].end))
            i = specs[i].end
            continue
        j = i
        while j < n and st[j] != ";":
            if st[j] == "{":
                j = _match(st, j)
                break
            j = _match(st, j) if st[j] in "([" else j + 1
        else:
            j += 1
        if j <= n and j > 0 and st[j - 1] == ";" and _ALIAS.match(st, i):
            items.append(("alias", i, j))
        else:
            items.append(("other", i, j))
        i = j
    return items


def alias_names(text: str, items: list[tuple[str, int, int]]) -> list[str]:
    """The names of the ``alias`` items of :func:`top_level_items`, read where it found them: in
    the structural text (a comment inside ``using … =`` is blanked there, not in ``text``)."""
    _, st = mask(text)
    names = []
    for kind, a, _ in items:
        if kind == "alias":
            m = _ALIAS.match(st, a)
            assert m is not None  # top_level_items matched _ALIAS at ``a`` in this same text
            names.append(m.group(1))
    return names


def qualify(text: str, names: set[str], prefix: str) -> str:
    """Prefix unqualified uses of ``names`` in ``text`` with ``prefix`` (e.g. ``ns::``)."""

    def sub(m: re.Match[str]) -> str:
        before = text[: m.start()].rstrip()
        if m.group(0) in names and not before.endswith(("::", ".", "->")):
            return prefix + m.group(0)
        return m.group(0)

    return _IDENT.sub(sub, text)
