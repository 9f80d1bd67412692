"""Module overrides (a manifest's ``[[modules]]`` values): plain values or expression strings, and
what each one means.

QoLA and Transformer Engine write overrides as AITER writes its module table: Python expression
strings (``"f'{AITER_CSRC_DIR}/cpp_itfs/mha_fwd.cu'"``, ``"'-DFAV3_ON=1'"``); qola's manifests
also take plain values (``"csrc/kernels/x.cu"``, ``"-DFAV3_ON=1"``). One rule tells them apart:

* an **expression** starts with a string literal (a quote, or a prefix such as ``f`` then a
  quote) or with a name the module table's expressions see (``AITER_CSRC_DIR``, ``os``,
  ``get_gfx`` …). It is evaluated by :func:`qola.plan.tree.safe_eval.evaluate` with the module table's
  namespace: the same names, the same refusals. Its value must be a string (``None`` too for
  ``hip_clang_path``);
* anything else is a **plain value** of its key, and must look like one: a path (no quotes,
  braces or parentheses), a flag (starts with ``-``, no quotes or braces; ``extra_ldflags`` also
  takes an absolute path), a generator command (a script path, then arguments whose quotes
  balance; ``{}`` is the only brace).

A value that is neither is an error naming the key (``modules[0].srcs[1]``), the value and what it
would need to be: nothing is taken literally by accident (an unbalanced ``f'…``, a quoted flag
written without being an expression, ``{AITER_CSRC_DIR}`` outside an f-string, a name the
evaluator does not know).

Either way the value is then used as the key's plain value: a relative path (and a generator's
relative script) resolves against the tree's meta dir; a path that lies under the tree (or under
CK's dir) must stay under it after ``..`` is resolved.
"""

from __future__ import annotations

import ast
import difflib
import os
import re
import shlex
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qola.core.errors import QolaError
from qola.plan.tree.safe_eval import SafeFunction, SafeObject, evaluate

PLAIN, EXPRESSION = "plain", "expression"
PATH, FLAG, LDFLAG, COMMAND = "path", "flag", "ldflag", "command"
# the override keys whose strings follow this rule, and the kind of plain value each takes
KINDS: dict[str, str] = {
    "srcs": PATH,
    "add_srcs": PATH,
    "extra_include": PATH,
    "hip_clang_path": PATH,
    "flags_extra_cc": FLAG,
    "flags_extra_hip": FLAG,
    "extra_ldflags": LDFLAG,
    "blob_gen_cmd": COMMAND,
}
LIST_KEYS = ("srcs", "add_srcs", "extra_include", "flags_extra_cc", "flags_extra_hip", "extra_ldflags", "blob_gen_cmd")
_LITERAL_RE = re.compile(r"[rRuUfFbB]{0,2}['\"]")
_IDENT_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_PLAIN_WHAT = {
    PATH: "a plain path",
    FLAG: "a plain flag",
    LDFLAG: "a plain linker flag",
    COMMAND: "a plain generator command",
}
_PLAIN_LOOKS = {
    PATH: "a path relative to the tree's meta dir (csrc/…) or an absolute path, without quotes, braces or parentheses",
    FLAG: "a flag starting with '-', without quotes or braces",
    LDFLAG: "a flag starting with '-' or an absolute path, without quotes or braces",
    COMMAND: 'a script path then its arguments, e.g. "csrc/gen.py -d fwd --output_dir {}" ({} is the output dir)',
}
_EXAMPLE = {
    PATH: "\"f'{AITER_CSRC_DIR}/cpp_itfs/mha_fwd.cu'\"",
    FLAG: "\"'-DFAV3_ON=1'\"",
    LDFLAG: "\"'-lfoo'\"",
    COMMAND: "\"f'{AITER_META_DIR}/hsa/codegen.py -m fmha_fwd_bf16 --output_dir {{}}'\"",
}


@dataclass(frozen=True)
class Scope:
    """What a value is resolved with: the module table's names, the meta dir relative paths resolve
    against, and the roots a path under which must stay under (the tree, CK's dir)."""

    names: Mapping[str, Any]
    meta: Path
    roots: tuple[str, ...]


def classify(value: str, names: Mapping[str, Any]) -> str:
    """``"expression"`` when ``value`` starts with a string literal or a name in ``names``, else ``"plain"``."""
    text = value.strip()
    if _LITERAL_RE.match(text):
        return EXPRESSION
    ident = _IDENT_RE.match(text)
    return EXPRESSION if ident is not None and ident.group(0) in names else PLAIN


def plain_problem(value: str, kind: str) -> str | None:
    """What keeps ``value`` from being a plain value of ``kind`` (a phrase), or None."""
    if not value.strip():
        return "it is empty"
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        return "it holds a NUL, line break or other control character"
    if kind == COMMAND:
        return _command_problem(value)
    if "{" in value or "}" in value:
        return "it holds braces ({NAME} is replaced only inside an f-string)"
    if "'" in value or '"' in value:
        return "it holds quotes" + (
            ", which the build's shell-style split of flags (AITER's) would remove" if kind in (FLAG, LDFLAG) else ""
        )
    text = value.strip()
    if kind == PATH and ("(" in text or ")" in text):
        return "it holds parentheses"
    if kind == FLAG and not text.startswith("-"):
        return "it does not start with '-'"
    if kind == LDFLAG and not text.startswith(("-", "/")):
        return "it starts with neither '-' nor '/'"
    return None


def _command_problem(value: str) -> str | None:
    if re.search(r"\{(?!\})|(?<!\{)\}", value):
        return "it holds braces other than {} ({NAME} is replaced only inside an f-string)"
    try:
        argv = shlex.split(value)
    except ValueError:
        return "its quotes do not balance"
    head = value.strip().split(None, 1)[0]
    if not argv or any(c in head for c in "'\"()"):
        return "it does not start with a script path"
    return None


def _why_not_expression(value: str, names: Mapping[str, Any]) -> str:
    """Why ``value`` (classified plain) is not an expression qola evaluates either."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tree = ast.parse(value.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return "nor an expression: it starts with neither a quote nor a name qola evaluates"
    unknown = sorted({n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id not in names})
    if unknown:
        close = difflib.get_close_matches(unknown[0], [str(k) for k in names], n=1)
        tip = f" (did you mean {close[0]}?)" if close else ""
        return f"nor an expression qola evaluates: {', '.join(unknown)} is not a name in scope{tip}"
    return "nor an expression: it starts with neither a quote nor a name qola evaluates"


def _names_hint(names: Mapping[str, Any]) -> str:
    shown = sorted(
        k for k, v in names.items() if isinstance(v, (str, SafeObject, SafeFunction)) and not k.startswith("_")
    )
    return ", ".join(shown[:16]) + (" …" if len(shown) > 16 else "")


def _shown(value: str) -> str:
    return repr(value if len(value) <= 160 else value[:140] + "…")


def evaluate_value(
    value: str, kind: str, names: Mapping[str, Any], key: str, where: str | None, allow_none: bool = False
) -> str | None:
    """The value ``value`` stands for: itself when plain, else the expression's result (a string;
    ``None`` for ``hip_clang_path``). Raises :class:`QolaError` naming ``key`` when it is neither."""
    if classify(value, names) == PLAIN:
        problem = plain_problem(value, kind)
        if problem is None:
            return value
        raise QolaError(
            f"{key}: {_shown(value)} is neither {_PLAIN_WHAT[kind]} ({problem}) {_why_not_expression(value, names)}",
            hint=f"{_PLAIN_WHAT[kind]} is {_PLAIN_LOOKS[kind]}; an expression is a Python string literal or "
            f"f-string as in AITER's module table, e.g. {_EXAMPLE[kind]}, over the names "
            f"{_names_hint(names)}",
            where=where,
        )
    try:
        result = evaluate(value, names, where=key)
    except QolaError as exc:
        text = value.strip()
        ident = _IDENT_RE.match(text)
        fstring = (
            f"; to put {ident.group(0)} into a string write an f-string: "
            f"\"f'{{{ident.group(0)}}}{text[ident.end() :]}'\""
            if ident and not _LITERAL_RE.match(text) and re.match(r"[/\w.-]", text[ident.end() : ident.end() + 1])
            else ""
        )
        unknown = re.search(r"unknown name '([^']+)'", exc.message)
        close = difflib.get_close_matches(unknown.group(1), [str(k) for k in names], n=1) if unknown else []
        raise QolaError(
            f"{key}: {exc.message}" + (f" (did you mean {close[0]}?)" if close else ""),
            where=where,
            hint=(
                f"{exc.hint + '; ' if exc.hint else ''}names in scope: {_names_hint(names)}. "
                f"A value starting with a quote or one of those names is an expression{fstring}; "
                f"{_PLAIN_WHAT[kind]} is {_PLAIN_LOOKS[kind]}"
            ),
        ) from None
    if result is None and allow_none:
        return None
    if not isinstance(result, str):
        raise QolaError(
            f"{key}: expression {_shown(value)} evaluates to {result!r}, not a string",
            where=where,
            hint="each value of this key is one string (one path, flag or command)",
        )
    if any(c in result for c in "\x00\n\r"):
        raise QolaError(
            f"{key}: expression {_shown(value)} evaluates to a string with a NUL or line break", where=where
        )
    return result


def contained(path: str, roots: Iterable[str]) -> str | None:
    """The root ``path`` lies under (as written) but climbs out of once ``..`` is resolved, or None."""
    for root in roots:
        base = os.path.normpath(root)
        if path.startswith(base + os.sep):
            norm = os.path.normpath(path)
            if norm != base and not norm.startswith(base + os.sep):
                return base
    return None


def _path(value: str, scope: Scope, key: str, shown: str, where: str | None) -> str:
    full = value if os.path.isabs(value) else str(scope.meta / value)
    root = contained(full, scope.roots)
    if root is not None:
        raise QolaError(
            f"{key}: {shown} is {full}, which climbs out of {root} with '..'",
            where=where,
            hint="a path under the kernel tree (or CK's dir) must stay under it; name a file "
            "outside it by its absolute path",
        )
    return full


def resolve(
    value: str, kind: str, scope: Scope, key: str, where: str | None = None, allow_none: bool = False
) -> str | None:
    """``value`` (plain or expression) as the key's resolved value: paths absolute, a generator's
    script absolute, flags as they are (``None`` only when ``allow_none`` and an expression gives it)."""
    result = evaluate_value(value, kind, scope.names, key, where, allow_none)
    if result is None or kind in (FLAG, LDFLAG):
        return result
    shown = _shown(value)
    if kind == PATH:
        return _path(result, scope, key, shown, where)
    head, sep, rest = result.strip().partition(" ")
    if any(c in head for c in "'\""):  # an evaluated command with a quoted script: as written (AITER's)
        return result
    return f"{_path(head, scope, key, shown, where)}{sep}{rest}"


def resolve_all(values: Mapping[str, Any], scope: Scope, prefix: str, where: str | None = None) -> dict[str, Any]:
    """Every key of ``values`` (a module's overrides, None = not given) that this rule covers,
    resolved; ``prefix`` names the module in messages (``modules[0]``)."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        if value is None or key not in KINDS:
            continue
        kind = KINDS[key]
        if isinstance(value, list):
            out[key] = [resolve(v, kind, scope, f"{prefix}.{key}[{i}]", where) for i, v in enumerate(value)]
        else:
            out[key] = resolve(value, kind, scope, f"{prefix}.{key}", where, allow_none=True)
    return out


def check_plain_flags(per_source: Mapping[str, list[str]], prefix: str, where: str | None = None) -> None:
    """``flags_extra_hip_per_source``: plain flags only (AITER never evaluates them), so a quoted
    one is an error rather than a flag that keeps its quotes."""
    for glob, flags in per_source.items():
        for i, flag in enumerate(flags):
            problem = plain_problem(flag, FLAG)
            if problem:
                raise QolaError(
                    f"{prefix}.flags_extra_hip_per_source.{glob}[{i}]: {_shown(flag)} is not a plain flag ({problem})",
                    where=where,
                    hint="these flags are plain (AITER never evaluates them): write -DX=1, not '-DX=1'",
                )
