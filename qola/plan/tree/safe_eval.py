"""Restricted evaluator for the expression strings of an AITER module table.

AITER ``eval()``s each value of ``optCompilerConfig.json`` in the globals of
``aiter/jit/core.py``. qola walks the expression's AST instead and allows only
the forms those tables use: constants, names from a given namespace, f-strings,
attribute reads on qola-provided objects, calls of qola-provided functions and
a few string methods, subscripts, comparisons, ``x if c else y``, ``and/or/not``,
list/tuple literals and small arithmetic. Everything else — lambdas,
comprehensions, dunder attributes, calls of anything not provided, imports,
huge numbers or strings — is refused with a :class:`QolaError`; nothing of the
expression ever runs as Python code.
"""

from __future__ import annotations

import ast
import operator
import re
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from qola.core.errors import QolaError

MAX_EXPR_CHARS = 20_000
MAX_STR = 100_000  # largest string or list an expression may build (a list counts its items' sizes too)
MAX_INT_BITS = 128
MAX_DEPTH = 60
MAX_FORMAT_NUMBER = 1_000  # largest width or precision in an f-string's format spec


@dataclass(frozen=True)
class SafeFunction:
    """A callable the evaluator may call: a name for messages and the function."""

    name: str
    fn: Callable[..., Any]
    max_args: int = 3


@dataclass(frozen=True)
class SafeObject:
    """An object with a fixed set of readable attributes (``os``, ``torch.version`` …)."""

    name: str
    attrs: Mapping[str, Any] = field(default_factory=dict)
    items: Mapping[str, Any] | None = None  # supports obj[key] when set (os.environ)


_STR_METHODS = {
    "split",
    "rsplit",
    "strip",
    "lstrip",
    "rstrip",
    "lower",
    "upper",
    "replace",
    "startswith",
    "endswith",
    "join",
}  # never str.format: its field syntax reads attributes ("{0.__class__}")
_BINOPS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_CMPOPS: dict[type, Callable[[Any, Any], bool]] = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
    ast.Is: operator.is_,
    ast.IsNot: operator.is_not,
}


class _Refused(Exception):
    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def size_of(value: Any, budget: int = MAX_STR) -> int:
    """Characters of every string in ``value`` plus one per list/tuple item, counted without
    recursion; stops counting once past ``budget`` (so ``[["a" * 100000] * 100000]``, whose text
    would be 10^10 characters, costs nothing to refuse)."""
    total, stack = 0, [value]
    while stack and total <= budget:
        item = stack.pop()
        if isinstance(item, str):
            total += len(item)
        elif isinstance(item, (list, tuple)):
            total += len(item)
            stack.extend(item)
        else:
            total += 1
    return total


def _check_size(value: Any) -> Any:
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
        raise _Refused(f"integer result larger than {MAX_INT_BITS} bits")
    if isinstance(value, (str, list, tuple)) and size_of(value) > MAX_STR:
        raise _Refused(f"result longer than {MAX_STR} characters/items")
    return value


def _bounded_str_method(s: str, name: str) -> Callable[..., Any]:
    """A string method that refuses results that would exceed MAX_STR before building them."""
    method = getattr(s, name)

    def call(*args: Any) -> Any:
        if not all(isinstance(a, (str, int, list, tuple)) and not isinstance(a, bool) for a in args):
            raise _Refused(f"str.{name}() takes strings or integers here")
        if (
            name == "replace"
            and len(args) >= 2
            and isinstance(args[1], str)
            and (len(s) + 1) * (len(args[1]) + 1) > MAX_STR
        ):
            raise _Refused(f"str.replace() result could exceed {MAX_STR} characters")
        if name == "join" and args:
            items = list(args[0]) if isinstance(args[0], (list, tuple)) else None
            if items is None or not all(isinstance(i, str) for i in items):
                raise _Refused("str.join() takes a list of strings")
            if len(s) * len(items) + sum(map(len, items)) > MAX_STR:
                raise _Refused(f"str.join() result longer than {MAX_STR} characters")
        return method(*args)

    return call


class _Evaluator:
    def __init__(self, names: Mapping[str, Any]):
        self.names = names

    def visit(self, node: ast.AST, depth: int = 0) -> Any:
        if depth > MAX_DEPTH:
            raise _Refused("expression nested too deeply")
        method = getattr(self, "v_" + type(node).__name__, None)
        if method is None:
            raise _Refused(f"{type(node).__name__} is not allowed")
        return _check_size(method(node, depth + 1))

    # literals -------------------------------------------------------------
    def v_Expression(self, node: ast.Expression, d: int) -> Any:
        return self.visit(node.body, d)

    def v_Constant(self, node: ast.Constant, d: int) -> Any:
        if node.value is Ellipsis or isinstance(node.value, (bytes, complex)):
            raise _Refused(f"constant {node.value!r} is not allowed")
        return node.value

    def v_List(self, node: ast.List, d: int) -> list[Any]:
        return [self.visit(e, d) for e in node.elts]

    def v_Tuple(self, node: ast.Tuple, d: int) -> tuple[Any, ...]:
        return tuple(self.visit(e, d) for e in node.elts)

    def v_JoinedStr(self, node: ast.JoinedStr, d: int) -> str:
        return "".join(str(self.visit(v, d)) for v in node.values)

    def v_FormattedValue(self, node: ast.FormattedValue, d: int) -> str:
        value = self.visit(node.value, d)
        if isinstance(value, (SafeObject, SafeFunction)):
            raise _Refused(f"cannot format {value.name}")
        if node.conversion == ord("r"):
            value = repr(value)
        elif node.conversion == ord("a"):
            value = ascii(value)
        spec = self.visit(node.format_spec, d) if node.format_spec is not None else ""
        if len(spec) > 20:
            raise _Refused("format spec too long")
        if any(int(n) > MAX_FORMAT_NUMBER for n in re.findall(r"[0-9]+", spec)):
            raise _Refused(f"format width or precision larger than {MAX_FORMAT_NUMBER} in {spec!r}")
        try:
            return format(value, spec)
        except (ValueError, TypeError, OverflowError) as exc:  # OverflowError: f'{-1:c}'
            raise _Refused(f"bad format spec {spec!r}: {exc}") from None

    # names and attributes ---------------------------------------------------
    def v_Name(self, node: ast.Name, d: int) -> Any:
        if node.id.startswith("__"):
            raise _Refused(f"name {node.id!r} is not allowed")
        if node.id not in self.names:
            raise _Refused(f"unknown name {node.id!r}")
        return self.names[node.id]

    def v_Attribute(self, node: ast.Attribute, d: int) -> Any:
        if node.attr.startswith("_"):
            raise _Refused(f"attribute {node.attr!r} is not allowed")
        obj = self.visit(node.value, d)
        if isinstance(obj, SafeObject):
            if node.attr not in obj.attrs:
                raise _Refused(f"{obj.name} has no attribute {node.attr!r} known to qola")
            return obj.attrs[node.attr]
        if isinstance(obj, str) and node.attr in _STR_METHODS:
            return SafeFunction(f"str.{node.attr}", _bounded_str_method(obj, node.attr))
        raise _Refused(f"attribute {node.attr!r} of a {type(obj).__name__} is not allowed")

    def v_Subscript(self, node: ast.Subscript, d: int) -> Any:
        obj = self.visit(node.value, d)
        key = self.visit(node.slice, d)
        if isinstance(obj, SafeObject):
            if obj.items is None or not isinstance(key, str):
                raise _Refused(f"{obj.name} cannot be subscripted")
            if key not in obj.items:
                raise _Refused(f"{obj.name}[{key!r}] is not set")
            return obj.items[key]
        if isinstance(obj, (str, list, tuple)) and isinstance(key, (int, slice)) and not isinstance(key, bool):
            try:
                return obj[key]
            except IndexError:
                raise _Refused(f"index {key} out of range") from None
            except ValueError as exc:  # a slice step of 0
                raise _Refused(str(exc)) from None
        raise _Refused(f"subscript of a {type(obj).__name__} is not allowed")

    def v_Slice(self, node: ast.Slice, d: int) -> slice:
        parts = [self.visit(p, d) if p is not None else None for p in (node.lower, node.upper, node.step)]
        if any(p is not None and (not isinstance(p, int) or isinstance(p, bool)) for p in parts):
            raise _Refused("slice bounds must be integers")
        return slice(*parts)

    # calls ------------------------------------------------------------------
    def v_Call(self, node: ast.Call, d: int) -> Any:
        func = self.visit(node.func, d)
        if not isinstance(func, SafeFunction):
            raise _Refused(f"calling {ast.unparse(node.func)} is not allowed")
        if any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords):
            raise _Refused("*args/**kwargs are not allowed")
        if node.keywords:
            raise _Refused(f"keyword arguments to {func.name} are not allowed")
        if len(node.args) > func.max_args:
            raise _Refused(f"{func.name} takes at most {func.max_args} arguments")
        args = [self.visit(a, d) for a in node.args]
        for a in args:
            if isinstance(a, SafeFunction):
                raise _Refused(f"passing a function to {func.name} is not allowed")
        try:
            return func.fn(*args)
        except _Refused:
            raise
        except (TypeError, ValueError, KeyError, IndexError, AttributeError, OverflowError) as exc:
            raise _Refused(f"{func.name}() failed: {exc}") from None

    # operators --------------------------------------------------------------
    def v_IfExp(self, node: ast.IfExp, d: int) -> Any:
        return self.visit(node.body, d) if self._truth(self.visit(node.test, d)) else self.visit(node.orelse, d)

    def v_BoolOp(self, node: ast.BoolOp, d: int) -> Any:
        result: Any = None
        for value in node.values:
            result = self.visit(value, d)
            truth = self._truth(result)
            if isinstance(node.op, ast.And) and not truth:
                return result
            if isinstance(node.op, ast.Or) and truth:
                return result
        return result

    def v_UnaryOp(self, node: ast.UnaryOp, d: int) -> Any:
        value = self.visit(node.operand, d)
        if isinstance(node.op, ast.Not):
            return not self._truth(value)
        if isinstance(node.op, ast.USub) and isinstance(value, (int, float)) and not isinstance(value, bool):
            return -value
        raise _Refused(f"unary {type(node.op).__name__} on {type(value).__name__} is not allowed")

    def v_BinOp(self, node: ast.BinOp, d: int) -> Any:
        op = _BINOPS.get(type(node.op))
        if op is None:
            raise _Refused(f"operator {type(node.op).__name__} is not allowed")
        left, right = self.visit(node.left, d), self.visit(node.right, d)
        for v in (left, right):
            if not isinstance(v, (int, float, str, list, tuple)) or isinstance(v, bool):
                raise _Refused(f"arithmetic on {type(v).__name__} is not allowed")
        small = all(isinstance(v, int) for v in (left, right)) and 0 <= right <= 64 and abs(left) <= 2**16
        if isinstance(node.op, ast.Pow) and not small:
            raise _Refused("only small integer powers are allowed")
        if isinstance(node.op, ast.Mult) and any(isinstance(v, (str, list, tuple)) for v in (left, right)):
            n = right if isinstance(right, int) else left
            seq = left if isinstance(left, (str, list, tuple)) else right
            if not isinstance(n, int) or n * size_of(seq) > MAX_STR:
                raise _Refused(f"repetition longer than {MAX_STR} characters/items")
        if isinstance(node.op, ast.Mod) and isinstance(left, str):
            raise _Refused("%-formatting is not allowed")
        try:
            return op(left, right)
        except (TypeError, ZeroDivisionError, ValueError, OverflowError) as exc:
            raise _Refused(str(exc)) from None

    def v_Compare(self, node: ast.Compare, d: int) -> bool:
        left = self.visit(node.left, d)
        for op, right_node in zip(node.ops, node.comparators):
            right = self.visit(right_node, d)
            try:
                if not _CMPOPS[type(op)](left, right):
                    return False
            except TypeError as exc:
                raise _Refused(str(exc)) from None
            left = right
        return True

    @staticmethod
    def _truth(value: Any) -> bool:
        if isinstance(value, (SafeObject, SafeFunction)):
            raise _Refused(f"truth value of {value.name} is not defined")
        return bool(value)


def evaluate(expr: str, names: Mapping[str, Any], *, where: str = "expression") -> Any:
    """Evaluate ``expr`` with the given names. Raises :class:`QolaError` on anything not allowed.

    ``where`` names the expression's origin for messages, e.g.
    ``"optCompilerConfig.json: module_x.srcs[0]"``.
    """
    if not isinstance(expr, str):
        raise QolaError(f"expected an expression string, got {type(expr).__name__}", where=where)
    shown = expr if len(expr) <= 200 else expr[:200] + "…"
    if len(expr) > MAX_EXPR_CHARS:
        raise QolaError(f"expression longer than {MAX_EXPR_CHARS} characters: {shown!r}", where=where)
    if "\x00" in expr:  # Python source cannot hold one; say so rather than "cannot parse"
        raise QolaError(
            f"expression {shown!r} contains a NUL character",
            where=where,
            hint="write a NUL nowhere in a flag, path or command: it cannot reach a compiler",
        )
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # SyntaxWarning for odd literals: not the user's concern here
            tree = ast.parse(expr.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        msg = (
            exc.msg
            if isinstance(exc, SyntaxError)
            else "nested too deeply or too large to parse"
            if isinstance(exc, (RecursionError, MemoryError))
            else str(exc)
        )
        raise QolaError(
            f"cannot parse expression {shown!r}: {msg}",
            hint="module-table values must be Python expression strings as AITER writes them",
            where=where,
        ) from None
    try:
        value = _Evaluator(names).visit(tree)
    except _Refused as exc:
        raise QolaError(
            f"refused expression {shown!r}: {exc.reason}",
            hint="qola evaluates only the forms AITER's tables use (constants, f-strings, known names, "
            "os.environ.get, get_gfx(), hasattr, int, str, torch.version.hip); it never runs arbitrary code",
            where=where,
        ) from None
    except RecursionError:
        raise QolaError(f"refused expression {shown!r}: nested too deeply", where=where) from None
    except MemoryError:  # a bound above was not enough: still the user's input, not a crash
        raise QolaError(f"refused expression {shown!r}: it needs too much memory", where=where) from None
    except (ArithmeticError, ValueError, TypeError, LookupError) as exc:
        # every operation above that can fail on its operands catches its own; this is the backstop
        # for one that was missed: the user's input still gets a message naming it, never a traceback
        raise QolaError(f"refused expression {shown!r}: {type(exc).__name__}: {exc}", where=where) from None
    if isinstance(value, (SafeObject, SafeFunction)):
        raise QolaError(f"expression {shown!r} evaluates to {value.name}, not a value", where=where)
    if not _utf8(value):
        raise QolaError(
            f"expression {shown!r} evaluates to text that is not UTF-8 (a lone surrogate)",
            where=where,
            hint="qola writes these values into build.ninja, logs and manifest.json as UTF-8",
        )
    return value


def _utf8(value: Any) -> bool:
    """Whether every string in ``value`` encodes as UTF-8 (counted without recursion; the value's size
    is already bounded)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return False
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return True
