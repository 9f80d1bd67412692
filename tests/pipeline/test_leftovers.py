"""Issue 32, item 5 (and `-o .` of item 7): a command refused before any work leaves no file or
directory behind (no ``<out>.build/``, no ``.<out>.qola.lock``); the build dir is invisible to
``git status``; ``-o .`` never puts the build dir in the parent directory.

Builds use a fake nvcc (plain C++ through g++): about a second each.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from support.common import REPO, run_qola
from support.fake_nvcc import fake_nvcc, make_tree

from qola.core import lock

MANIFEST = (
    '[qola]\nnamespace = "qk"\n[build]\narchitectures = ["sm_90"]\n'
    '[[modules]]\nname = "module_tiny"\nsrcs = ["csrc/tiny/tiny.cu"]\nis_python_module = false\n'
)


def _setup(tmp_path: Path) -> tuple[Path, Path, dict[str, Any]]:
    tree = make_tree(tmp_path / "tree")
    m = tmp_path / "q.toml"
    m.write_text(MANIFEST)
    return tree, m, {"CUDACXX": str(fake_nvcc(tmp_path / "nvcc"))}


def _listing(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def test_refused_build_leaves_nothing(tmp_path: Path) -> None:
    tree, _, env = _setup(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    before = _listing(tmp_path)
    proc = run_qola("build", "-m", "typo.toml", "-a", str(tree), "-o", "out", env=env, cwd=work)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "typo.toml" in proc.stderr
    assert _listing(tmp_path) == before  # no out.build/, no .out.qola.lock, no out/
    nested = run_qola("build", "-m", "typo.toml", "-a", str(tree), "-o", "a/b/out", env=env, cwd=work)
    assert nested.returncode == 2 and _listing(tmp_path) == before  # nor the parents made for them


def test_build_dir_is_invisible_to_git_status(tmp_path: Path) -> None:
    tree, m, env = _setup(tmp_path)
    repo = tmp_path / "checkout"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    proc = run_qola("build", "-m", str(m), "-a", str(tree), "-o", "out", env=env, cwd=repo)
    assert proc.returncode == 0, proc.stderr
    assert (repo / "out.build" / "build.ninja").is_file()
    status = subprocess.run(["git", "status", "--porcelain"], cwd=repo, capture_output=True, text=True).stdout
    assert "out.build" not in status, status
    # in qola's own checkout (README's command 1: -o out) the output dir's lock is ignored too
    ignored = subprocess.run(["git", "check-ignore", "--no-index", "-q", ".out.qola.lock"], cwd=REPO)
    assert ignored.returncode == 0


def test_output_dir_dot_keeps_the_build_dir_out_of_the_parent(tmp_path: Path) -> None:
    tree, m, env = _setup(tmp_path)
    here = tmp_path / "here"
    here.mkdir()
    proc = run_qola("build", "-m", str(m), "-a", str(tree), "-o", ".", env=env, cwd=here)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "--build-dir" in proc.stderr
    assert not (tmp_path / "here.build").exists() and not (tmp_path / ".here.qola.lock").exists()
    ok = run_qola(
        "build", "-m", str(m), "-a", str(tree), "-o", ".", "--build-dir", str(tmp_path / "b"), env=env, cwd=here
    )
    assert ok.returncode == 0, ok.stderr
    assert (here / "manifest.json").is_file() and not (tmp_path / "here.build").exists()


def test_undo_removes_only_what_acquire_made(tmp_path: Path) -> None:
    keep = tmp_path / "kept"
    keep.mkdir()
    (keep / ".qola.lock").write_text("{}")
    new = tmp_path / "x" / "y" / ".qola.lock"
    with lock.acquire({keep / ".qola.lock": "a", new: "b"}, ["qola"]) as held:
        assert new.exists()
        held.undo()
    assert not (tmp_path / "x").exists()
    assert (keep / ".qola.lock").exists()  # it was there before: kept
