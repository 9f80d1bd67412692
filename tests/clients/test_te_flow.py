"""Transformer Engine's calls as its CMake makes them (issue 21), on the example tree with a fake nvcc:
``checkout`` into ``<out>/third_party/aiter`` from a local bare mirror, then ``build … -o <out> --arch
"a;b" --skip-checkout``; pins of a tree the user chose; ``build`` without ``--aiter-root`` cloning the
default checkout of a plain qola checkout. (The ck-jit call form: tests/clients/test_cli_compat.py.)"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from support.cli import MODULE, copy_checkout, qola_cli
from support.fake_nvcc import FAKE_NVCC, make_tree
from support.fake_nvcc import pytestmark as needs_fake_nvcc
from support.gitrepo import git

pytestmark = [needs_fake_nvcc, pytest.mark.skipif(not shutil.which("git"), reason="needs git")]


def two_arch_nvcc(path: Path) -> Path:
    path.write_text(
        FAKE_NVCC.replace("{tag}", "two").replace("{release}", "13.0").replace("echo sm_90;", "echo sm_80; echo sm_90;")
    )
    path.chmod(0o755)
    return path


def snapshot(root: Path) -> dict[str, tuple[bytes, int]]:
    return {
        str(p.relative_to(root)): (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(root.rglob("*")) if p.is_file()
    }


@pytest.fixture
def upstream(tmp_path: Path) -> tuple[Path, str, Path]:
    """(bare mirror of the example tree (+ module_tiny), its commit, a patches dir making tiny answer 43)."""
    work = make_tree(tmp_path / "work")
    git(work, "init", "-q")
    git(work, "add", "-A")
    git(work, "commit", "-qm", "tree")
    git(tmp_path, "clone", "-q", "--bare", str(work), "aiter.git")
    patches = tmp_path / "patches"
    patches.mkdir()
    (patches / "0001-answer.patch").write_text(
        "diff --git a/csrc/tiny/tiny.cu b/csrc/tiny/tiny.cu\n--- a/csrc/tiny/tiny.cu\n+++ b/csrc/tiny/tiny.cu\n"
        "@@ -1 +1 @@\n-"
        + (work / "csrc/tiny/tiny.cu").read_text().replace("42", "42")
        + "+"
        + (work / "csrc/tiny/tiny.cu").read_text().replace("42", "43")
    )
    return tmp_path / "aiter.git", git(work, "rev-parse", "HEAD"), patches


def manifest(tmp_path: Path, commit: str, url: Path, patches: Path | None = None) -> Path:
    m = tmp_path / "qola_manifest.toml"
    extra = f'patches_dir = "{patches}"\n' if patches else ""
    m.write_text(
        f'[qola]\naiter_commit = "{commit}"\nnamespace = "te"\naiter_url = "{url}"\n{extra}'
        f'[build]\narchitectures = ["sm_90"]\n{MODULE}'
    )
    return m


def test_te_cmake_flow(tmp_path: Path, upstream: tuple[Path, str, Path]) -> None:
    bare, commit, patches = upstream
    out = tmp_path / "QoLA" / "build"
    tree = out / "third_party" / "aiter"
    m = manifest(tmp_path, commit, bare, patches)
    proc = qola_cli("checkout", "--manifest", str(m), "--aiter-root", str(tree))
    assert proc.returncode == 0 and proc.stdout.strip() == f"AITER ready at {tree}", proc.stderr
    assert "43" in (tree / "csrc/tiny/tiny.cu").read_text()
    before = snapshot(tree)
    env = {"CUDACXX": str(two_arch_nvcc(tmp_path / "nvcc"))}
    build = (
        "build",
        "--manifest",
        str(m),
        "--aiter-root",
        str(tree),
        "--output-dir",
        str(out),
        "--arch",
        "sm_90;sm_80",
        "--skip-checkout",
    )
    proc = qola_cli(*build, env=env)
    assert proc.returncode == 0 and "does not hold the patches" not in proc.stderr, proc.stdout + proc.stderr
    data = json.loads((out / "manifest.json").read_text())
    assert data["archs"] == ["sm_90", "sm_80"] and data["modules"][0]["status"] == "built"
    assert data["pin"] == {
        "expected": commit,
        "actual": commit,
        "status": "match",
        "source": "[qola] aiter_commit",
        "tree_chosen_by": "--skip-checkout",
    }
    assert (out / "lib" / "te_module_tiny.so").is_file()
    assert snapshot(tree) == before  # publishing never wrote or removed anything in the tree
    (tree / "csrc/tiny/tiny.cu").write_text((tree / "csrc/tiny/tiny.cu").read_text().replace("43", "44"))
    before = snapshot(tree)
    proc = qola_cli(*build, env=env)  # a rebuild and a second publish beside the tree
    assert proc.returncode == 0 and snapshot(tree) == before, proc.stderr
    assert not [
        p.name
        for p in out.iterdir()
        if p.name
        not in ("third_party", ".qola", "current", "lib", "include", "configs", "jit", "share", "logs", "manifest.json")
    ]


def test_tree_under_a_name_qola_publishes_is_refused(tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "out" / "include" / "aiter")
    m = tmp_path / "q.toml"
    m.write_text(f'[qola]\nnamespace = "te"\n[build]\narchitectures = ["sm_90"]\n{MODULE}')
    proc = qola_cli(
        "build",
        "-m",
        str(m),
        "-a",
        str(tree),
        "-o",
        str(tmp_path / "out"),
        "--skip-checkout",
        env={"CUDACXX": str(two_arch_nvcc(tmp_path / "nvcc"))},
    )
    assert proc.returncode == 2 and "under 'include', a name qola writes and removes there" in proc.stderr, proc.stderr
    assert (tree / "csrc/tiny/tiny.cu").is_file()


def test_pin_mismatch_of_a_tree_the_user_chose_is_recorded(tmp_path: Path, upstream: tuple[Path, str, Path]) -> None:
    bare, commit, _ = upstream
    tree = tmp_path / "mine"
    git(tmp_path, "clone", "-q", str(bare), str(tree))
    m = manifest(tmp_path, "deadbeef", bare)
    env = {"CUDACXX": str(two_arch_nvcc(tmp_path / "nvcc"))}
    args = ("build", "-m", str(m), "-o", str(tmp_path / "out"))
    proc = qola_cli(*args, "-a", str(tree), env=env)  # named, not chosen as it is: the pin is enforced
    assert proc.returncode == 2 and "pins deadbeef" in proc.stderr and "--skip-checkout" in proc.stderr, proc.stderr
    proc = qola_cli(*args, "-a", str(tree), "--skip-checkout", env=env)
    assert proc.returncode == 0 and "warning:" in proc.stderr and "pins deadbeef" in proc.stderr, proc.stderr
    pin = json.loads((tmp_path / "out" / "manifest.json").read_text())["pin"]
    assert pin == {
        "expected": "deadbeef",
        "actual": commit,
        "status": "mismatch",
        "source": "[qola] aiter_commit",
        "tree_chosen_by": "--skip-checkout",
    }
    proc = qola_cli(*args, env={**env, "NVTE_AITER_SOURCE_DIR": str(tree)})  # TE's variable, no --aiter-root
    assert proc.returncode == 0, proc.stderr
    pin = json.loads((tmp_path / "out" / "manifest.json").read_text())["pin"]
    assert pin["status"] == "mismatch" and pin["tree_chosen_by"] == "NVTE_AITER_SOURCE_DIR"
    assert git(tree, "rev-parse", "HEAD") == commit and not git(tree, "status", "--porcelain")


def test_build_without_aiter_root_clones_the_default_checkout(tmp_path: Path, upstream: tuple[Path, str, Path]) -> None:
    bare, commit, patches = upstream
    checkout = copy_checkout(tmp_path / "QoLA")
    m = manifest(tmp_path, commit[:12], bare, patches)
    env = {"CUDACXX": str(two_arch_nvcc(tmp_path / "nvcc"))}
    out = tmp_path / "out"
    proc = qola_cli("build", "-m", str(m), "-o", str(out), cwd=checkout, pythonpath=None, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    tree = checkout / "build" / "third_party" / "aiter"
    assert git(tree, "rev-parse", "HEAD") == commit and "43" in (tree / "csrc/tiny/tiny.cu").read_text()
    data = json.loads((out / "manifest.json").read_text())
    assert data["tree"]["path"] == str(tree) and data["pin"]["status"] == "match"
    assert data["pin"]["tree_chosen_by"] is None
    (tree / "csrc/tiny/tiny.cu").write_text(
        "int changed;\n"
    )  # another builder (QoLA's patches) edits qola's checkout …
    proc = qola_cli("build", "-m", str(m), "-o", str(out), cwd=checkout, pythonpath=None, env=env)
    assert proc.returncode == 0, proc.stderr  # … which is qola's to reset, as QoLA resets its own: said, and kept
    assert "discarded changes qola did not make in its own checkout dir" in proc.stderr
    assert "csrc/tiny/tiny.cu (M)" in proc.stderr and "kept as git stashes" in proc.stderr
    assert "43" in (tree / "csrc/tiny/tiny.cu").read_text()
    assert "int changed;" in git(tree, "stash", "show", "-p", "stash@{0}")  # nothing lost


def test_patches_not_applied_to_a_tree_built_as_it_is_are_said(
    tmp_path: Path, upstream: tuple[Path, str, Path]
) -> None:
    bare, commit, patches = upstream
    tree = tmp_path / "mine"
    git(tmp_path, "clone", "-q", str(bare), str(tree))
    m = manifest(tmp_path, commit, bare, patches)
    proc = qola_cli("plan", "-m", str(m), "-a", str(tree), "--skip-checkout")
    assert proc.returncode == 0 and "does not hold the patches of [qola] patches_dir" in proc.stderr, proc.stderr
    assert "0001-answer.patch" in proc.stderr
    assert qola_cli("checkout", "-m", str(m), "-a", str(tree)).returncode == 0
    proc = qola_cli("plan", "-m", str(m), "-a", str(tree), "--skip-checkout")
    assert proc.returncode == 0 and "does not hold the patches" not in proc.stderr, proc.stderr
