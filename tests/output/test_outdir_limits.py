"""The output and build dirs qola writes (issue 23, moved from tests/plan/test_tree_limits.py): a path
with a control character is refused before anything is written, a build or output dir another user
owns (or every user may write) is refused naming it, and published logs are private."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from support.common import KERNELS
from support.limited import qola, user_error

from qola.core import owner

QUICK = '[qola]\nnamespace = "qk"\n[build]\narchitectures = ["sm_90"]\n'


@pytest.fixture()
def tree(tmp_path: Path) -> Path:
    return shutil.copytree(KERNELS, tmp_path / "tree", ignore=shutil.ignore_patterns("__pycache__", "*.co"))


def manifest(tmp_path: Path) -> Path:
    path = tmp_path / "m.toml"
    path.write_text(QUICK + '[[modules]]\nname = "module_rmsnorm"\n')
    return path


@pytest.mark.parametrize("flag", ["-o", "--build-dir"])
def test_output_or_build_dir_with_a_newline_is_refused_before_anything_is_written(
    tree: Path, tmp_path: Path, flag: str
) -> None:
    """A newline in the build dir's path tripped the ninja writer's assertion (a traceback) after
    creating the directory."""
    bad = tmp_path / "o\nut"
    args = ["-o", str(bad)] if flag == "-o" else ["-o", str(tmp_path / "out"), "--build-dir", str(bad)]
    path = manifest(tmp_path)
    before = set(tmp_path.iterdir())
    proc = qola("build", "-m", str(path), "-a", str(tree), *args, "--dry-run")
    user_error(proc, "control character", flag)
    assert set(tmp_path.iterdir()) == before


OTHER_UID = 65534  # nobody
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="making a directory another user's needs root (chown)")


def test_foreign_problem_owner_and_mode(tmp_path: Path) -> None:
    """Owner and mode rules, checked for any euid (no root needed)."""
    st = os.stat(tmp_path)
    me = st.st_uid
    assert owner.foreign_problem(st, euid=me) is None
    assert "is owned by" in (owner.foreign_problem(st, euid=me + 1 if me else 1) or "") or me == 0
    tmp_path.chmod(0o777)
    assert "writable by every user (mode 0777)" in (owner.foreign_problem(os.stat(tmp_path), euid=me) or "")
    tmp_path.chmod(0o1777)  # sticky, as /tmp: others cannot replace what is ours
    assert owner.foreign_problem(os.stat(tmp_path), euid=me) is None
    tmp_path.chmod(0o775)  # group write: accepted (umask 002)
    assert owner.foreign_problem(os.stat(tmp_path), euid=me) is None


@as_root
@pytest.mark.parametrize("where", ["", "gen/module_rmsnorm", "obj"])
def test_build_dir_owned_by_another_user_is_refused_and_nothing_published(
    tree: Path, tmp_path: Path, where: str
) -> None:
    """The build dir (or a subdir qola reuses: generated sources, objects) owned by another user:
    exit 2 naming it, its owner and the fix, before anything is built or published."""
    build = tmp_path / "out.build"
    (build / where).mkdir(parents=True, exist_ok=True)
    planted = build / where / "planted.cu"
    planted.write_text("// another user's\n")
    os.chown(build / where, OTHER_UID, OTHER_UID)
    proc = qola("build", "-m", str(manifest(tmp_path)), "-a", str(tree), "-o", str(tmp_path / "out"))
    err = user_error(proc, "refusing", str(build / where).rstrip("/"), f"uid {OTHER_UID}", "remove it as its owner")
    assert "--build-dir" in err
    assert not (tmp_path / "out").exists()
    assert not (build / "build.ninja").exists()


@as_root
def test_world_writable_build_dir_is_refused_and_sticky_is_accepted(tree: Path, tmp_path: Path) -> None:
    build = tmp_path / "out.build"
    build.mkdir()
    build.chmod(0o777)
    proc = qola("build", "-m", str(manifest(tmp_path)), "-a", str(tree), "-o", str(tmp_path / "out"), "--dry-run")
    user_error(proc, "writable by every user", "chmod o-w")
    build.chmod(0o1777)
    proc = qola("build", "-m", str(manifest(tmp_path)), "-a", str(tree), "-o", str(tmp_path / "out"), "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert (build / "build.ninja").is_file()


@as_root
def test_output_dir_owned_by_another_user_is_refused(tree: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    (out / "lib").mkdir(parents=True)
    os.chown(out / "lib", OTHER_UID, OTHER_UID)
    proc = qola("build", "-m", str(manifest(tmp_path)), "-a", str(tree), "-o", str(out), "--dry-run")
    user_error(proc, "refusing", str(out / "lib"), f"uid {OTHER_UID}")


def test_published_logs_are_private_and_no_file_is_wider_than_the_umask(tmp_path: Path) -> None:
    """Logs quote what compilers and generators read: 0600. Other written files (manifest.json …)
    take 0644 less the user's umask; before, every written file was forced to 0644."""
    from support.reports import publish_version

    old = os.umask(0o077)
    try:
        publish_version(tmp_path, tmp_path / "out", "v1")  # returns manifest.json
    finally:
        os.umask(old)
    out = tmp_path / "out"
    logs = sorted((out / "logs").iterdir())
    assert logs and all(p.stat().st_mode & 0o777 == 0o600 for p in logs)
    assert (out / "manifest.json").stat().st_mode & 0o777 == 0o600
    publish_version(tmp_path / "b", tmp_path / "out2", "v1")  # the usual umask (022 here)
    assert all(p.stat().st_mode & 0o777 == 0o600 for p in (tmp_path / "out2" / "logs").iterdir())
