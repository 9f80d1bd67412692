"""``qola checkout`` against a local bare mirror made here (issue 21): clone on demand with a submodule,
the pin checked out and verified, patches applied all-or-nothing, a changed tree never reset without
--force, failures that say what was tried, and a second run that touches nothing."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path
from subprocess import CompletedProcess

import pytest
from support.common import run_qola
from support.gitrepo import GIT_ENV, git

pytestmark = pytest.mark.skipif(not shutil.which("git"), reason="needs git")

LOCK = ".aiter.qola-checkout.lock"  # beside the tree (one checkout of it at a time); it stays, as qola's build locks do
LINES = "".join(f"line {i}\n" for i in range(1, 21))


def patch(path: Path, file: str, old: str, new: str, line: int) -> Path:
    path.write_text(
        f"diff --git a/{file} b/{file}\n--- a/{file}\n+++ b/{file}\n"
        f"@@ -{line},3 +{line},3 @@\n line {line}\n-{old}\n+{new}\n line {line + 2}\n"
    )
    return path


@pytest.fixture
def mirror(tmp_path: Path) -> tuple[Path, str, str]:
    """(bare aiter mirror, commit 1, commit 2) — a tree with a submodule (its own bare mirror)."""
    ck = tmp_path / "work-ck"
    (ck / "include").mkdir(parents=True)
    (ck / "include" / "ck.h").write_text("ck v1\n")
    git(ck, "init", "-q")
    git(ck, "add", "-A")
    git(ck, "commit", "-qm", "ck")
    git(tmp_path, "clone", "-q", "--bare", str(ck), "ck.git")
    work = tmp_path / "work-aiter"
    (work / "aiter").mkdir(parents=True)
    (work / "aiter" / "x.py").write_text(LINES)
    git(work, "init", "-q")
    git(work, "add", "-A")
    git(work, "commit", "-qm", "one")
    git(work, "submodule", "add", "-q", str(tmp_path / "ck.git"), "3rdparty/composable_kernel")
    git(work, "commit", "-qm", "with ck")
    first = git(work, "rev-parse", "HEAD")
    (work / "aiter" / "x.py").write_text(LINES.replace("line 15\n", "line 15 (v2)\n"))
    git(work, "commit", "-qam", "two")
    git(work, "tag", "v2")
    second = git(work, "rev-parse", "HEAD")
    git(tmp_path, "clone", "-q", "--bare", str(work), "aiter.git")
    return tmp_path / "aiter.git", first, second


@pytest.fixture
def patches(tmp_path: Path) -> Path:
    d = tmp_path / "patches"
    d.mkdir()
    patch(d / "0001-x.patch", "aiter/x.py", "line 4", "line 4 (patched)", 3)
    (d / "0002-ck.patch").write_text(
        "diff --git a/3rdparty/composable_kernel/include/ck.h b/3rdparty/composable_kernel/include/ck.h\n"
        "--- a/3rdparty/composable_kernel/include/ck.h\n+++ b/3rdparty/composable_kernel/include/ck.h\n"
        "@@ -1 +1 @@\n-ck v1\n+ck v1 patched\n"
    )
    (d / "0003-new.patch").write_text(
        "diff --git a/aiter/new.txt b/aiter/new.txt\nnew file mode 100644\n--- /dev/null\n+++ b/aiter/new.txt\n"
        "@@ -0,0 +1 @@\n+added by a patch\n"
    )
    (d / "README").write_text("not a patch: ignored\n")
    return d


def checkout(*args: str, env: dict[str, str] | None = None) -> CompletedProcess[str]:
    return run_qola("checkout", *args, env={**GIT_ENV, **(env or {})})


def manifest(tmp_path: Path, commit: str, patches_dir: Path | None = None, url: Path | None = None) -> Path:
    m = tmp_path / "q.toml"
    text = f'[qola]\naiter_commit = "{commit}"\nnamespace = "qk"\n'
    if patches_dir is not None:
        text += f'patches_dir = "{os.path.relpath(patches_dir, tmp_path)}"\n'
    if url is not None:
        text += f'aiter_url = "{url}"\n'
    m.write_text(text + '[build]\narchitectures = ["sm_90"]\n')
    return m


def tree_files(root: Path) -> dict[str, tuple[str, int]]:
    return {
        str(p.relative_to(root)): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
        if p.is_file() and ".git" not in p.relative_to(root).parts
    }


def test_clone_pin_submodule_and_patches(tmp_path: Path, mirror: tuple[Path, str, str], patches: Path) -> None:
    bare, first, _ = mirror
    root = tmp_path / "build" / "third_party" / "aiter"
    m = manifest(tmp_path, first[:10], patches, bare)
    proc = checkout("--manifest", str(m), "--aiter-root", str(root))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"AITER ready at {root}"
    assert git(root, "rev-parse", "HEAD") == first  # the pin, verified and detached
    assert git(root, "rev-parse", "--abbrev-ref", "HEAD") == "HEAD"
    assert (root / "aiter" / "x.py").read_text() == LINES.replace("line 4\n", "line 4 (patched)\n")
    assert (root / "3rdparty/composable_kernel/include/ck.h").read_text() == "ck v1 patched\n"
    assert (root / "aiter" / "new.txt").read_text() == "added by a patch\n"
    assert "applied 3 patch(es): 0001-x.patch, 0002-ck.patch, 0003-new.patch" in proc.stderr
    assert [p.name for p in root.parent.iterdir() if p.name != "aiter"] == [LOCK]  # the clone was renamed

    before = tree_files(root)  # a second run: nothing to do, nothing rewritten
    again = checkout("--manifest", str(m), "--aiter-root", str(root))
    assert again.returncode == 0 and tree_files(root) == before, again.stderr
    assert "patches applied (3): 0001-x.patch, 0002-ck.patch, 0003-new.patch" in again.stderr  # what the tree holds

    moved = checkout("--manifest", str(m), "--aiter-root", str(root), "--aiter-commit", "v2")  # a tag
    assert moved.returncode == 0, moved.stderr
    assert git(root, "rev-parse", "HEAD") == mirror[2]
    x = (root / "aiter" / "x.py").read_text()
    assert "line 15 (v2)" in x and "line 4 (patched)" in x and (root / "aiter" / "new.txt").is_file()


def test_conflict_leaves_the_tree_exactly_as_it_was(
    tmp_path: Path, mirror: tuple[Path, str, str], patches: Path
) -> None:
    bare, first, second = mirror
    root = tmp_path / "aiter"
    assert (
        checkout(
            "--aiter-root", str(root), "--aiter-commit", first, "--aiter-url", str(bare), "--patches-dir", str(patches)
        ).returncode
        == 0
    )
    before, head = tree_files(root), git(root, "rev-parse", "HEAD")
    # the next set: a good patch, then one whose context is not in commit 2
    bad = tmp_path / "bad"
    bad.mkdir()
    patch(bad / "0001-good.patch", "aiter/x.py", "line 9", "line 9 (good)", 8)
    patch(bad / "0002-bad.patch", "aiter/x.py", "line 12 (not there)", "line 12 (bad)", 11)
    proc = checkout("--aiter-root", str(root), "--aiter-commit", second, "--patches-dir", str(bad))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "0002-bad.patch does not apply" in proc.stderr and "hunk '-11,3 +11,3' of aiter/x.py" in proc.stderr
    assert "the tree is as it was" in proc.stderr
    assert git(root, "rev-parse", "HEAD") == head
    after = tree_files(root)
    assert {k: v[0] for k, v in after.items()} == {k: v[0] for k, v in before.items()}  # same files, same bytes
    assert (root / "aiter" / "new.txt").is_file() and "line 9 (good)" not in (root / "aiter/x.py").read_text()
    # and a later run with the old set finds its own checkout: nothing to do
    same = checkout("--aiter-root", str(root), "--aiter-commit", first, "--patches-dir", str(patches))
    assert same.returncode == 0 and "nothing to do" in same.stderr, same.stderr


def test_a_failed_fresh_clone_leaves_nothing(tmp_path: Path, mirror: tuple[Path, str, str]) -> None:
    bare, first, _ = mirror
    bad = tmp_path / "bad"
    bad.mkdir()
    patch(bad / "0001-bad.patch", "aiter/x.py", "nope", "x", 3)
    root = tmp_path / "third_party" / "aiter"
    proc = checkout(
        "--aiter-root", str(root), "--aiter-commit", first, "--aiter-url", str(bare), "--patches-dir", str(bad)
    )
    assert proc.returncode == 2 and "0001-bad.patch does not apply" in proc.stderr, proc.stderr
    assert not root.exists() and [p.name for p in (tmp_path / "third_party").iterdir()] == [LOCK]


def test_changed_tree_is_never_reset_without_force(tmp_path: Path, mirror: tuple[Path, str, str]) -> None:
    bare, first, second = mirror
    root = tmp_path / "aiter"
    git(tmp_path, "clone", "-q", "--recurse-submodules", str(bare), str(root))
    git(root, "checkout", "-q", "-b", "mine", first)
    git(root, "submodule", "update", "-q", "--init")
    (root / "aiter" / "x.py").write_text("my edit\n")
    (root / "notes.txt").write_text("mine\n")
    proc = checkout("--aiter-root", str(root), "--aiter-commit", second)
    assert proc.returncode == 2 and "has changes qola did not make" in proc.stderr, proc.stderr
    assert "aiter/x.py (M)" in proc.stderr and "notes.txt (untracked)" in proc.stderr and "--force" in proc.stderr
    assert (root / "aiter" / "x.py").read_text() == "my edit\n" and git(root, "rev-parse", "HEAD") == first
    forced = checkout("--aiter-root", str(root), "--aiter-commit", second, "--force")
    assert forced.returncode == 0, forced.stderr
    assert git(root, "rev-parse", "HEAD") == second and "line 15 (v2)" in (root / "aiter" / "x.py").read_text()
    assert git(root, "rev-parse", "mine") == first  # the user's branch was not moved
    assert (root / "notes.txt").read_text() == "mine\n"  # untracked files are never removed


def test_unreachable_url_says_what_was_tried(tmp_path: Path) -> None:
    root = tmp_path / "aiter"
    url = str(tmp_path / "no-such-mirror.git")
    proc = checkout("--aiter-root", str(root), "--aiter-commit", "0123456789abcdef", "--aiter-url", url)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert f"git clone --no-checkout --filter=blob:none -- {url}" in proc.stderr
    assert f"while reaching {url}" in proc.stderr and "does not exist" in proc.stderr  # git's own message
    assert not root.exists() and [p.name for p in tmp_path.iterdir()] == [LOCK]


def test_pin_not_in_the_repository(tmp_path: Path, mirror: tuple[Path, str, str]) -> None:
    bare, _, _ = mirror
    root = tmp_path / "aiter"
    proc = checkout("--aiter-root", str(root), "--aiter-commit", "0123456789abcdef", "--aiter-url", str(bare))
    assert proc.returncode == 2 and f"is not in {root}" in proc.stderr and "fetching" in proc.stderr, proc.stderr
    assert not root.exists()


def test_refusals(tmp_path: Path, mirror: tuple[Path, str, str]) -> None:
    bare, first, _ = mirror
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "file").write_text("x")
    proc = checkout("--aiter-root", str(plain), "--aiter-commit", first, "--aiter-url", str(bare))
    assert proc.returncode == 2 and "is not a git checkout" in proc.stderr and (plain / "file").exists()
    for bad, needle in (("-x", "--aiter-commit"), ("a..b", "--aiter-commit")):
        proc = checkout("--aiter-root", str(tmp_path / "t"), f"--aiter-commit={bad}")
        assert proc.returncode == 2 and needle in proc.stderr, proc.stderr
    proc = checkout(
        "--aiter-root", str(tmp_path / "t"), "--aiter-commit", first, "--patches-dir", str(tmp_path / "nope")
    )
    assert proc.returncode == 2 and "does not exist" in proc.stderr
    proc = checkout("--aiter-root", str(tmp_path / "t"))
    assert proc.returncode == 2 and "no commit to clone" in proc.stderr
    proc = checkout("--aiter-root", str(tmp_path / "t"), "--aiter-commit", first, "--aiter-url", "ext::sh -c x")
    assert proc.returncode == 2 and "remote-helper" in proc.stderr


def test_source_dir_variable_is_used_as_it_is(tmp_path: Path, mirror: tuple[Path, str, str]) -> None:
    bare, first, _ = mirror
    mine = tmp_path / "mine"
    mine.mkdir()
    proc = checkout("--aiter-commit", first, "--aiter-url", str(bare), env={"NVTE_AITER_SOURCE_DIR": str(mine)})
    assert proc.returncode == 0 and proc.stdout.strip() == f"AITER ready at {mine}", proc.stderr
    assert list(mine.iterdir()) == []


def test_group_is_checked_against_the_manifest(tmp_path: Path, mirror: tuple[Path, str, str]) -> None:
    bare, first, _ = mirror
    m = manifest(tmp_path, first, url=bare)
    m.write_text(m.read_text() + '[[modules]]\nname = "module_rmsnorm"\ngroup = "norm"\n')
    proc = checkout("--manifest", str(m), "--aiter-root", str(tmp_path / "t"), "--group", "norm;attn")
    assert proc.returncode == 2 and "unknown module group(s) 'attn'" in proc.stderr and "'norm'" in proc.stderr
    proc = checkout("--manifest", str(m), "--aiter-root", str(tmp_path / "t"), "--group", "norm")
    assert proc.returncode == 0 and "group norm: module_rmsnorm" in proc.stderr, proc.stderr


def test_a_tree_whose_diff_runs_past_the_capture_limit_is_snapshotted(tmp_path: Path) -> None:
    """A changed tree's ``git diff --binary`` can run to gigabytes (a QoLA checkout of AITER whose
    build wrote into it printed more than 64 MiB and the checkout failed): the snapshot hashes it as
    git writes it, and two different changes still give different snapshots."""
    from qola.checkout import state
    from qola.core import proc

    root = tmp_path / "t"
    root.mkdir()
    git(root, "init", "-q")
    (root / "blob.bin").write_bytes(b"\0")
    git(root, "add", "blob.bin")
    git(root, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "one byte")
    size = proc.MAX_CAPTURE  # random bytes: git's binary diff of them is larger still (base85)
    (root / "blob.bin").write_bytes(os.urandom(size))
    env = dict(os.environ)
    first = state.snapshot(root, env)
    assert "blob.bin (M)" in first.changes
    (root / "blob.bin").write_bytes(os.urandom(size))
    assert state.snapshot(root, env).digest != first.digest


# ---- issue 33: links a patch set added, special patch files, a linked root, the notes, short pins --------


def link_patch(path: Path, target: str) -> Path:
    path.write_text(
        "diff --git a/aiter/link b/aiter/link\nnew file mode 120000\n--- /dev/null\n+++ b/aiter/link\n"
        f"@@ -0,0 +1 @@\n+{target}\n\\ No newline at end of file\n"
    )
    return path


@pytest.mark.parametrize("points", ["outside-dir", "dangling"])
def test_a_symlink_a_patch_set_added_goes_with_the_set(
    tmp_path: Path, mirror: tuple[Path, str, str], points: str
) -> None:
    """A patch set that added a symbolic link is replaced by an empty set: the old checkout removed
    added files but kept the link (to a dir outside, or dangling), recorded it in the stamp, and a
    rerun said "nothing to do"."""
    bare, first, _ = mirror
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "evil.h").write_text("#error\n")
    with_link, empty = tmp_path / "with-link", tmp_path / "empty"
    with_link.mkdir()
    empty.mkdir()
    link_patch(with_link / "0001-link.patch", str(outside) if points == "outside-dir" else str(tmp_path / "gone"))
    root = tmp_path / "aiter"
    proc = checkout("--manifest", str(manifest(tmp_path, first, with_link, bare)), "--aiter-root", str(root))
    assert proc.returncode == 0 and os.path.islink(root / "aiter" / "link"), proc.stderr
    m = manifest(tmp_path, first, empty, bare)
    proc = checkout("--manifest", str(m), "--aiter-root", str(root))
    assert proc.returncode == 0, proc.stderr
    assert not os.path.lexists(root / "aiter" / "link") and (outside / "evil.h").is_file()
    assert git(root, "status", "--porcelain", "--ignored", "--", "aiter") == ""
    again = checkout("--manifest", str(m), "--aiter-root", str(root))
    assert again.returncode == 0 and "nothing to do" in again.stderr and not os.path.lexists(root / "aiter" / "link")


@pytest.mark.parametrize("kind", ["dangling", "fifo", "dir", "link-to-dir"])
def test_a_patch_that_is_no_regular_file_is_an_error(
    tmp_path: Path, mirror: tuple[Path, str, str], patches: Path, kind: str
) -> None:
    """A ``*.patch`` that is a dangling link or a FIFO was skipped silently (rc 0); a patches dir that
    does not exist is an error, so this is one too, naming the file (a FIFO is never opened)."""
    bare, first, _ = mirror
    odd = patches / "0000-odd.patch"
    if kind == "dangling":
        odd.symlink_to(tmp_path / "no-such.patch")
    elif kind == "fifo":
        os.mkfifo(odd)
    elif kind == "dir":
        odd.mkdir()
    else:
        odd.symlink_to(tmp_path)
    root = tmp_path / "aiter"
    proc = checkout("--manifest", str(manifest(tmp_path, first, patches, bare)), "--aiter-root", str(root))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "0000-odd.patch" in proc.stderr and not root.exists(), proc.stderr
    said = {
        "dangling": "symbolic link to nothing",
        "fifo": "a FIFO",
        "dir": "a directory",
        "link-to-dir": "a directory",
    }
    assert said[kind] in proc.stderr, proc.stderr
    # a link to a regular patch file is followed: the set applies
    os.rmdir(odd) if kind == "dir" else odd.unlink()
    (patches / "0003-new.patch").rename(tmp_path / "kept.patch")
    (patches / "0003-new.patch").symlink_to(tmp_path / "kept.patch")
    proc = checkout("--manifest", str(manifest(tmp_path, first, patches, bare)), "--aiter-root", str(root))
    assert proc.returncode == 0 and (root / "aiter" / "new.txt").read_text() == "added by a patch\n", proc.stderr


def test_an_aiter_root_that_links_to_a_directory_is_followed(tmp_path: Path, mirror: tuple[Path, str, str]) -> None:
    """``--aiter-root`` a symbolic link to a (empty) directory on another disk: the old checkout cloned
    beside the link and replaced it by a directory, leaving the link's target empty."""
    bare, first, _ = mirror
    disk = tmp_path / "disk" / "aiter"
    disk.mkdir(parents=True)
    (tmp_path / "trees").mkdir()
    root = tmp_path / "trees" / "aiter"
    root.symlink_to(disk)
    proc = checkout("--aiter-root", str(root), "--aiter-commit", first, "--aiter-url", str(bare))
    assert proc.returncode == 0, proc.stderr
    assert root.is_symlink() and os.readlink(root) == str(disk)
    assert git(disk, "rev-parse", "HEAD") == first and (disk / "aiter" / "x.py").is_file()
    again = checkout("--aiter-root", str(root), "--aiter-commit", first, "--aiter-url", str(bare))
    assert again.returncode == 0 and "nothing to do" in again.stderr and root.is_symlink()
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    proc = checkout("--aiter-root", str(tmp_path / "dangling"), "--aiter-commit", first, "--aiter-url", str(bare))
    assert proc.returncode == 2 and "not a directory" in proc.stderr and (tmp_path / "dangling").is_symlink()


def test_the_notes_after_a_fresh_clone_name_the_tree_not_the_temporary_clone(
    tmp_path: Path, mirror: tuple[Path, str, str]
) -> None:
    bare, first, _ = mirror
    root = tmp_path / "aiter"
    proc = checkout("--aiter-root", str(root), "--aiter-commit", first, "--aiter-url", str(bare))
    assert proc.returncode == 0, proc.stderr
    assert "qola-clone-" not in proc.stderr and f"in {root}" in proc.stderr, proc.stderr


def test_an_ambiguous_short_pin_is_reported_as_ambiguous(tmp_path: Path, mirror: tuple[Path, str, str]) -> None:
    """Two commits starting with the pin's digits: the old checkout tried to fetch it and said
    "fetching failed"; it is ambiguous, and said so."""
    import subprocess

    bare, _first, _ = mirror
    work = tmp_path / "amb"
    git(tmp_path, "clone", "-q", str(bare), str(work))
    tree = git(work, "rev-parse", "HEAD^{tree}")
    stream = "".join(
        f"commit refs/heads/z{i}\ncommitter t <t@t> 0 +0000\ndata {len(str(i))}\n{i}\nM 040000 {tree} x\n\n"
        for i in range(2000)
    )  # fixed dates and messages: the same commits (and the same shared prefix) every run.
    # Branch names start with "z" (not a hex digit): a 4-digit pin such as "c502" must never also
    # name a branch, or git resolves the name instead of the prefix (CI failed on that once).
    subprocess.run(
        ["git", "-C", str(work), "fast-import", "--quiet"],
        input=stream,
        text=True,
        check=True,
        env={**os.environ, **GIT_ENV},
    )
    seen: dict[str, str] = {}
    pair = None
    for line in git(work, "for-each-ref", "--format=%(objectname)", "refs/heads/").split():
        if line[:4] in seen and seen[line[:4]] != line:
            pair = (seen[line[:4]], line)
            break
        seen[line[:4]] = line
    assert pair is not None  # 2000 commits over 16^4 prefixes
    pin = pair[0][:4]
    proc = checkout("--aiter-root", str(work), "--aiter-commit", pin, "--force")
    assert proc.returncode == 2 and "ambiguous" in proc.stderr and "fetching" not in proc.stderr, proc.stderr
    assert pair[0][:12] in proc.stderr and pair[1][:12] in proc.stderr
