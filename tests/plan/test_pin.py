"""A pinned ``aiter_commit`` is never taken on trust (issue 23): a tree that is a git checkout whose
commit git will not tell (git missing, another owner's tree not marked ``safe.directory``) fails a
pinned plan, naming why and how to fix it; a tree the user chose explicitly (--skip-checkout) or
--allow-unpinned builds with a warning recorded in the pin record. An sdist (no .git) is only noted."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from support.common import KERNELS, run_qola

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def git_tree(tmp: Path) -> tuple[Path, str]:
    tree = tmp / "kernels"
    shutil.copytree(KERNELS, tree, ignore=shutil.ignore_patterns("hsa", "__pycache__"))
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
    }
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "tree"]):
        subprocess.run(["git", "-C", str(tree), *args], check=True, env=env, capture_output=True)
    head = subprocess.run(
        ["git", "-C", str(tree), "rev-parse", "HEAD"], check=True, capture_output=True, text=True
    ).stdout.strip()
    return tree, head


def manifest(tmp: Path, pin: str) -> Path:
    m = tmp / "q.toml"
    m.write_text(
        f'[qola]\naiter_commit = "{pin}"\nnamespace = "qk"\n[build]\narchitectures = ["sm_90"]\n'
        '[[modules]]\nname = "module_softmax"\n'
    )
    return m


def refusing_git(tmp: Path) -> dict[str, str]:
    """A PATH whose git refuses the tree as git does for another user's checkout."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    (bin_dir / "git").write_text(
        "#!/bin/sh\necho \"fatal: detected dubious ownership in repository at '$3'\" >&2\nexit 128\n"
    )
    (bin_dir / "git").chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}"}


def test_a_pin_git_cannot_verify_is_refused_unless_the_tree_was_chosen(tmp_path: Path) -> None:
    tree, head = git_tree(tmp_path)
    m = manifest(tmp_path, head)
    ok = run_qola("plan", "-m", str(m), "-a", str(tree))
    assert ok.returncode == 0, ok.stderr  # real git: the pin matches
    env = refusing_git(tmp_path)
    proc = run_qola("plan", "-m", str(m), "-a", str(tree), env=env)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "its commit cannot be read" in proc.stderr and "dubious ownership" in proc.stderr
    assert head in proc.stderr and "safe.directory" in proc.stderr
    for flag in ("--skip-checkout", "--allow-unpinned"):
        proc = run_qola("plan", "-m", str(m), "-a", str(tree), flag, env=env)
        assert proc.returncode == 0 and "is not verified" in proc.stderr, (flag, proc.stderr)
    # no git at all on PATH: the same refusal, saying so
    proc = run_qola("plan", "-m", str(m), "-a", str(tree), env={"PATH": str(tmp_path / "empty")})
    assert proc.returncode == 2 and "git is not installed" in proc.stderr, proc.stderr


def test_an_sdist_without_git_is_only_noted(tmp_path: Path) -> None:
    tree = tmp_path / "sdist"
    shutil.copytree(KERNELS, tree, ignore=shutil.ignore_patterns("hsa", "__pycache__", ".git"))
    proc = run_qola("plan", "-m", str(manifest(tmp_path, "abcdef1")), "-a", str(tree))
    assert proc.returncode == 0 and "is not a git checkout (an sdist?)" in proc.stderr, proc.stderr
