"""The package's layering (issue 24, CONTRIBUTING.md "Stages"): each stage folder imports only from
the stages below it, the commands only the library's public names, and a qola import inside a
function says why it is there (``# lazy: <reason>``). Read from the source (ast), nothing imported.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "qola"

# lowest first; a module may import from its own rank and the ranks below it. "" is qola/__init__.py.
ORDER: tuple[frozenset[str], ...] = tuple(
    frozenset(x.split())
    for x in (
        "",
        "core",
        "toolchain",
        "plan checkout",  # the checkout reads the manifest's [qola] pin; planning reads the pinned commit
        "compile",
        "output",
        "jit",  # the on-demand JIT: its runtime's layout in OUT, the registry's headers
        "hooks",
        "store",
        "pipeline",
        "commands",
        "cli __main__",
    )
)
RANK = {"": 0} | {name: i for i, names in enumerate(ORDER) for name in names}
# known upward imports, each a debt with its reason (a new one fails the test)
UPWARD: dict[tuple[str, str], str] = {
    ("qola.toolchain.base", "qola.compile.link"): "Toolchain.shared_link_argv spells the link with link's argv",
}


@dataclass(frozen=True)
class Import:
    module: str  # the importing module
    target: str  # the qola module imported (or the module a name is imported from)
    names: tuple[str, ...]
    line: int
    text: str  # the statement's source lines
    in_function: bool
    type_only: bool


def module_name(path: Path) -> str:
    parts = [p for p in path.relative_to(PKG.parent).with_suffix("").parts if p != "__init__"]
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in PKG.rglob("*.py") if "templates" not in p.relative_to(PKG).parts}


def stage(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def imports(path: Path, known: set[str]) -> list[Import]:
    text = path.read_text()
    lines = text.splitlines()
    tree = ast.parse(text)
    out: list[Import] = []
    me = module_name(path)

    def visit(node: ast.AST, in_function: bool, type_only: bool) -> None:
        for child in ast.iter_child_nodes(node):
            func = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            typed = type_only or (isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test))
            src = "\n".join(lines[getattr(child, "lineno", 1) - 1 : getattr(child, "end_lineno", 1)])
            if isinstance(child, ast.Import):
                for alias in child.names:
                    if alias.name == "qola" or alias.name.startswith("qola."):
                        out.append(Import(me, alias.name, (), child.lineno, src, in_function, type_only))
            elif (
                isinstance(child, ast.ImportFrom)
                and child.level == 0
                and child.module
                and (child.module == "qola" or child.module.startswith("qola."))
            ):
                names = tuple(a.name for a in child.names)
                subs = [f"{child.module}.{n}" for n in names if f"{child.module}.{n}" in known]
                if subs:  # from qola.plan import manifest: the modules themselves
                    out.extend(Import(me, s, (), child.lineno, src, in_function, type_only) for s in subs)
                    rest = tuple(n for n in names if f"{child.module}.{n}" not in known)
                    if rest:
                        out.append(Import(me, child.module, rest, child.lineno, src, in_function, type_only))
                else:
                    out.append(Import(me, child.module, names, child.lineno, src, in_function, type_only))
            visit(child, func, typed)

    visit(tree, False, False)
    return out


@pytest.fixture(scope="module")
def all_imports() -> list[Import]:
    mods = modules()
    known = set(mods)
    return [imp for path in mods.values() for imp in imports(path, known)]


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle(all_imports: list[Import]) -> None:
    """No two modules import each other, directly or round a loop, counting imports inside functions
    too (a lazy import hides a cycle from Python, not from a reader); only ``TYPE_CHECKING`` imports
    are left out. A package's ``__init__`` importing its own modules is not a cycle of theirs."""
    known = set(modules())
    edges: dict[str, set[str]] = {}
    for imp in all_imports:
        if imp.type_only or imp.target == imp.module:
            continue
        target = imp.target if imp.target in known else imp.target.rsplit(".", 1)[0]
        if target in known and not imp.module.startswith(target + ".") and not target.startswith(imp.module + "."):
            edges.setdefault(imp.module, set()).add(target)
    assert _cycles(edges) == []


def test_the_cycle_finder_finds_a_loop() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_every_stage_has_a_rank() -> None:
    stages = {stage(m) for m in modules()}
    assert stages <= set(RANK), f"folders with no place in ORDER: {sorted(stages - set(RANK))}"


def test_stages_import_downwards_only(all_imports: list[Import]) -> None:
    bad = []
    for imp in all_imports:
        if RANK[stage(imp.target)] > RANK[stage(imp.module)] and (imp.module, imp.target) not in UPWARD:
            bad.append(
                f"{imp.module}:{imp.line} imports {imp.target} "
                f"({stage(imp.module) or 'qola'} may not import from {stage(imp.target)})"
            )
    assert not bad, "\n".join(bad)


def test_known_upward_imports_still_exist(all_imports: list[Import]) -> None:
    """An entry of UPWARD whose import is gone is removed, so the list stays the real debt."""
    found = {(imp.module, imp.target) for imp in all_imports}
    assert not set(UPWARD) - found, sorted(set(UPWARD) - found)


def test_commands_use_only_public_names(all_imports: list[Import]) -> None:
    bad = []
    for imp in all_imports:
        if stage(imp.module) != "commands":
            continue
        if stage(imp.target) == "commands" and imp.target != "qola.commands.common":
            bad.append(f"{imp.module}:{imp.line} imports another command ({imp.target})")
        bad += [f"{imp.module}:{imp.line} imports the private {imp.target}.{n}" for n in imp.names if n.startswith("_")]
        if any(part.startswith("_") for part in imp.target.split(".")[1:]):
            bad.append(f"{imp.module}:{imp.line} imports the private module {imp.target}")
    assert not bad, "\n".join(bad)


def test_function_level_imports_say_why(all_imports: list[Import]) -> None:
    bad = [
        f"{imp.module}:{imp.line}: {imp.text.strip()}"
        for imp in all_imports
        if imp.in_function and not _lazy_reason(imp.text)
    ]
    assert not bad, "a qola import inside a function needs '# lazy: <reason>' on its line:\n" + "\n".join(bad)


def _lazy_reason(text: str) -> bool:
    for line in text.splitlines():
        _, sep, reason = line.partition("# lazy:")
        if sep and reason.strip():
            return True
    return False


def test_the_checker_sees_what_it_checks(tmp_path: Path) -> None:
    """The reader finds a function-level import, a TYPE_CHECKING one and a lazy reason (no vacuous pass)."""
    src = tmp_path / "m.py"
    src.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from qola.core import errors\n"
        "def f():\n    from qola.plan import manifest  # lazy: start-up\n    import qola.store.key\n"
    )
    found = _imports_outside(src)
    assert [(i.target, i.in_function, i.type_only, _lazy_reason(i.text)) for i in found] == [
        ("qola.core.errors", False, True, False),
        ("qola.plan.manifest", True, False, True),
        ("qola.store.key", True, False, False),
    ]


def _imports_outside(path: Path) -> list[Import]:
    global PKG
    saved = PKG
    PKG = path.parent
    try:
        return imports(path, {"qola.core.errors", "qola.plan.manifest"})
    finally:
        PKG = saved


# -- tests/ mirrors the stages (CONTRIBUTING.md "Tests") --------------------------------------------

TESTS = Path(__file__).resolve().parent
TEST_FOLDERS = {"clients", "support"}  # beside the stage folders: client replays, shared helpers


def imports_between_test_files(root: Path) -> list[str]:
    """Where a file under ``root`` imports a test file or conftest.py (helpers come from support/)."""
    bad = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            names += [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
                called = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
                names += [str(node.args[0].value)] if called in ("__import__", "import_module") else []
            bad += [
                f"{path.relative_to(root)}:{getattr(node, 'lineno', 0)}: {n}"
                for n in names
                if n.split(".")[0].startswith(("test_", "conftest"))
            ]
    return bad


def test_test_files_sit_in_stage_folders() -> None:
    stages = {name for names in ORDER for name in names if name and (PKG / name).is_dir()}
    misplaced = [
        str(p.relative_to(TESTS))
        for p in TESTS.rglob("test_*.py")
        if p.parent != TESTS and p.relative_to(TESTS).parts[0] not in stages | TEST_FOLDERS
    ]
    assert not misplaced, f"test files outside the stage folders: {misplaced}"
    assert [p.name for p in TESTS.glob("test_*.py")] == ["test_layering.py"]  # only the package-wide one
    assert not list((TESTS / "support").glob("test_*.py")), "support/ holds helpers, no tests"


def test_no_test_file_imports_another(tmp_path: Path) -> None:
    assert imports_between_test_files(TESTS) == []
    (tmp_path / "test_a.py").write_text(
        "from conftest import REPO\nimport test_b\nfrom support.common import REPO\nx = __import__('conftest').REPO\n"
    )
    assert imports_between_test_files(tmp_path) == [
        "test_a.py:1: conftest",
        "test_a.py:2: test_b",
        "test_a.py:4: conftest",
    ]
