#!/usr/bin/env python3
"""Mirror the package's stage folders in tests/ (issue 24): one table, run once, kept as the record.

* :data:`SUPPORT` moves helper modules into ``tests/support/`` (a package: ``from support.x import``);
* :data:`EXTRACT` moves the helpers other test files import out of a test file (or conftest.py) into a
  support module, with every top-level name they need (the closure), the source file importing them
  back; test files then import helpers only from ``support``, never from another test file;
* :data:`MOVES` puts each test file into the folder of the stage it covers, under a name that says
  what it covers (not which past issue wrote it);
* every reference (``tests/<old>.py`` in docs, scripts, bench, code comments; imports in tests and
  bench) is rewritten, then ``ruff check --fix`` drops the imports a move left unused.

A test file that is in no row stops the script before anything moves (give it a row).
Applied once, in 69b6748 (912 tests collected before and after); kept as the record of the move, it
does not run again on the moved tree. tests/test_layering.py now keeps the layout.
Usage: ``python3 scripts/restructure_tests.py`` from the checkout's root, on a clean work tree.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"

SUPPORT = {  # helper module -> support module
    "aiter_oracle": "aiter_oracle",
    "aiter_sdist": "aiter_sdist",
    "attn_abi": "attn_abi",
    "cmake_clients": "cmake_clients",
    "farm": "farm",
    "itfs_fixture": "itfs_fixture",
    "libdata": "libdata",
    "limited": "limited",
    "remote_stack": "remote_stack",
    "test_jit_support": "jit_lib",
}

EXTRACT = [  # (source file stem, names other files import, support module)
    ("conftest", ["REPO", "EXAMPLES", "KERNELS", "run_qola", "wait_for", "cmake_build"], "common"),
    ("test_harden_build", ["FAKE_NVCC", "fake_nvcc", "make_tree", "pytestmark"], "fake_nvcc"),
    ("test_reproducible", ["ATTN", "SOFTMAX", "TINY_MODULE", "libraries", "manifest", "tree_copy"], "repro"),
    ("test_link_audit", ["build_objects", "link_shared", "sh", "write_includes"], "link_objects"),
    ("test_harden_publish", ["fake_report"], "reports"),
    ("test_embed_build", ["MD_NAME", "qola_build", "tree_with_code_objects"], "embed_tree"),
    ("test_cmake_clients", ["MANIFEST"], "cmake_clients"),
    ("test_cli_compat", ["MODULE", "copy_checkout", "qola_cli"], "cli"),
    ("test_checkout", ["git"], "gitrepo"),
    ("test_variants", ["EXAMPLE_VARIANTS", "expected_example"], "example_variants"),
    ("test_rocm_aiter", ["ARCHS", "manifest"], "rocm_aiter"),
    ("test_jit_build", ["AOT_TWO", "TWO"], "jit_manifests"),
]

MOVES = {  # test file stem -> folder/new stem
    # plan: manifest, kernel tree, variants, registry, cpp_itfs API
    "test_manifest": "plan/test_manifest",
    "test_variants": "plan/test_variants",
    "test_needs": "plan/test_needs",
    "test_cdecl": "plan/test_cdecl",
    "test_itfs_api": "plan/test_itfs_api",
    "test_overrides": "plan/test_overrides",
    "test_safe_eval": "plan/test_safe_eval",
    "test_fuzz_tables": "plan/test_fuzz_tables",
    "test_aiter_configs": "plan/test_aiter_configs",
    "test_aiter_parity": "plan/test_aiter_parity",
    "test_tree_aiter": "plan/test_tree_aiter",
    "test_pin": "plan/test_pin",
    "test_example_tree": "plan/test_example_tree",
    "test_harden_inputs": "plan/test_hostile_inputs",
    "test_harden_tree": "plan/test_tree_limits",
    # compile: codegen, ninja graph, real compiles, rebuilds, dist and remote
    "test_build": "compile/test_build",
    "test_codegen": "compile/test_codegen",
    "test_rebuild": "compile/test_rebuild",
    "test_reproducible": "compile/test_reproducible",
    "test_dist": "compile/test_dist",
    "test_remote": "compile/test_remote",
    "test_remote_launch": "compile/test_remote_launch",
    "test_rocm_aiter": "compile/test_rocm_aiter",
    "test_gpu_example": "compile/test_gpu_example",
    "test_gpu_torch_ext": "compile/test_gpu_torch_ext",
    # hooks: isolation, embedding, [jit] in the build
    "test_link_audit": "hooks/test_isolation",
    "test_link_checks": "hooks/test_link_checks",
    "test_embed": "hooks/test_embed",
    "test_embed_build": "hooks/test_embed_build",
    "test_gpu_embed_build": "hooks/test_gpu_embed_build",
    "test_jit_build": "hooks/test_jit_build",
    "test_jit_example": "hooks/test_jit_example",
    "test_gpu_jit": "hooks/test_gpu_jit",
    # output: OUT's layout, consumers, checks, what it says about itself
    "test_layout": "output/test_layout",
    "test_consumers": "output/test_consumers",
    "test_output_trust": "output/test_output_trust",
    "test_harden_publish": "output/test_publish_confined",
    "test_itfs": "output/test_itfs_exports",
    "test_gpu_itfs": "output/test_gpu_itfs",
    # store: build key, prebuilt archives, usage records
    "test_prebuilt": "store/test_prebuilt",
    "test_usage": "store/test_usage",
    "test_gpu_usage": "store/test_gpu_usage",
    # jit: cache, keys, stubs, C++ runtime, qola jit
    "test_jit_cache": "jit/test_jit_cache",
    "test_jit_cli": "jit/test_jit_cli",
    "test_jit_compilers": "jit/test_jit_compilers",
    "test_jit_format": "jit/test_jit_format",
    "test_jit_key": "jit/test_jit_key",
    "test_jit_runtime": "jit/test_jit_runtime",
    "test_jit_stubs": "jit/test_jit_stubs",
    "test_harden_jit": "jit/test_jit_hostile",
    "test_harden_jit_fuzz": "jit/test_jit_fuzz",
    "test_usage_runtime": "jit/test_usage_runtime",
    # pipeline: the build story, settings, failures, refusals before work
    "test_pipeline": "pipeline/test_pipeline",
    "test_settings_path": "pipeline/test_settings_path",
    "test_generator_failures": "pipeline/test_generator_failures",
    "test_harden_build": "pipeline/test_refused_before_work",
    # core, toolchain, checkout
    "test_limits": "core/test_limits",
    "test_one_home": "core/test_shared_primitives",
    "test_toolchain": "toolchain/test_toolchain",
    "test_checkout": "checkout/test_checkout",
    # clients: TE, QoLA, ck-jit calls replayed (CLI + CMake)
    "test_te_flow": "clients/test_te_flow",
    "test_cli_compat": "clients/test_cli_compat",
    "test_cmake_clients": "clients/test_cmake_clients",
    "test_rocm_cmake_clients": "clients/test_rocm_cmake_clients",
    "test_ckjit_client": "clients/test_ckjit_client",
    # the whole package
    "test_layering": "test_layering",
}


# paths a moved file computed from its own place (one folder deeper now)
FILE_FIXES = {
    "tests/support/common.py": (
        "REPO = Path(__file__).resolve().parent.parent",
        "REPO = Path(__file__).resolve().parents[2]",
    ),
    "tests/support/remote_stack.py": (
        "REPO = Path(__file__).resolve().parent.parent",
        "REPO = Path(__file__).resolve().parents[2]",
    ),
    "tests/hooks/test_jit_example.py": (
        "layout.Path(__file__).resolve().parent.parent",
        "layout.Path(__file__).resolve().parents[2]",
    ),
    "tests/plan/test_example_tree.py": (
        "Path(__file__).resolve().parent.parent",
        "Path(__file__).resolve().parents[2]",
    ),
    "tests/plan/test_aiter_parity.py": (
        'Path(__file__).resolve().parent / "aiter_oracle.py"',
        'Path(__file__).resolve().parents[1] / "support" / "aiter_oracle.py"',
    ),
    "tests/pipeline/test_settings_path.py": (
        "Path(__file__).resolve().parent.parent",
        "Path(__file__).resolve().parents[2]",
    ),
    "tests/jit/test_jit_format.py": ("Path(__file__).resolve().parent.parent", "Path(__file__).resolve().parents[2]"),
    "tests/jit/test_jit_stubs.py": ("Path(__file__).resolve().parent.parent", "Path(__file__).resolve().parents[2]"),
    "tests/core/test_limits.py": ("Path(__file__).resolve().parent.parent", "Path(__file__).resolve().parents[2]"),
}
BENCH_WITH_TESTS = ("bench/farm.py",)  # bench files that put tests/ on sys.path (others' imports are bench's own)


def sh(*argv: str) -> None:
    subprocess.run(argv, cwd=ROOT, check=True)


def top_names(node: ast.stmt) -> set[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    if isinstance(node, ast.Assign):
        names = set()
        for t in node.targets:
            elts = t.elts if isinstance(t, ast.Tuple) else [t]
            names |= {e.id for e in elts if isinstance(e, ast.Name)}
        return names
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return {node.target.id}
    return set()


def used_names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def segment(lines: list[str], node: ast.stmt) -> tuple[int, int]:
    start = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))]) - 1
    while start > 0 and lines[start - 1].startswith("#"):
        start -= 1
    return start, node.end_lineno or node.lineno


def extract(src: Path, names: list[str], dest: Path) -> None:
    """Move ``names`` (and the top-level names they use, transitively) from ``src`` to ``dest``."""
    text = src.read_text()
    tree = ast.parse(text)
    lines = text.splitlines(keepends=True)
    body = [n for n in tree.body if top_names(n)]
    defs = {name: n for n in body for name in top_names(n)}
    want, todo = set(), list(names)
    while todo:
        name = todo.pop()
        if name in want or name not in defs:
            continue
        want.add(name)
        todo.extend(used_names(defs[name]) & set(defs))
    nodes = [n for n in body if top_names(n) & want]
    imports = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    own = {f"support.{dest.stem}", dest.stem}  # an import of the destination itself is not carried
    head = "".join(
        "".join(lines[n.lineno - 1 : n.end_lineno])
        for n in imports
        if not (isinstance(n, ast.ImportFrom) and (n.module in own or n.module == "__future__"))
    )
    moved = "\n\n".join("".join(lines[a:b]).rstrip() + "\n" for a, b in (segment(lines, n) for n in nodes))
    if dest.exists():  # the carried imports go after the module's own (ruff's isort orders them)
        old = dest.read_text()
        olines = old.splitlines(keepends=True)
        at = max(n.end_lineno or n.lineno for n in ast.parse(old).body if isinstance(n, (ast.Import, ast.ImportFrom)))
        dest.write_text("".join(olines[:at]) + head + "".join(olines[at:]) + "\n\n" + moved)
    else:
        doc = f'"""Helpers shared by test files (moved out of {src.name} by scripts/restructure_tests.py)."""\n\n'
        dest.write_text(doc + "from __future__ import annotations\n\n" + head + "\n\n" + moved)
    cut = sorted((segment(lines, n) for n in nodes), reverse=True)
    for a, b in cut:
        del lines[a:b]
    # import them back after the file's imports (the names the file still uses stay; ruff drops the rest)
    last = max(n.end_lineno or n.lineno for n in imports)
    back = f"from support.{dest.stem} import {', '.join(sorted(want))}\n"
    shift = sum(b - a for a, b in cut if b <= last)
    lines.insert(last - shift, back)
    src.write_text("".join(lines))


def rewrite_imports(text: str, modmap: dict[str, str]) -> str:
    for old, new in modmap.items():
        text = re.sub(rf"^(\s*)from {old} import ", rf"\1from support.{new} import ", text, flags=re.M)
        text = re.sub(rf"^(\s*)import {old} as (\w+)$", rf"\1from support import {new} as \2", text, flags=re.M)
        alias = f" as {old}" if new != old else ""
        text = re.sub(rf"^(\s*)import {old}$", rf"\1from support import {new}{alias}", text, flags=re.M)
    return text


def main() -> int:
    stems = {p.stem for p in TESTS.glob("*.py")} - {"conftest"}
    unknown = stems - set(SUPPORT) - set(MOVES)
    if unknown:
        print("no row for: " + ", ".join(sorted(unknown)), file=sys.stderr)
        return 1
    (TESTS / "support").mkdir(exist_ok=True)
    init = TESTS / "support" / "__init__.py"
    init.write_text('"""Helpers shared by the tests (no tests here); test files import them as support.<module>."""\n')
    sh("git", "add", str(init))
    for old, new in SUPPORT.items():
        sh("git", "mv", f"tests/{old}.py", f"tests/support/{new}.py")
    modmap: dict[str, str] = dict(SUPPORT)
    for src, names, dest in EXTRACT:
        path = TESTS / f"{src}.py"
        extract(path, names, TESTS / "support" / f"{dest}.py")
        sh("git", "add", f"tests/support/{dest}.py")
        modmap[src] = dest
    # conftest keeps its fixtures; what other files imported from it is support.common now
    py = [*TESTS.rglob("*.py"), *(ROOT / b for b in BENCH_WITH_TESTS)]
    for p in py:
        text = p.read_text()
        new = rewrite_imports(text, modmap)
        if new != text:
            p.write_text(new)
    for old, new in MOVES.items():
        (TESTS / new).parent.mkdir(parents=True, exist_ok=True)
        if old + ".py" != new + ".py":
            sh("git", "mv", f"tests/{old}.py", f"tests/{new}.py")
    for rel, (old_text, new_text) in FILE_FIXES.items():
        p = ROOT / rel
        text = p.read_text()
        if old_text not in text:
            print(f"{rel}: {old_text!r} not found", file=sys.stderr)
            return 1
        p.write_text(text.replace(old_text, new_text))
    # references by path or file name in text
    refs = {f"tests/{o}.py": f"tests/{n}.py" for o, n in MOVES.items()}
    refs |= {f"tests/{o}.py": f"tests/support/{n}.py" for o, n in SUPPORT.items()}
    names = {f"{o}.py": f"{Path(n).name}.py" for o, n in MOVES.items() if Path(n).name != o}
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    skip = {"scripts/restructure_tests.py", "scripts/restructure.py"}
    for rel in files:
        p = ROOT / rel
        if rel in skip or p.suffix not in {".py", ".md", ".sh", ".toml", ".cmake", ".txt", ""} or not p.is_file():
            continue
        text = p.read_text(errors="surrogateescape")
        new = text
        for o, n in refs.items():
            new = new.replace(o, n)
        for o, n in names.items():
            new = re.sub(rf"(?<![\w/]){re.escape(o)}", n, new)
        if new != text:
            p.write_text(new, errors="surrogateescape")
    sh(sys.executable, "-m", "ruff", "check", "--fix", "--select", "F401,I", "-q", "tests", "bench")
    sh(sys.executable, "-m", "ruff", "format", "-q", "tests", "bench")
    return 0


if __name__ == "__main__":
    sys.exit(main())
