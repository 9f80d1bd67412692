"""Issue 11, publish/audit slice: every written path stays inside its root, no glob over names from
input, all-or-nothing publish (SIGKILL mid-publish), a whole-output audit, stale temporaries of
killed runs cleaned."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support.common import KERNELS, run_qola
from support.reports import fake_report

from qola.compile import codegen
from qola.core.errors import QolaError
from qola.output.publish import Contents, publish
from qola.plan.planner import Generator

NVCC = shutil.which("nvcc")


def sha(p: Path) -> str:
    return hashlib.sha256(Path(p).read_bytes()).hexdigest()


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def outside_files(tmp: Path, roots: list[Path]) -> list[Path]:
    return [p for p in tmp.rglob("*") if p.is_file() and not any(r == p or r in p.parents for r in roots)]


# -- item 1: paths stay inside their root ---------------------------------------------------------


def test_inside_refuses_escapes(tmp_path: Path) -> None:
    from qola.core.fsutil import inside

    root = tmp_path / "root"
    root.mkdir()
    assert inside(root, "lib", "a.so") == root / "lib" / "a.so"
    assert inside(root, "jit/m/src") == root / "jit" / "m" / "src"
    for bad in ("../x", "lib/../../x", "/etc/passwd", "a\0b", "..", ".", ""):
        with pytest.raises(QolaError, match="refusing"):
            inside(root, "lib", bad)
    (root / "link").symlink_to(tmp_path)  # a symlink inside the root that leads out of it
    with pytest.raises(QolaError, match="outside"):
        inside(root, "link", "x")


def test_publish_refuses_module_names_that_leave_out(tmp_path: Path) -> None:
    """A module key with ../ made publish write its log outside OUT."""
    out = tmp_path / "deep" / "out"
    report = fake_report(tmp_path, [("../../../escape", "qk_ok", "failed", None)])
    with pytest.raises(QolaError, match="refusing"):
        publish(report, out)
    assert not (tmp_path / "escape.log").exists()
    assert outside_files(tmp_path, [tmp_path / "b"]) == []  # nothing written anywhere
    for texts, trees in (({"../../x.txt": "x"}, None), (None, {"jit/../../x": tmp_path / "b"})):
        with pytest.raises(QolaError, match="refusing"):
            publish(fake_report(tmp_path, [("m", "qk_m", "built", b"lib")]), out, Contents(texts=texts, trees=trees))
    assert not (tmp_path / "x.txt").exists() and not (tmp_path / "deep" / "x").exists()


def test_codegen_refuses_a_module_key_that_leaves_the_build_dir(tmp_path: Path) -> None:
    gen_root = tmp_path / "build" / "gen"
    script = tmp_path / "gen.py"
    script.write_text("import sys, pathlib; pathlib.Path(sys.argv[2], 'a.cu').write_text('x')\n")
    job = codegen.GenJob("../../../escaped", (Generator(f"{script} --output_dir {{}}"),))
    with pytest.raises(QolaError, match="refusing"):
        codegen.run_generators(job, gen_root, env=dict(os.environ))
    assert not (tmp_path / "escaped").exists() and not gen_root.exists()


@pytest.mark.slow
@pytest.mark.skipif(NVCC is None, reason="needs nvcc")
def test_table_md_name_with_dotdot_writes_nothing_outside(tmp_path: Path) -> None:
    """A module table md_name of '../../../../evil' made the build write a linked .so, a log and a
    version file outside OUT and the build dir."""
    tree = tmp_path / "kernels"
    shutil.copytree(KERNELS, tree, ignore=shutil.ignore_patterns("hsa"))
    table = tree / "aiter" / "jit" / "optCompilerConfig.json"
    data = json.loads(table.read_text())
    data["module_softmax"]["md_name"] = "'../../../../evil'"
    table.write_text(json.dumps(data, indent=1))
    m = tmp_path / "q.toml"
    m.write_text(
        '[qola]\nnamespace = "qk"\n[build]\narchitectures = ["sm_90"]\n\n[[modules]]\nname = "module_softmax"\n'
    )
    base = tmp_path / "a" / "b" / "c"
    proc = run_qola(
        "build",
        "--manifest",
        str(m),
        "--aiter-root",
        str(tree),
        "-o",
        str(base / "out"),
        "--build-dir",
        str(base / "out.build"),
        "-j",
        "2",
    )
    assert proc.returncode in (1, 2) and "Traceback" not in proc.stderr, proc.stderr
    lock = base / ".out.qola.lock"  # the build's lock beside OUT (qola.core.lock), if any
    assert outside_files(tmp_path, [tree, m, base / "out", base / "out.build", lock]) == []


# -- item 5: never glob with names from input -----------------------------------------------------


def test_md_name_star_does_not_delete_a_sibling_library(tmp_path: Path) -> None:
    out = tmp_path / "out"
    publish(fake_report(tmp_path, [("a", "qk_a", "built", b"A1"), ("star", "*", "built", b"S1")]), out)
    report = fake_report(tmp_path, [("a", "qk_a", "built", b"A2"), ("star", "*", "failed", None)])
    publish(report, out)
    assert (out / "lib" / "qk_a.so").read_bytes() == b"A2"
    data = json.loads((out / "manifest.json").read_text())
    mods = {m["name"]: m for m in data["modules"]}
    assert mods["a"]["sha256"] == hashlib.sha256(b"A2").hexdigest()
    assert mods["star"]["status"] == "failed" and mods["star"]["artifact"] is None
    assert sorted(p.name for p in (out / "lib").iterdir()) == ["qk_a.so"]  # the failed module's is gone


def test_failed_module_artifact_not_in_new_version_previous_kept(tmp_path: Path) -> None:
    out = tmp_path / "out"
    prev = out / ".qola" / "prev"
    publish(fake_report(tmp_path, [("a", "qk_a", "built", b"A1"), ("b", "qk_b", "built", b"B1")]), out)
    publish(fake_report(tmp_path, [("a", "qk_a", "built", b"A1"), ("b", "qk_b", "failed", None)]), out)
    assert sorted(p.name for p in (out / "lib").iterdir()) == ["qk_a.so"]
    assert (prev / "lib" / "qk_b.so").read_bytes() == b"B1"  # the previous version stays until the next
    assert os.stat(prev / "lib" / "qk_a.so").st_ino != os.stat(out / "lib" / "qk_a.so").st_ino  # a copy, no link
    publish(fake_report(tmp_path, [("a", "qk_a", "built", b"A3"), ("b", "qk_b", "built", b"B3")]), out)
    assert not (prev / "lib" / "qk_b.so").exists() and (prev / "lib" / "qk_a.so").read_bytes() == b"A1"
    assert sorted(p.name for p in (out / ".qola").iterdir()) == ["prev", "switch.lock"]


def test_output_of_an_older_layout_is_replaced_and_foreign_dirs_refused(tmp_path: Path) -> None:
    legacy = tmp_path / "legacy"  # real dirs and a manifest.json, as qola wrote before versions
    (legacy / "lib").mkdir(parents=True)
    (legacy / "lib" / "qk_old.so").write_bytes(b"old")
    (legacy / "manifest.json").write_text('{"qola_version": "0.1.0", "modules": []}')
    publish(fake_report(tmp_path, [("a", "qk_a", "built", b"A")]), legacy)
    assert not (legacy / "lib").is_symlink() and sorted(p.name for p in (legacy / "lib").iterdir()) == ["qk_a.so"]
    assert not (legacy / "manifest.json").is_symlink()
    assert (legacy / ".qola" / "prev" / "lib" / "qk_old.so").read_bytes() == b"old"
    foreign = tmp_path / "foreign"
    (foreign / "lib").mkdir(parents=True)
    (foreign / "lib" / "mine.so").write_bytes(b"user data")
    with pytest.raises(QolaError, match="qola did not publish"):
        publish(fake_report(tmp_path, [("a", "qk_a", "built", b"A")]), foreign)
    assert (foreign / "lib" / "mine.so").read_bytes() == b"user data"


# -- item 5 (issue list): stale staging dirs and listings of killed runs --------------------------


def test_stale_staging_and_listings_are_removed(tmp_path: Path) -> None:
    from qola.output.publish import prepare

    dead, live = dead_pid(), os.getpid()
    gen = tmp_path / "b" / "gen" / "module_x"
    for name in (f".staging-{dead}", f".old-{dead}", f".staging-{live}"):
        (gen / name).mkdir(parents=True)
        (gen / name / "inst.cu").write_text("x")
    out = tmp_path / "out"
    (out / ".qola" / f".stage-{dead}-abc" / "lib").mkdir(parents=True)
    (out / ".qola" / f".stage-{live}-abc").mkdir()
    jit_out = tmp_path / "b" / "jit-out"  # fsutil.replace_tree's staging and aside dirs
    for name in (f".te_libx.stage-{dead}", f".te_libx.old-{dead}", f".te_libx.stage-{live}"):
        (jit_out / name).mkdir(parents=True)
    listing = Path(os.environ.get("TMPDIR", "/tmp")) / f"qola-list-{dead}-test{os.getpid()}"
    listing.mkdir()
    try:
        notes = prepare(out, tmp_path / "b")
        assert sorted(p.name for p in jit_out.iterdir()) == [f".te_libx.stage-{live}"]
        assert not (gen / f".staging-{dead}").exists() and not (gen / f".old-{dead}").exists()
        assert (gen / f".staging-{live}").is_dir() and (out / ".qola" / f".stage-{live}-abc").is_dir()
        assert not (out / ".qola" / f".stage-{dead}-abc").exists() and not listing.exists()
        text = "\n".join(notes)
        assert "generator staging" in text and f".staging-{dead}" in text
        assert "publish staging" in text and "generator listing" in text and "JIT staging" in text
    finally:
        shutil.rmtree(listing, ignore_errors=True)


def test_publish_killed_mid_switch_is_completed_by_the_audit(tmp_path: Path) -> None:
    """A switch killed after its commit (``.qola/next`` renamed in, lib/ swapped, the rest not): the
    next qola command, here the audit, completes it before reading; stray entries are noted."""
    from qola.core import fsutil
    from qola.output import outdir

    out = tmp_path / "out"
    publish(fake_report(tmp_path, [("a", "qk_a", "failed", None)]), out)
    orig = fsutil.exchange
    calls: list[Any] = []

    def killed(a: Any, b: Any) -> bool:  # the process dies after swapping lib/
        if len(calls) == 1:
            raise KeyboardInterrupt
        calls.append(b)
        return orig(a, b)

    fsutil.exchange = killed
    try:
        with pytest.raises(KeyboardInterrupt):
            publish(fake_report(tmp_path, [("a", "qk_a", "built", b"A2")]), out)
    finally:
        fsutil.exchange = orig
    assert outdir.interrupted(out) and (out / "lib" / "qk_a.so").read_bytes() == b"A2"
    assert json.loads((out / "manifest.json").read_text())["modules"][0]["status"] == "failed"  # not yet new
    (out / "stray.txt").write_text("x")
    proc = run_qola("audit", str(out))
    assert not outdir.interrupted(out)
    assert json.loads((out / "manifest.json").read_text())["modules"][0]["status"] == "built"
    assert "qk_a.so" in proc.stderr and "ELF" in proc.stderr  # audited the new version (fake bytes: not ELF)
    from qola.output.checks import audit_output

    assert any("stray.txt is not part of qola's output" in n for n in audit_output(out)[2])


def test_listing_dir_carries_the_pid() -> None:
    from qola.core.fsutil import pid_tempdir

    with pid_tempdir(codegen.LISTING_PREFIX) as d:
        assert Path(d).name.startswith(f"{codegen.LISTING_PREFIX}{os.getpid()}-")


# -- real builds: the audit and SIGKILL during publish --------------------------------------------

MANIFEST = (
    '[qola]\nnamespace = "qk"\n[build]\narchitectures = ["sm_90"]\n\n[[modules]]\nname = "module_rmsnorm"\n'
    '\n[[modules]]\nname = "module_softmax"\n'
)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path, Path]:
    if NVCC is None:
        pytest.skip("needs nvcc")
    tmp = tmp_path_factory.mktemp("harden")
    tree = tmp / "kernels"
    shutil.copytree(KERNELS, tree, ignore=shutil.ignore_patterns("hsa"))
    m = tmp / "q.toml"
    m.write_text(MANIFEST)
    out = tmp / "out"
    proc = run_qola("build", "--manifest", str(m), "--aiter-root", str(tree), "-o", str(out), "-j", "2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return tmp, tree, m, out


def copy_out(out: Path, dst: Path) -> Path:
    shutil.copytree(out, dst, symlinks=True)
    return dst


@pytest.mark.slow
def test_audit_checks_the_whole_output(built: tuple[Path, Path, Path, Path], tmp_path: Path) -> None:
    _, _, _, out = built
    proc = run_qola("audit", str(out))
    assert proc.returncode == 0, proc.stderr
    # an extra library in lib/
    o = copy_out(out, tmp_path / "extra")
    shutil.copy(o / "lib" / "qk_module_rmsnorm.so", o / "lib" / "qk_module_extra.so")
    proc = run_qola("audit", str(o))
    assert proc.returncode == 1 and "lib/qk_module_extra.so" in proc.stderr, proc.stdout + proc.stderr
    # garbage in jit/
    o = copy_out(out, tmp_path / "jit")
    (o / "jit" / "junk").mkdir(parents=True, exist_ok=True)
    (o / "jit" / "junk" / "index.json").write_text("{}")
    proc = run_qola("audit", str(o))
    assert proc.returncode == 1 and "jit/junk/index.json" in proc.stderr, proc.stdout + proc.stderr
    # a module marked skipped: its library goes unchecked otherwise
    o = copy_out(out, tmp_path / "skipped")
    path = o / "manifest.json"
    data = json.loads(path.read_text())
    data["modules"][0]["status"] = "skipped"
    path.write_text(json.dumps(data))
    proc = run_qola("audit", str(o))
    assert proc.returncode == 1 and "skipped" in proc.stderr, proc.stdout + proc.stderr
    # a failed module: a problem unless --allow-failed; its library must be gone either way
    o = copy_out(out, tmp_path / "failed")
    path = o / "manifest.json"
    data = json.loads(path.read_text())
    mod = data["modules"][1]
    mod.update(status="failed", artifact=None, success=False, so_path=None, error="x")
    path.write_text(json.dumps(data))
    proc = run_qola("audit", str(o), "--allow-failed")
    lib = f"lib/{mod['md_name']}.so"
    assert proc.returncode == 1 and f"status failed but its library {lib} is present" in proc.stderr, proc.stderr
    (o / lib).unlink()
    del data["files"][lib]
    path.write_text(json.dumps(data))
    assert run_qola("audit", str(o), "--allow-failed").returncode == 0
    proc = run_qola("audit", str(o))
    assert proc.returncode == 1 and "failed to build" in proc.stderr
    # a FIFO in the output is reported, never opened
    o = copy_out(out, tmp_path / "fifo")
    os.mkfifo(o / "include" / "pipe.h")
    proc = run_qola("audit", str(o))
    assert proc.returncode == 1 and "pipe.h" in proc.stderr


DRIVER = r"""
import os, signal, sys
out, events, kill_at = os.path.realpath(sys.argv[1]), sys.argv[2], int(sys.argv[3])
real = {"replace": os.replace, "rename": os.rename}

def killing(name):
    def op(src, dst, *a, **k):
        result = real[name](src, dst, *a, **k)
        d = os.path.abspath(os.fspath(dst))
        if d == out or d.startswith(out + os.sep):
            with open(events, "a") as f:
                f.write(d + "\n")
            with open(events) as f:
                if len(f.read().splitlines()) >= kill_at:  # the kill_at-th step into OUT is done: SIGKILL
                    os.killpg(os.getpgid(0), signal.SIGKILL)  # the whole group, as a user's kill -9 would
        return result
    return op

os.replace, os.rename = killing("replace"), killing("rename")
from qola.core import fsutil
real["exchange"] = fsutil.exchange
fsutil.exchange = killing("exchange")  # the publish's per-directory swaps are kill points too
from qola.cli import main
sys.exit(main(sys.argv[4:]))
"""


def consistent(out: Path) -> dict[str, str]:
    """OUT as a reader sees it: manifest.json agrees with every library; {library: sha256}."""
    proc = run_qola("audit", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads((out / "manifest.json").read_text())
    libs = {p.name: sha(p) for p in (out / "lib").iterdir() if p.is_file()}
    assert libs == {Path(m["artifact"]).name: m["sha256"] for m in data["modules"]}
    return libs


@pytest.mark.slow
def test_sigkill_during_publish_leaves_old_or_new(built: tuple[Path, Path, Path, Path], tmp_path: Path) -> None:
    tmp, tree, m, out = built
    old = consistent(out)
    dead = dead_pid()
    stale = tmp / "out.build" / "gen" / "module_rmsnorm" / f".staging-{dead}"
    stale.mkdir(parents=True)
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    events = tmp_path / "events"
    argv = ["build", "--manifest", str(m), "--aiter-root", str(tree), "-o", str(out), "-j", "2"]
    env = {**os.environ, "QK_RMSNORM_USE_RSQRT": "0"}  # rebuilds rmsnorm with other code
    seen, new, logs = [], None, []
    for k in range(1, 40):  # the k-th rename/exchange into OUT is followed by a SIGKILL of the build
        events.write_text("")
        log = tmp_path / f"run{k}.log"
        logs.append(log)
        with open(log, "w") as fh:
            proc = subprocess.Popen(
                [sys.executable, str(driver), str(out), str(events), str(k), *argv],
                env=env,
                stdout=fh,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            proc.wait(timeout=300)  # a hang guard, never a speed check
        if proc.returncode == -signal.SIGKILL:
            assert len(events.read_text().splitlines()) == k, log.read_text()
            libs = consistent(out)  # after every kill: the whole old or the whole new version
            seen.append(libs)
            continue
        assert proc.returncode == 0, log.read_text()
        assert len(events.read_text().splitlines()) < k  # finished before its k-th step: every step was a kill point
        new = consistent(out)
        break
    assert new is not None and new["qk_module_rmsnorm.so"] != old["qk_module_rmsnorm.so"]
    assert all(libs in (old, new) for libs in seen), seen
    assert seen, "never killed mid-publish"
    assert not stale.exists() and f".staging-{dead}" in logs[0].read_text()
    assert not [p for p in (out / ".qola").iterdir() if p.name.startswith(".")]
    assert sorted(p.name for p in (out / ".qola").iterdir()) == ["prev", "switch.lock"]
