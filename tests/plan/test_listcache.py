"""A generator's ``--list_blobs`` listing is cached by its sources, arguments and environment
(qola.plan.listcache, issue 34) and, since issue 41, by what the generator read: a second ``qola plan``
runs no generator, a changed generator (its script, a file it read, a variable it looked up) runs it
again, a file or variable it never read does not, and an entry or directory that could have been
tampered with is not trusted. The CK-style generator records each invocation into ``$CK_GEN_CALLS``."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from support.ck_tree import CK_DIR, ck_tree, module
from support.common import qola_command, run_qola

from qola.plan import genread


def setup(tmp: Path) -> tuple[Path, Path, dict[str, str]]:
    tree = ck_tree(tmp / "tree")
    m = tmp / "q.toml"
    m.write_text(
        '[qola]\nnamespace = "qk"\n[build]\narchitectures = ["gfx942", "gfx950"]\nmode = "cpp_itfs"\n' + module()
    )
    return tree, m, {"XDG_CACHE_HOME": str(tmp / "cache"), "CK_GEN_CALLS": str(tmp / "calls")}


def plan(tmp: Path, tree: Path, m: Path, env: dict[str, str]) -> tuple[dict[str, Any], int]:
    """``qola plan --json``: its generators' file listings, and how many listing runs it took."""
    before = listings(tmp)
    proc = run_qola("plan", "--json", "-m", str(m), "-a", str(tree), env=env)
    assert proc.returncode == 0, proc.stderr
    files = {g["command"]: g["files"] for g in json.loads(proc.stdout)["modules"][0]["generators"]}
    return files, listings(tmp) - before


def listings(tmp: Path) -> int:
    calls = tmp / "calls"
    lines = calls.read_text().splitlines() if calls.exists() else []
    return sum("--list_blobs" in json.loads(line) for line in lines)


def entries(tmp: Path) -> list[Path]:
    return sorted((tmp / "cache" / "qola" / "listings").glob("*.json"))


def test_a_second_plan_runs_no_generator_and_a_changed_generator_runs_again(tmp_path: Path) -> None:
    tree, m, env = setup(tmp_path)
    first, ran = plan(tmp_path, tree, m, env)
    assert ran == 3 and len(entries(tmp_path)) == 3  # one listing per direction, each cached
    assert all(files for files in first.values())
    again, ran = plan(tmp_path, tree, m, env)
    assert ran == 0 and again == first  # from the cache: the generator did not run
    # pytest's per-test bookkeeping variable is no input of the generator: another test's plan hits too
    elsewhere, ran = plan(tmp_path, tree, m, {**env, "PYTEST_CURRENT_TEST": "tests/x.py::test_other (call)"})
    assert ran == 0 and elsewhere == first
    ops = tree / CK_DIR / "codegen" / "ops" / "__init__.py"  # beside the script, never read by it (issue 41)
    ops.write_text("# changed\n")
    changed, ran = plan(tmp_path, tree, m, env)
    assert ran == 0 and changed == first
    gen = tree / CK_DIR / "generate.py"
    gen.write_text(gen.read_text().replace("(64, 128)", "(64, 96, 128)"))
    grown, ran = plan(tmp_path, tree, m, env)
    assert ran == 3 and any("fmha_fwd_d96_fp16_gfx9" in files for files in grown.values())
    _, ran = plan(tmp_path, tree, m, {**env, "CK_EXTRA": "1"})  # a variable it does not read: no input
    assert ran == 0
    _, ran = plan(tmp_path, tree, m, {**env, "CK_GEN_CALLS": str(tmp_path / "calls2")})  # one it reads
    assert ran == 0 and (tmp_path / "calls2").read_text().count("--list_blobs") == 3


def test_an_entry_that_could_have_been_tampered_with_is_not_trusted(tmp_path: Path) -> None:
    tree, m, env = setup(tmp_path)
    first, _ = plan(tmp_path, tree, m, env)
    a, b, c = entries(tmp_path)
    doc = json.loads(a.read_text())
    doc["stems"] = ["../../etc/evil"]  # a stem that is a path
    a.write_text(json.dumps(doc))
    b.chmod(0o666)  # writable by every user
    target = tmp_path / "elsewhere.json"
    target.write_text(c.read_text())
    c.unlink()
    c.symlink_to(target)  # a link, even to a valid entry
    again, ran = plan(tmp_path, tree, m, env)
    assert ran == 3 and again == first
    assert not any(p.is_symlink() for p in entries(tmp_path)) and all(
        p.stat().st_mode & 0o077 == 0 for p in entries(tmp_path)
    )
    _, ran = plan(tmp_path, tree, m, env)  # rewritten entries are trusted again
    assert ran == 0
    directory = tmp_path / "cache" / "qola" / "listings"
    directory.chmod(0o777)  # a directory anyone may write into is not used at all
    try:
        _, ran = plan(tmp_path, tree, m, env)
        assert ran == 3
    finally:
        directory.chmod(0o700)


def test_a_copy_of_the_tree_elsewhere_takes_the_listings_and_an_edit_in_the_copy_runs_again(tmp_path: Path) -> None:
    """Listings are the tree's wherever it lies (a CI job's new workspace, a pip build's temp dir):
    the tree's root is kept by place, the files it read by content (a copy's new mtimes are hashed)."""
    tree, m, env = setup(tmp_path)
    first, ran = plan(tmp_path, tree, m, env)
    assert ran == 3
    copy = tmp_path / "elsewhere" / "tree"
    shutil.copytree(tree, copy, copy_function=shutil.copy)  # new mtimes, as a checkout or a plain copy gives
    moved, ran = plan(tmp_path, copy, m, env)
    assert ran == 0 and moved == {cmd.replace(str(tree), str(copy)): f for cmd, f in first.items()}
    gen = copy / CK_DIR / "generate.py"
    gen.write_text(gen.read_text().replace("(64, 128)", "(64, 96, 128)"))
    grown, ran = plan(tmp_path, copy, m, env)
    assert ran == 3 and any("fmha_fwd_d96_fp16_gfx9" in files for files in grown.values())
    again, ran = plan(tmp_path, tree, m, env)  # the original tree, unedited: its listings are its own again
    assert ran == 3 and again == first


def test_a_place_hides_the_root_only_where_a_path_starts_with_it() -> None:
    place = genread.Place("/w/tree", "/real/tree")
    hidden = place.hide("/w/tree/ck/generate.py")
    assert hidden == genread.TREE + "/ck/generate.py" and place.show(hidden) == "/w/tree/ck/generate.py"
    assert place.hide("/w/tree2/x") == "/w/tree2/x" and place.hide("/real/tree/x", real=True) == genread.TREE + "/x"
    assert place.show(genread.TREE + "/x", real=True) == "/real/tree/x"
    assert place.value("/w/tree/hsa/") == genread.TREE + "/hsa/"
    assert place.value("a:/w/tree/b;/w/tree") == f"a:{genread.TREE}/b;{genread.TREE}"
    assert place.value("/x/w/tree/b") == "/x/w/tree/b" and place.value("/w/treeish") == "/w/treeish"


def test_bytecode_another_python_writes_into_the_tree_is_no_input(tmp_path: Path) -> None:
    """An interpreter with bytecode on (the ROCm 7 chroot's, a user's) that imports the generator's
    modules writes ``__pycache__`` beside them: derived from the sources the key already holds, so the
    listings stay valid (each plan of the suite's trees listed again after such a write)."""
    tree, m, env = setup(tmp_path)
    ck = tree / CK_DIR
    gen = ck / "generate.py"
    gen.write_text("import codegen.ops  # as CK's does: its modules beside it\n" + gen.read_text())
    first, ran = plan(tmp_path, tree, m, env)
    assert ran == 3
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(ck)], check=True, env={"PATH": os.environ["PATH"]})
    assert (ck / "__pycache__").is_dir()  # beside the generator, in the directory its imports list
    again, ran = plan(tmp_path, tree, m, env)
    assert ran == 0 and again == first


def test_a_listing_another_qola_is_running_is_waited_for_not_run_again(tmp_path: Path) -> None:
    """Two plans of one tree side by side (two builds of a manifest, test workers): the second waits
    for the first's listing of a command (one ``flock`` per key in the cache dir) and takes its entry,
    instead of running the generator beside it. The test plays the first: it holds the keys' locks,
    sees the second say that it waits, stores the entries and lets go."""
    tree, m, env = setup(tmp_path)
    _, ran = plan(tmp_path, tree, m, env)  # the entries the first would write (their names: the keys)
    assert ran == 3
    made = entries(tmp_path)
    second = tmp_path / "second" / "qola" / "listings"
    second.mkdir(parents=True, mode=0o700)
    locks = [os.open(second / f"{e.stem}.lock", os.O_RDWR | os.O_CREAT, 0o600) for e in made]
    for fd in locks:
        fcntl.flock(fd, fcntl.LOCK_EX)
    waiter = subprocess.Popen(
        qola_command("plan", "--json", "-m", str(m), "-a", str(tree)),
        env={**os.environ, **env, "XDG_CACHE_HOME": str(tmp_path / "second")},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        said: list[str] = []
        while not any("waiting for the listing of" in line for line in said):
            line = waiter.stderr.readline() if waiter.stderr else ""
            if not line:  # it ended (or closed stderr) without waiting
                break
            said.append(line)
        assert any("another qola is running" in line for line in said), "".join(said)
        for e in made:  # the first's entries, stored as it stores them (0600, its own)
            shutil.copy(e, second / e.name)
            (second / e.name).chmod(0o600)
    finally:
        for fd in locks:
            os.close(fd)
        out, err = waiter.communicate(timeout=600)
    assert waiter.returncode == 0, err
    assert listings(tmp_path) == 3  # the second ran no generator: it took the first's listings
    files = {g["command"]: g["files"] for g in json.loads(out)["modules"][0]["generators"]}
    assert all(files.values())
