#!/usr/bin/env python3
"""Move qola's flat modules into stage folders (issue 24) and rewrite every reference to them.

One table, :data:`MOVES` (old module -> new module, relative to ``qola``), decides everything:
``git mv`` of each file (a package moves as a whole), then every reference in qola/, tests/,
bench/, scripts/, docs/, cmake/, examples/, pyproject.toml, README.md, CONTRIBUTING.md and .ci/:

* ``from qola import a, b`` (one line or parenthesised) -> one ``from qola.<stage> import <new>``
  per moved name (``as <old>`` where the file name changed, so the code using it stays as is);
* dotted names anywhere in text: ``import qola.x``, ``from qola.x import``, ``qola.x.attr`` (monkeypatch
  targets, ``python -m qola.x``, docstrings, docs);
* paths: ``qola/x.py``, ``qola/tree/...``, ``qola/registry.toml`` (package data) and, in tests/,
  package-relative strings such as ``"proc.py"`` or ``"tree/aiter_core.py"``.

It then checks that no old reference is left (exit 1, listing each one) and that every module still
imports. Idempotent: a second run moves nothing and rewrites nothing. A flat module or a package that
is neither in the table nor known to stay (a module added after the table was written) stops the
script before anything moves, named, so that it gets a row: ``--leave-unknown`` moves the rest and
leaves those where they are.

Usage: ``python3 scripts/restructure.py [--dry-run] [--leave-unknown] [--no-import-check]``
(from the checkout's root, on a clean work tree).
"""

from __future__ import annotations

import argparse
import ast
import io
import re
import subprocess
import sys
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "qola"

# old module (relative to qola) -> new module. A package row (tree) moves the whole folder.
MOVES: dict[str, str] = {
    # core: what every stage may use
    "errors": "core.errors",
    "proc": "core.proc",
    "fsutil": "core.fsutil",
    "hashing": "core.hashing",
    "rules": "core.rules",
    "lock": "core.lock",
    "owner": "core.owner",
    "deadlines": "core.deadlines",
    # plan: manifest + kernel tree -> Plan
    "manifest": "plan.manifest",
    "plan": "plan.planner",
    "plantypes": "plan.model",
    "variants": "plan.variants",
    "registry": "plan.registry",
    "groups": "plan.groups",
    "needs": "plan.needs",
    "cdecl": "plan.cdecl",
    "ctext": "plan.ctext",
    "itfs": "plan.itfs",
    "genrules": "plan.genrules",
    "tree": "plan.tree",
    # compile: Plan -> objects and libraries in the build dir
    "build": "compile.steps",
    "builddir": "compile.layout",
    "codegen": "compile.codegen",
    "ninja": "compile.ninja",
    "link": "compile.link",
    "pyext": "compile.pyext",
    "pathmap": "compile.pathmap",
    "rebuild": "compile.rebuild",
    "dist": "compile.dist",
    "extras": "compile.extras",
    "audit": "compile.elf",
    "remote_launch": "compile.remote_launch",  # the per-compile REAPI launcher ninja runs
    # output: what is written into OUT, and the checks of it
    "publish": "output.publish",
    "outdir": "output.outdir",
    "consumers": "output.consumers",
    "kernels": "output.kernels",
    "outcheck": "output.checks",
    # hooks: what isolation / embedded code objects / the JIT add to a module
    "isolation": "hooks.isolation",
    "jitbuild": "hooks.jit",
    "embed": "hooks.embed",
    # store: build key, prebuilt archives, the no-op record
    "buildkey": "store.key",
    "prebuilt": "store.prebuilt",
    "fastpath": "store.fastpath",
    "remote": "store.remote",  # REAPI: the service's action cache is a shared store of compiles
    "usage": "store.usage",  # recorded usage: records, fragments, the set applied to a plan, coverage
    # pipeline: one build, start to end
    "pipeline": "pipeline.run",
    "buildreport": "pipeline.report",
    "spec": "pipeline.spec",
    "preflight": "pipeline.preflight",
    "reproduce": "pipeline.reproduce",
}
# data files that move with their module (relative to qola/)
DATA_MOVES: dict[str, str] = {"registry.toml": "plan/registry.toml"}
# what stays where it is
STAYS = {"__init__", "__main__", "cli", "commands", "checkout", "toolchain", "jit", "runtime", "templates"}
STAGES = ("core", "plan", "compile", "output", "hooks", "store", "pipeline")

SCAN_DIRS = ("qola", "tests", "bench", "scripts", "docs", "cmake", "examples", ".ci")
SCAN_FILES = ("pyproject.toml", "README.md", "CONTRIBUTING.md", ".pre-commit-config.yaml")
TEXT_SUFFIXES = {".py", ".md", ".toml", ".cmake", ".txt", ".sh", ".cfg", ".yaml", ".yml", ".in", ""}
# texts that look like a module reference and are not one: (file, regex of the text)
NOT_MODULES: tuple[tuple[str, str], ...] = (
    ("tests/test_cmake_clients.py", r'"qola\.build"'),  # the CMake build dir qola.build
)
# test files whose strings name paths relative to qola/ ("proc.py", "tree/aiter_core.py")
REL_PATH_FILES = ("tests/test_one_home.py", "tests/test_harden_build.py")
THIS = Path(__file__).resolve()

_DOTTED = re.compile(r"(?<![\w.\-/])qola((?:\.[A-Za-z_]\w*)+)(?![\w/])")
_PATH = re.compile(r"(?<![\w.\-/])qola/((?:[A-Za-z_]\w*/)*[A-Za-z_][\w.]*)")
# a quoted path relative to qola/ ("proc.py", "tree/aiter_core.py"), not one compared to a base name
_REL_STR = re.compile(r"(?<!\.name == )([\"'])((?:[A-Za-z_]\w*/)*[A-Za-z_]\w*\.py)\1")
_IMPORTED = re.compile(r"[ \t]+import[ \t]+\(?\s*([A-Za-z_]\w*)")
# ruff's import-outside-toplevel marker (no config enables the rule) -> the layering test's own
_NOQA_LAZY = re.compile(r"# noqa: PLC0415(?: \(([^)]*)\))?")
_FROM_QOLA = re.compile(r"^[ \t]*from[ \t]+qola[ \t]+import\b")


class Layout:
    """The old names, the new names, and which old modules still exist on disk."""

    def __init__(self, before: set[str]) -> None:
        self.before = before  # the old modules that were on disk when the script started
        self.new_modules = self._new_modules()
        # a name that was a module and becomes a package (qola.plan, qola.pipeline)
        self.became_package = {old for old in MOVES if "." not in old and old in STAGES}

    def _new_modules(self) -> set[str]:
        """Every module and package name of the new layout: the table's targets, and each file there
        is now under its new name."""
        names = {"qola." + s for s in STAGES} | {"qola." + new for new in MOVES.values()}
        for p in PKG.rglob("*.py"):
            parts = [x for x in p.relative_to(PKG).with_suffix("").parts if x != "__init__"]
            if parts and parts[0] in MOVES and self.old_exists(parts[0]):
                parts = MOVES[parts[0]].split(".") + parts[1:]
            for n in range(1, len(parts) + 1):
                names.add(".".join(["qola", *parts[:n]]))
        return names

    @staticmethod
    def old_exists(old: str) -> bool:
        return (PKG / f"{old}.py").exists() or ((PKG / old / "__init__.py").exists() and old not in STAGES)

    def rewrite_dotted(self, parts: list[str]) -> list[str] | None:
        """The new spelling of ``qola.<parts>``, or None when it needs none."""
        if not parts or parts[0] not in MOVES:
            return None
        n_new = max(
            (n for n in range(1, len(parts) + 1) if "qola." + ".".join(parts[:n]) in self.new_modules), default=0
        )
        if n_new > 1:
            return None  # qola.plan.manifest, qola.pipeline.run: already new
        if n_new == 1 and parts[0] not in self.before:
            return None  # qola.plan / qola.pipeline as the new packages (after the move)
        return MOVES[parts[0]].split(".") + parts[1:]


def _comment_of(statement: str) -> str:
    """The last comment of a statement's lines (``# noqa: …``, ``# lazy: …``), or ""."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(statement).readline))
    except (tokenize.TokenError, SyntaxError):
        return ""
    comments = [t.string for t in tokens if t.type == tokenize.COMMENT]
    return comments[-1] if comments else ""


def rewrite_from_qola(text: str, layout: Layout) -> str:
    """``from qola import a, b`` -> one import per stage; names that stay are left in a ``from qola import``."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return text
    lines = text.splitlines(keepends=True)
    edits = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.ImportFrom) and node.module == "qola" and node.level == 0):
            continue
        if not any(a.name in MOVES for a in node.names):
            continue
        start, end = node.lineno - 1, (node.end_lineno or node.lineno) - 1
        first = lines[start]
        indent = first[: len(first) - len(first.lstrip())]
        comment = _comment_of("".join(lines[start : end + 1]))
        comment = f"  {comment}" if comment else ""
        out, kept = [], []
        for a in node.names:
            if a.name in MOVES:
                mod, _, base = MOVES[a.name].rpartition(".")
                alias = a.asname or a.name
                out.append(f"{indent}from qola.{mod} import {base}{'' if alias == base else f' as {alias}'}{comment}\n")
            else:
                kept.append(a.name if not a.asname else f"{a.name} as {a.asname}")
        if kept:
            out.insert(0, f"{indent}from qola import {', '.join(kept)}{comment}\n")
        edits.append((start, end, out))
    for start, end, out in sorted(edits, reverse=True):
        lines[start : end + 1] = out
    return _FROM_QOLA_LINE.sub(_from_qola_line, "".join(lines))


_FROM_QOLA_LINE = re.compile(r"^([ \t]*)from qola import ([\w, ]+?)([ \t]*#[^\n]*)?$", re.M)


def _from_qola_line(m: re.Match[str]) -> str:
    """One-line ``from qola import a, b`` the parser did not see (code inside a string)."""
    indent, names, comment = m.group(1), [x.strip() for x in m.group(2).split(",") if x.strip()], m.group(3) or ""
    if not any(x.split(" as ")[0] in MOVES for x in names):
        return m.group(0)
    out, kept = [], []
    for x in names:
        name, _, alias = x.partition(" as ")
        if name in MOVES:
            mod, _, base = MOVES[name].rpartition(".")
            alias = alias or name
            out.append(f"{indent}from qola.{mod} import {base}{'' if alias == base else f' as {alias}'}{comment}")
        else:
            kept.append(x)
    return "\n".join(([f"{indent}from qola import {', '.join(kept)}{comment}"] if kept else []) + out)


def _map_path(rel: str, before: set[str]) -> str | None:
    """``x.py`` / ``tree/a.py`` / ``tree/`` / ``registry.toml`` (relative to qola/) -> the new path."""
    if rel in DATA_MOVES:
        return DATA_MOVES[rel]
    head, sep, rest = rel.partition("/")
    if sep and head in MOVES and head not in STAGES:
        return MOVES[head].replace(".", "/") + "/" + rest  # a package: tree/...
    if not sep and rel.endswith(".py") and rel[:-3] in MOVES and rel[:-3] not in STAGES:
        return MOVES[rel[:-3]].replace(".", "/") + ".py"
    if not sep and rel.endswith(".py") and rel[:-3] in STAGES and rel[:-3] in before:
        return MOVES[rel[:-3]].replace(".", "/") + ".py"  # plan.py, pipeline.py: still the module's name
    return None


def _mark_lazy(text: str, reason: str) -> str:
    """A qola import inside a function with no ``# lazy:`` reason gets the default one (the layering
    test, tests/test_layering.py, requires a reason on each)."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return text
    lines = text.splitlines(keepends=True)
    ends = set()

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            func = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if in_function and isinstance(child, (ast.Import, ast.ImportFrom)):
                mods = [a.name for a in child.names] if isinstance(child, ast.Import) else [child.module or ""]
                stmt = "".join(lines[child.lineno - 1 : child.end_lineno])
                if (
                    getattr(child, "level", 0) == 0
                    and any(m == "qola" or m.startswith("qola.") for m in mods)
                    and "# lazy:" not in stmt
                ):
                    ends.add((child.end_lineno or child.lineno) - 1)
            visit(child, func)

    visit(tree, False)
    for i in ends:
        body = lines[i].rstrip("\n")
        lines[i] = f"{body}  # lazy: {reason}\n"
    return "".join(lines)


def _default_reason(rel: str) -> str:
    """Why a bare-marked function-level import is there, by where it is."""
    if rel.startswith(("qola/commands/", "qola/pipeline/", "qola/cli.py", "qola/spec.py", "qola/pipeline.py")):
        return "start-up of the CLI and of the no-op path"
    return "paid only by the callers that need it"


def rewrite_text(path: Path, text: str, layout: Layout) -> str:
    rel = path.relative_to(ROOT).as_posix()
    shielded: dict[str, str] = {}
    for file, pattern in NOT_MODULES:
        if rel == file:
            for i, m in enumerate(set(re.findall(pattern, text))):
                key = f"\0SHIELD{i}\0"
                shielded[key] = m
                text = text.replace(m, key)
    if path.suffix == ".py":
        text = rewrite_from_qola(text, layout)

    def dotted(m: re.Match[str]) -> str:
        parts = m.group(1)[1:].split(".")
        after = _IMPORTED.match(m.string, m.end())
        if after and "qola." + ".".join([*parts, after.group(1)]) in layout.new_modules:
            return m.group(0)  # from qola.plan import manifest: a module of the new package
        new = layout.rewrite_dotted(parts)
        return m.group(0) if new is None else "qola." + ".".join(new)

    text = _DOTTED.sub(dotted, text)

    def pathed(m: re.Match[str]) -> str:
        new = _map_path(m.group(1), layout.before)
        return m.group(0) if new is None else "qola/" + new

    text = _PATH.sub(pathed, text)
    if rel.startswith("qola/") and path.suffix == ".py":
        text = _NOQA_LAZY.sub(lambda m: f"# lazy: {m.group(1) or _default_reason(rel)}", text)
        text = _mark_lazy(text, _default_reason(rel))
    if rel in REL_PATH_FILES:

        def relstr(m: re.Match[str]) -> str:
            new = _map_path(m.group(2), layout.before)
            return m.group(0) if new is None else m.group(1) + new + m.group(1)

        # package-relative paths in tests ("proc.py", "tree/aiter_core.py"), not compared to a base name
        text = _REL_STR.sub(relstr, text)
    if rel == "pyproject.toml":
        for old, new in DATA_MOVES.items():
            text = text.replace(f'"{old}"', f'"{new}"')
    for key, value in shielded.items():
        text = text.replace(key, value)
    return text


def files_to_scan() -> list[Path]:
    out = []
    for d in SCAN_DIRS:
        base = ROOT / d
        if base.is_dir():
            out += [
                p
                for p in base.rglob("*")
                if p.is_file() and p.suffix in TEXT_SUFFIXES and "__pycache__" not in p.parts and ".git" not in p.parts
            ]
    out += [ROOT / f for f in SCAN_FILES if (ROOT / f).is_file()]
    tracked = set(git("ls-files", "-co", "--exclude-standard").splitlines())
    return sorted(p for p in out if p.relative_to(ROOT).as_posix() in tracked and p.resolve() != THIS)


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True, text=True).stdout


def unknown_modules() -> list[str]:
    found = []
    for p in sorted(PKG.iterdir()):
        name = p.stem if p.suffix == ".py" else p.name
        if p.suffix == ".py" or (p.is_dir() and (p / "__init__.py").exists()):
            if name not in MOVES and name not in STAYS and name not in STAGES:
                found.append(p.relative_to(ROOT).as_posix())
    return found


def move(dry: bool) -> list[str]:
    done = []
    for old, new in MOVES.items():
        src = PKG / old if (PKG / old / "__init__.py").exists() and old not in STAGES else PKG / f"{old}.py"
        if not src.exists():
            continue
        dst = PKG / (new.replace(".", "/") + ("" if src.is_dir() else ".py"))
        if dst.exists():
            raise SystemExit(f"restructure: {dst.relative_to(ROOT)} exists already; {src.relative_to(ROOT)} not moved")
        done.append(f"{src.relative_to(ROOT)} -> {dst.relative_to(ROOT)}")
        if dry:
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        # a module becoming a package of the same name (plan.py -> plan/planner.py): through a temp name
        git("mv", str(src), str(dst))
    for old, new in DATA_MOVES.items():
        src, dst = PKG / old, PKG / new
        if src.exists() and not dry:
            dst.parent.mkdir(parents=True, exist_ok=True)
            git("mv", str(src), str(dst))
            done.append(f"{src.relative_to(ROOT)} -> {dst.relative_to(ROOT)}")
    if not dry:
        for stage in STAGES:
            init = PKG / stage / "__init__.py"
            if (PKG / stage).is_dir() and not init.exists():
                init.write_text(f'"""qola\'s {stage} stage (CONTRIBUTING.md: what it holds, what it may import)."""\n')
                git("add", str(init))
    return done


def leftovers(layout: Layout) -> list[str]:
    """Old references still in the tree after the rewrite (each a reason to fail)."""
    bad = []
    for path in files_to_scan():
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        rel = path.relative_to(ROOT).as_posix()
        for file, pattern in NOT_MODULES:
            if rel == file:
                text = re.sub(pattern, "", text)
        for n, line in enumerate(text.splitlines(), 1):
            for m in _DOTTED.finditer(line):
                parts = m.group(1)[1:].split(".")
                after = _IMPORTED.match(line, m.end())
                if after and "qola." + ".".join([*parts, after.group(1)]) in layout.new_modules:
                    continue
                if layout.rewrite_dotted(parts) is not None:
                    bad.append(f"{rel}:{n}: {m.group(0)}")
                elif (
                    parts[0] in layout.became_package
                    and len(parts) > 1
                    and "qola." + ".".join(parts[:2]) not in layout.new_modules
                    and not layout.old_exists(parts[0])
                ):
                    bad.append(f"{rel}:{n}: {m.group(0)} (qola.{parts[0]} is a package now)")
            if path.suffix == ".py" and _FROM_QOLA.match(line):
                names = re.findall(r"\b(\w+)\b", line.split("import", 1)[1].split("#")[0])
                if any(x in MOVES and not layout.old_exists(x) for x in names):
                    bad.append(f"{rel}:{n}: {line.strip()}")
            for m in _REL_STR.finditer(line) if rel in REL_PATH_FILES else ():
                head, sep, _ = m.group(2).partition("/")
                old = head if sep else head.removesuffix(".py")
                if old in MOVES and not layout.old_exists(old) and (not sep or old not in STAGES):
                    bad.append(f"{rel}:{n}: {m.group(0)} (a path relative to qola/)")
            for m in _PATH.finditer(line):
                if _map_path(m.group(1), layout.before) is not None or (
                    m.group(1).endswith(".py") and m.group(1)[:-3] in MOVES and not layout.old_exists(m.group(1)[:-3])
                ):
                    bad.append(f"{rel}:{n}: {m.group(0)}")
    return bad


def import_all() -> list[str]:
    code = (
        "import importlib, pathlib, sys\nbad = []\nfor p in sorted(pathlib.Path('qola').rglob('*.py')):\n"
        "    if 'templates' in p.parts or 'runtime' in p.parts: continue\n"
        "    m = '.'.join(p.with_suffix('').parts).removesuffix('.__init__')\n"
        "    try: importlib.import_module(m)\n"
        "    except Exception as e: bad.append(f'{m}: {type(e).__name__}: {e}')\n"
        "print('\\n'.join(bad)); sys.exit(1 if bad else 0)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    return [x for x in proc.stdout.splitlines() if x] + ([proc.stderr] if proc.returncode and not proc.stdout else [])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="print the moves, change nothing")
    ap.add_argument("--leave-unknown", action="store_true", help="leave modules missing from MOVES flat")
    ap.add_argument("--no-import-check", action="store_true")
    args = ap.parse_args()
    unknown = unknown_modules()
    if unknown:
        print("restructure: modules not in MOVES (add a row to scripts/restructure.py):", *unknown, sep="\n  ")
        if not args.leave_unknown:
            return 1
    before = {old for old in MOVES if Layout.old_exists(old)}
    moved = move(args.dry_run)
    print(*(f"moved {m}" for m in moved), sep="\n") if moved else print("nothing to move")
    if args.dry_run:
        return 0
    layout = Layout(before)
    changed = []
    for path in files_to_scan():
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        new = rewrite_text(path, text, layout)
        if new != text:
            path.write_text(new)
            changed.append(path.relative_to(ROOT).as_posix())
    print(f"rewrote {len(changed)} files", *changed, sep="\n  ")
    bad = leftovers(layout)
    if bad:
        print(
            f"restructure: {len(bad)} old references left (rewrite them, or add them to NOT_MODULES):",
            *bad,
            sep="\n  ",
            file=sys.stderr,
        )
        return 1
    if not args.no_import_check:
        broken = import_all()
        if broken:
            print("restructure: modules that no longer import:", *broken, sep="\n  ", file=sys.stderr)
            return 1
    print("restructure: done; next: ruff check --fix --select I (import order), ruff format, mypy, tests")
    return 0


if __name__ == "__main__":
    sys.exit(main())
