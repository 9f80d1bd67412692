"""The size bounds of CONTRIBUTING.md, checked: no module over 500 lines, no function over 60 lines, no
function with more than 6 parameters (self/cls not counted; past that, a parameter object).

    python3 scripts/sizes.py            # qola/ (all three bounds) and tests/ (module and function size)
    python3 scripts/sizes.py PATH...    # the given files or folders, all three bounds

tests/ is held to the two size bounds only: a test helper's keyword knobs are its interface (ruff's
PLR0913 is off there for the same reason). Prints one line per breach and exits 1 when there is any.
scripts/lint.sh runs it.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 60
MAX_PARAMETERS = 6
ROOT = Path(__file__).resolve().parent.parent
# (folder, whether the parameter bound applies)
DEFAULT = (("qola", True), ("tests", False))
SKIPPED = ("templates",)  # qola/templates holds text rendered into C, not modules


def python_files(path: Path) -> Iterator[Path]:
    if path.is_file():
        yield path
        return
    for f in sorted(path.rglob("*.py")):
        if not any(part in SKIPPED for part in f.relative_to(path).parts):
            yield f


def parameters(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    a = fn.args
    names = [*a.posonlyargs, *a.args]
    count = len(names) + len(a.kwonlyargs)
    if names and names[0].arg in ("self", "cls"):
        count -= 1
    return count


def breaches(f: Path, check_parameters: bool) -> Iterator[str]:
    path = f.resolve().relative_to(ROOT) if f.resolve().is_relative_to(ROOT) else f
    text = f.read_text(encoding="utf-8")
    lines = text.count("\n")
    if lines > MAX_MODULE_LINES:
        yield f"{path}: module has {lines} lines (bound {MAX_MODULE_LINES})"
    for node in ast.walk(ast.parse(text, filename=str(path))):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        length = (node.end_lineno or node.lineno) - node.lineno + 1
        if length > MAX_FUNCTION_LINES:
            yield f"{path}:{node.lineno}: {node.name} has {length} lines (bound {MAX_FUNCTION_LINES})"
        if check_parameters and (n := parameters(node)) > MAX_PARAMETERS:
            yield f"{path}:{node.lineno}: {node.name} takes {n} parameters (bound {MAX_PARAMETERS}; use a parameter object)"


def main(argv: list[str]) -> int:
    targets = [(Path(a), True) for a in argv] or [(ROOT / d, params) for d, params in DEFAULT]
    found = [line for target, params in targets for f in python_files(target) for line in breaches(f, params)]
    print("\n".join([*found, f"sizes: {len(found)} over the bounds"]))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
