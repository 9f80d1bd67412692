"""C/C++ source text for :mod:`qola.plan.cdecl`: comments and continuations removed, tokens, the
preprocessor conditions each token is under, ``#include`` directives, and tokens back to text.

Directives are tracked only for their conditions (``#if``/``#ifdef``/``#ifndef``/``#elif``/
``#else``): an include guard is recognised and dropped, ``#if 0`` blocks are skipped; nothing is
expanded or evaluated. Standard library only.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Include:
    target: str  # as written between the quotes or brackets
    conditions: tuple[str, ...]
    line: int


# -- text ---------------------------------------------------------------------------------------

_TOKEN = re.compile(
    r"""
    (?P<str>(?:u8|u|U|L)?R"(?P<delim>[^(\s]*)\(.*?\)(?P=delim)"|(?:u8|u|U|L)?"(?:\\.|[^"\\\n])*")
  | (?P<chr>(?:u8|u|U|L)?'(?:\\.|[^'\\\n])*')
  | (?P<num>\.?\d(?:[\w.']|[eEpP][+-])*)
  | (?P<id>[A-Za-z_]\w*)
  | (?P<punct>::|\.\.\.|->|&&|\|\||==|!=|<=|>=|\[\[|\]\]|[^\s\w])
""",
    re.S | re.X,
)

TYPE_WORDS = frozenset(
    [
        "void",
        "bool",
        "char",
        "wchar_t",
        "char8_t",
        "char16_t",
        "char32_t",
        "short",
        "int",
        "long",
        "signed",
        "unsigned",
        "float",
        "double",
        "auto",
        "const",
        "volatile",
        "__int128",
        "__fp16",
        "_Float16",
        "__bf16",
        "decltype",
    ]
)
CV = frozenset({"const", "volatile"})
ELABORATED = frozenset({"struct", "class", "union", "enum", "typename", "::"})
SPECIFIERS = frozenset(
    {
        "static",
        "inline",
        "extern",
        "constexpr",
        "consteval",
        "virtual",
        "friend",
        "explicit",
        "__inline__",
        "__forceinline__",
        "__host__",
        "__device__",
        "__noinline__",
        "thread_local",
        "register",
        "mutable",
        "CK_TILE_HOST",
    }
)
MACRO_LIKE = re.compile(r"[A-Z][A-Z0-9_]*\Z")
LITERAL_DEFAULT = re.compile(
    r"""(?:nullptr|NULL|true|false|[-+]?[\d.][\w.']*|(?:u8|u|U|L)?"(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*'|\{\s*\})\Z"""
)


def strip_comments(text: str) -> str:
    """``text`` without comments (newlines kept, so line numbers hold) and with line continuations
    joined (their newlines moved after the joined line)."""
    out: list[str] = []
    i, n = 0, len(text)
    pending = 0  # newlines of continuations, emitted at the end of the logical line
    while i < n:
        c = text[i]
        if c == "\\" and text.startswith("\n", i + 1):
            pending += 1
            i += 2
        elif c == "\n":
            out.append("\n" * (pending + 1))
            pending = 0
            i += 1
        elif text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            pending += text.count("\n", i, j)
            out.append(" ")
            i = j
        elif c in "\"'":
            m = re.compile(r"%s(?:\\.|[^%s\\\n])*%s" % (c, c, c)).match(text, i)
            j = m.end() if m else i + 1
            out.append(text[i:j])
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out) + "\n" * pending


def tokens(text: str) -> list[str]:
    return [m.group(0) for m in _TOKEN.finditer(text)]


def render(toks: Sequence[str]) -> str:
    """Tokens as C++ text: a space only between two words and after a comma."""
    out = ""
    prev = ""
    for t in toks:
        if out and (
            (_wordy(prev) and _wordy(t))
            or prev == ","
            or (prev in ("*", "&", "&&") and is_id(t))
            or (t == "::" and prev in TYPE_WORDS | ELABORATED)
        ):
            out += " "
        out += t
        prev = t
    return out


def _wordy(tok: str) -> bool:
    return bool(tok) and (tok[0].isalnum() or tok[0] in "_\"'" or tok[-1] in "\"'")


def is_id(tok: str) -> bool:
    return bool(re.fullmatch(r"[A-Za-z_]\w*", tok))


# -- directives ---------------------------------------------------------------------------------


def _directive_lines(text: str) -> Iterator[tuple[int, str, str, str]]:
    """(line number, kind, argument, the line's code) for each line; kind "" for code lines."""
    for no, line in enumerate(text.split("\n"), 1):
        m = re.match(r"\s*#\s*(\w*)\s*(.*)", line)
        if m:
            yield no, m.group(1), m.group(2).strip(), ""
        else:
            yield no, "", "", line


def _guard(lines: list[tuple[int, str, str, str]]) -> str | None:
    """The include guard macro: the first directive is ``#ifndef X``, the next ``#define X``, and
    the ``#endif`` closing the first is the last directive."""
    directives = [(k, a) for _, k, a, _ in lines if k]
    if (
        len(directives) < 3
        or directives[0][0] != "ifndef"
        or directives[1][0] != "define"
        or directives[1][1].split()[:1] != [directives[0][1]]
    ):
        return None
    depth = 0
    for at, (k, _) in enumerate(directives):
        depth += k in ("if", "ifdef", "ifndef")
        depth -= k == "endif"
        if depth == 0:
            return directives[0][1] if at == len(directives) - 1 else None
    return None


def code_with_conditions(text: str, includes: list[Include]) -> list[tuple[str, int, tuple[str, ...]]]:
    """Each token of the code with its line and the conditions it is under; ``includes`` gets the
    ``#include`` directives with theirs."""
    lines = list(_directive_lines(strip_comments(text)))
    guard = _guard(lines)
    frames: list[list[str | None]] = []  # per #if: the earlier branches' conditions, then the current
    skip_guard = guard is not None
    out: list[tuple[str, int, tuple[str, ...]]] = []

    def active() -> tuple[str, ...]:
        conds = []
        for fr in frames:
            if fr[0] == "<guard>":
                continue
            *prev, cur = fr
            if not prev:
                conds.append(cur if cur is not None else "1")
                continue
            parts = [f"!({p})" for p in prev if p is not None] + ([f"({cur})"] if cur is not None else [])
            conds.append(" && ".join(parts))
        return tuple(conds)

    for no, kind, arg, code in lines:
        if kind in ("if", "ifdef", "ifndef"):
            cond = arg if kind == "if" else (f"defined({arg})" if kind == "ifdef" else f"!defined({arg})")
            if skip_guard and kind == "ifndef" and arg == guard:
                frames.append(["<guard>"])
                skip_guard = False
            else:
                frames.append([cond])
        elif kind == "elif" and frames:
            frames[-1].append(arg)
        elif kind == "else" and frames:
            frames[-1].append(None)
        elif kind == "endif" and frames:
            frames.pop()
        elif kind == "include":
            m = re.match(r'["<]([^">]+)[">]', arg)
            if m:
                includes.append(Include(m.group(1), active(), no))
        elif not kind and code.strip():
            conds = active()
            if any(c.strip() in ("0", "false") for c in conds):
                continue
            out += [(t, no, conds) for t in tokens(code)]
    return out


# ---- walking a token list (qola.plan.cdecl reads declarations with these) ----


def attr_at(w: Sequence[str], i: int) -> bool:
    return w[i] in ("__attribute__", "__declspec", "alignas", "[[")


def skip_attr(w: Sequence[str], i: int) -> int:
    if w[i] == "[[":
        while i < len(w) and w[i] != "]]":
            i += 1
        return i + 1
    return skip_group(w, i + 1) if i + 1 < len(w) and w[i + 1] == "(" else i + 1


def skip_group(w: Sequence[str], i: int) -> int:
    """Index after the bracket group opening at ``w[i]`` (``(``, ``[``, ``{`` or ``<``)."""
    pairs = {"(": ")", "[": "]", "{": "}", "<": ">"}
    stack = [pairs[w[i]]]
    i += 1
    while i < len(w) and stack:
        t = w[i]
        if t in ("(", "[", "{"):
            stack.append(pairs[t])
        elif stack[-1] == ">" and t == "<":
            stack.append(">")
        elif t == stack[-1]:
            stack.pop()
        elif t in (")", "]", "}") and ">" in stack:  # a '>' that never closed: a comparison
            while stack and stack[-1] == ">":
                stack.pop()
            if stack and t == stack[-1]:
                stack.pop()
        i += 1
    return i


def to_semicolon(w: Sequence[str], i: int) -> int:
    while i < len(w) and w[i] != ";":
        i = skip_group(w, i) if w[i] in ("(", "[", "{") else i + 1
    return i + 1


def end_of_declaration(w: Sequence[str], i: int) -> int:
    """After a declaration starting at ``i``: its ``;``, or its body's ``}`` (and a ``;``)."""
    while i < len(w):
        if w[i] == ";":
            return i + 1
        if w[i] == "{":
            j = skip_group(w, i)
            return j + 1 if j < len(w) and w[j] == ";" else j
        i = skip_group(w, i) if w[i] in ("(", "[") else i + 1
    return i


def depth0(w: Sequence[str], start: int, k: int) -> bool:
    depth = 0
    for t in w[start:k]:
        depth += t in ("(", "[")
        depth -= t in (")", "]")
    return depth == 0


def strip_attributes(head: list[str]) -> list[str]:
    out: list[str] = []
    i = 0
    while i < len(head):
        if attr_at(head, i):
            i = skip_attr(head, i)
        else:
            out.append(head[i])
            i += 1
    return out


def split_top(toks: Sequence[str], sep: str) -> list[list[str]]:
    parts: list[list[str]] = [[]]
    i = 0
    while i < len(toks):
        t = toks[i]
        if t in ("(", "[", "{") or (t == "<" and i > 0 and (is_id(toks[i - 1]) or toks[i - 1] == "template")):
            j = skip_group(toks, i)
            parts[-1] += toks[i:j]
            i = j
            continue
        if t == sep:
            parts.append([])
        else:
            parts[-1].append(t)
        i += 1
    return parts
