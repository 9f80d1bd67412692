"""Issue 21 item 2: an output layout consumers can copy (real dirs of real files, switched whole),
and manifest.json with QoLA's fields. A SIGKILL at every step of a publish leaves the old or the
new output (rolled forward by the next qola command); a failed publish changes nothing."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.reports import publish_version, report

from qola.core.errors import QolaError
from qola.output import outdir
from qola.output.checks import audit_output, check_files
from qola.output.publish import ENTRIES, MANIFEST_JSON, Contents, generated_at, publish
from qola.store import fastpath

CMAKE = shutil.which("cmake")


def snapshot(root: Path) -> dict[str, tuple[str, str]]:
    """Every entry under ``root`` (not following links): relative path -> (kind, sha256 or link)."""
    found = {}
    for d, dirs, files in os.walk(root):
        for name in dirs + files:
            p = Path(d) / name
            rel = p.relative_to(root).as_posix()
            st = os.lstat(p)
            if stat.S_ISLNK(st.st_mode):
                found[rel] = ("link", os.readlink(p))
            elif stat.S_ISDIR(st.st_mode):
                found[rel] = ("dir", "")
            else:
                found[rel] = ("file", hashlib.sha256(p.read_bytes()).hexdigest())
    return found


def published(out: Path) -> dict[str, tuple[str, str]]:
    """OUT's published entries only (not .qola)."""
    return {k: v for k, v in snapshot(out).items() if k.split("/")[0] in ENTRIES}


def entry(snap: dict[str, Any], name: str) -> dict[str, Any]:
    return {k: v for k, v in snap.items() if k == name or k.startswith(name + "/")}


# -- the layout ------------------------------------------------------------------------------------


def test_entries_are_real_dirs_of_real_files_never_links(tmp_path: Path) -> None:
    out = tmp_path / "out"
    publish_version(tmp_path, out, "v1")
    publish_version(tmp_path, out, "v2")
    for name in ENTRIES:
        st = os.lstat(out / name)
        assert (stat.S_ISREG if name == MANIFEST_JSON else stat.S_ISDIR)(st.st_mode), name
    assert not [p for p in out.rglob("*") if p.is_symlink()]
    assert not os.path.lexists(out / "current")
    # every published file is its own copy: nothing hard-linked to the previous version or the build dir
    files = [p for p in out.rglob("*") if p.is_file() and outdir.STORE not in p.relative_to(out).parts]
    assert files and all(os.stat(p).st_nlink == 1 for p in files)
    assert (out / "lib" / "qk_a.so").read_bytes() == b"A-v2" * 100
    # the previous version is kept whole beside it, the one before that is gone
    assert (out / ".qola" / "prev" / "lib" / "qk_a.so").read_bytes() == b"A-v1" * 100
    assert sorted(p.name for p in (out / ".qola").iterdir()) == ["prev", "switch.lock"]
    data = json.loads((out / MANIFEST_JSON).read_text())
    assert check_files(out, data["files"]) == (len(data["files"]), [])


def test_an_in_place_edit_of_a_published_file_changes_no_other_copy(tmp_path: Path) -> None:
    out = tmp_path / "out"
    publish_version(tmp_path, out, "v1")
    publish_version(tmp_path, out, "v1")  # same bytes: still copies
    with open(out / "lib" / "qk_a.so", "r+b") as fh:  # an in-place edit (as patchelf or strip may do)
        fh.write(b"XX")
    assert (out / ".qola" / "prev" / "lib" / "qk_a.so").read_bytes() == b"A-v1" * 100
    assert (tmp_path / "b" / "lib" / "qk_a.so").read_bytes() == b"A-v1" * 100
    publish_version(tmp_path, out, "v1")
    assert (out / "lib" / "qk_a.so").read_bytes() == b"A-v1" * 100  # the next publish copies from the build


@pytest.mark.skipif(CMAKE is None, reason="needs cmake")
def test_cmake_file_copy_and_glob_give_real_headers_and_libraries(tmp_path: Path) -> None:
    """What TE's CMake does with QoLA's output: file(COPY <out>/include …) and file(GLOB <out>/lib/*.so)."""
    out = tmp_path / "out"
    publish_version(tmp_path, out, "v1")
    publish_version(tmp_path, out, "v2")
    cache = tmp_path / "cache"
    script = tmp_path / "consume.cmake"
    script.write_text(f"""
file(COPY "{out}/include" DESTINATION "{cache}")
file(COPY "{out}/lib" DESTINATION "{cache}")
file(GLOB libs "{out}/lib/*.so")
list(LENGTH libs n)
message(STATUS "libs=${{n}}")
foreach(lib IN LISTS libs)
  if(IS_SYMLINK "${{lib}}")
    message(FATAL_ERROR "${{lib}} is a symlink")
  endif()
endforeach()
if(NOT EXISTS "{cache}/include/qola_mha_fwd.h" OR IS_SYMLINK "{cache}/include")
  message(FATAL_ERROR "Could not find QoLA public headers")
endif()
""")
    assert CMAKE is not None
    proc = subprocess.run([CMAKE, "-P", str(script)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "libs=2" in proc.stdout + proc.stderr
    assert not (cache / "include").is_symlink() and (cache / "include" / "qola_mha_fwd.h").read_text().endswith("v2\n")
    for name in ("qk_a.so", "qk_b.so"):
        p = cache / "lib" / name
        assert not p.is_symlink() and p.read_bytes() == (out / "lib" / name).read_bytes()


def test_cp_r_and_tar_round_trip_give_a_whole_output(tmp_path: Path) -> None:
    out = tmp_path / "out"
    publish_version(tmp_path, out, "v1")
    publish_version(tmp_path, out, "v2")
    data = json.loads((out / MANIFEST_JSON).read_text())
    copy = tmp_path / "copy"
    subprocess.run(["cp", "-r", str(out), str(copy)], check=True)
    assert not [p for p in copy.rglob("*") if p.is_symlink()]
    assert check_files(copy, data["files"])[1] == []
    assert published(copy) == published(out)
    archive = tmp_path / "out.tar"
    with tarfile.open(archive, "w") as tar:
        for name in ENTRIES:
            tar.add(out / name, arcname=name)
    unpacked = tmp_path / "unpacked"
    with tarfile.open(archive) as tar:
        tar.extractall(unpacked, filter="tar")
    assert published(unpacked) == published(out) and check_files(unpacked, data["files"])[1] == []


def test_a_failed_publish_leaves_the_output_byte_identical(tmp_path: Path) -> None:
    out = tmp_path / "out"
    publish_version(tmp_path, out, "v1")
    publish_version(tmp_path, out, "v2")
    before = published(out)
    rep, headers, texts = report(tmp_path, "v3", {"a": b"A3", "b": b"B3"})
    missing = tmp_path / "b" / "include" / "gone.h"  # a header that vanished: fails mid-fill
    with pytest.raises(FileNotFoundError):
        publish(rep, out, Contents(headers=[*headers, missing], texts=texts))
    assert published(out) == before
    with pytest.raises(QolaError, match="refusing"):
        publish(rep, out, Contents(headers=headers, texts={"../escape": "x"}))
    assert published(out) == before and not (tmp_path / "escape").exists()
    assert not [p for p in (out / ".qola").iterdir() if p.name.startswith(outdir.STAGE)]


def test_symlink_layout_of_an_older_qola_is_converted(tmp_path: Path) -> None:
    out = tmp_path / "out"
    v1 = out / ".qola" / "v1"
    for d in outdir.DIRS:
        (v1 / d).mkdir(parents=True)
    (v1 / "lib" / "qk_old.so").write_bytes(b"old")
    (v1 / MANIFEST_JSON).write_text('{"namespace": "qk", "modules": [], "files": {}}')
    (out / "current").symlink_to(".qola/v1")
    for name in ENTRIES:
        (out / name).symlink_to(f"current/{name}")
    _, problems, notes = audit_output(out)
    assert "files: lib/qk_old.so is not recorded in manifest.json" in problems
    assert notes[0].endswith("(the next build converts it)")
    publish_version(tmp_path, out, "v2")
    assert not os.path.lexists(out / "current") and not v1.exists()
    assert all(not (out / n).is_symlink() for n in ENTRIES)
    assert sorted(p.name for p in (out / "lib").iterdir()) == ["pkgconfig", "qk_a.so", "qk_b.so"]


def test_foreign_dirs_are_refused_and_other_entries_left_alone(tmp_path: Path) -> None:
    foreign = tmp_path / "foreign"
    (foreign / "lib").mkdir(parents=True)
    (foreign / "lib" / "mine.so").write_bytes(b"user data")
    with pytest.raises(QolaError, match="qola did not publish"):
        publish_version(tmp_path, foreign, "v1")
    assert (foreign / "lib" / "mine.so").read_bytes() == b"user data" and not (foreign / ".qola").exists()
    # TE keeps its kernel tree inside the output dir: never touched, never audited
    out = tmp_path / "out"
    (out / "third_party" / "aiter").mkdir(parents=True)
    (out / "third_party" / "aiter" / "setup.py").write_text("x")
    publish_version(tmp_path, out, "v1")
    publish_version(tmp_path, out, "v2")
    assert (out / "third_party" / "aiter" / "setup.py").read_text() == "x"
    _, problems, notes = audit_output(out)
    assert not [p for p in problems if "layout" in p or "files:" in p], problems
    assert any("third_party is not part of qola's output" in n for n in notes)
    assert all("third_party" not in f for f in fastpath.published_files(out))
    assert all(f"{os.sep}.qola{os.sep}" not in f for f in fastpath.published_files(out))


def test_a_projects_own_manifest_json_is_not_taken_for_qolas(tmp_path: Path) -> None:
    """Any project may have a manifest.json beside lib/ and include/: `qola build -o` there is refused
    before anything is written (issue 23: it used to exit 0 and delete the project's files)."""
    from support.common import KERNELS, run_qola

    project = tmp_path / "project"
    for rel, data in {
        "manifest.json": b'{"name": "my-app", "version": "1.0"}',
        "lib/libmine.so": b"mine",
        "include/mine.h": b"int mine;",
        "logs/today.log": b"log",
    }.items():
        (project / rel).parent.mkdir(parents=True, exist_ok=True)
        (project / rel).write_bytes(data)
    before = snapshot(project)
    mtimes = {p: p.stat().st_mtime_ns for p in project.rglob("*")}
    proc = run_qola(
        "build",
        "--manifest",
        str(KERNELS.parent / "quickstart.toml"),
        "--aiter-root",
        str(KERNELS),
        "-o",
        str(project),
        "--build-dir",
        str(tmp_path / "b"),
    )
    assert proc.returncode == 2, proc.stderr
    assert "qola did not publish" in proc.stderr and "not a qola build record" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert snapshot(project) == before and {p: p.stat().st_mtime_ns for p in project.rglob("*")} == mtimes
    assert sorted(p.name for p in tmp_path.iterdir()) == ["project"]  # no build dir, no lock file beside it
    # only a record of qola's shape is qola's (an output of a qola before versions has no .qola yet)
    (project / "manifest.json").write_text(json.dumps({"qola_version": "0.1.0"}))
    assert not outdir.recognised(project)
    (project / "manifest.json").write_text(json.dumps({"qola_version": "0.1.0", "modules": []}))
    assert outdir.recognised(project)
    (project / ".qola").write_text("")
    assert not outdir.recognised(project)


def test_tuned_configs_are_files_of_the_tree_never_links_out_fifos_or_devices(tmp_path: Path) -> None:
    """configs/*.csv are published for anyone to read: a link to a root-only file outside the tree, a
    FIFO (would block) or a link to /dev/zero (would fill the disk) is refused, the output unchanged
    (issue 23). A CSV linked to another file of the tree is published."""
    configs = tmp_path / "tree" / "aiter" / "configs"
    configs.mkdir(parents=True)
    (configs / "a8w8_tuned_gemm.csv").write_text("M,N,K\n1,2,3\n")
    (configs / "same.csv").symlink_to("a8w8_tuned_gemm.csv")
    out = tmp_path / "out"
    publish_version(tmp_path, out, "v1")
    assert (out / "configs" / "same.csv").read_text() == "M,N,K\n1,2,3\n"
    assert not (out / "configs" / "same.csv").is_symlink()
    before = published(out)
    secret = tmp_path / "secret.csv"
    secret.write_text("root:$6$hash\n")
    secret.chmod(0o600)
    cases: dict[str, Callable[[Path], object]] = {
        "leak.csv": lambda p: p.symlink_to(secret),
        "fifo.csv": lambda p: os.mkfifo(p),
        "zero.csv": lambda p: p.symlink_to("/dev/zero"),
    }
    for name, make in cases.items():
        make(configs / name)
        with pytest.raises(QolaError) as info:
            publish_version(tmp_path, out, "v2")
        assert name in str(info.value) or "FIFO" in str(info.value), (name, str(info.value))
        assert published(out) == before, name  # nothing of v2 reached OUT
        (configs / name).unlink()
    assert "secret" not in json.dumps(published(out))


def test_audit_reports_a_linked_or_replaced_entry(tmp_path: Path) -> None:
    out = tmp_path / "out"
    publish_version(tmp_path, out, "v1")
    shutil.move(out / "include", tmp_path / "elsewhere")
    (out / "include").symlink_to(tmp_path / "elsewhere")
    problems = audit_output(out)[1]
    assert any(p.startswith("layout:") and "include is a symlink" in p for p in problems), problems
    with pytest.raises(QolaError, match="symlink"):
        publish_version(tmp_path, out, "v2")


# -- manifest.json: QoLA's fields --------------------------------------------------------------------


def test_manifest_has_qolas_fields(tmp_path: Path) -> None:
    out = tmp_path / "out"
    rep, headers, texts = report(tmp_path, "v1", {"a": b"A", "b": None}, archs=("gfx942", "gfx950"))
    publish(rep, out, Contents(headers=headers, texts=texts, source_date_epoch="1700000000"))
    data = json.loads((out / MANIFEST_JSON).read_text())
    assert data["generated_at"] == "2023-11-14T22:13:20+00:00"
    assert data["gpu_archs"] == "gfx942;gfx950" and data["archs"] == ["gfx942", "gfx950"]
    assert data["summary"] == {"total": 2, "success": 1, "failed": 1}
    assert data["manifest_src"] == "/m/q.toml" and data["aiter_root"] == str(tmp_path / "tree")
    mods = {m["md_name"]: m for m in data["modules"]}
    assert mods["qk_a"]["success"] is True and mods["qk_a"]["error"] == ""
    assert mods["qk_a"]["so_path"] == "lib/qk_a.so" == mods["qk_a"]["artifact"]
    assert (out / mods["qk_a"]["so_path"]).read_bytes() == b"A"
    assert mods["qk_b"]["success"] is False and mods["qk_b"]["so_path"] is None and mods["qk_b"]["error"] == "boom"
    assert mods["qk_b"]["log"] == "logs/b.log" and "qk_b.so" not in os.listdir(out / "lib")
    # without SOURCE_DATE_EPOCH: now, in QoLA's form (UTC, ISO 8601 with the offset)
    from datetime import datetime, timezone

    stamp = datetime.fromisoformat(generated_at(None))
    assert stamp.tzinfo == timezone.utc and abs((datetime.now(timezone.utc) - stamp).total_seconds()) < 3600
    assert generated_at("not a number") != generated_at("1700000000")


# -- SIGKILL at every step of a publish --------------------------------------------------------------

DRIVER = r"""
import os, sys
events = sys.argv[4]
done = 0
try:
    sys.path.insert(0, sys.argv[1])
    from pathlib import Path
    from support.reports import publish_version
    from qola.core import fsutil

    tmp, out, kill_at, exchange = Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[5]), sys.argv[6]
    real = {"rename": os.rename, "replace": os.replace, "exchange": fsutil.exchange}
    count = [0]
    prefix = os.path.realpath(out) + os.sep

    def step(what, dst):
        if os.path.abspath(dst).startswith(prefix):
            count[0] += 1
            if count[0] == kill_at:
                with open(events, "w") as f:  # the FIFO: the test reads this, then kills us
                    f.write(f"{kill_at} {what} {dst}\n")
                os.read(os.open(events + ".never", os.O_RDONLY), 1)  # blocks: nobody writes it

    def wrap(name):
        def op(src, dst, *a, **k):
            result = real[name](src, dst, *a, **k)
            if result is not False:
                step(name, dst)
            return result
        return op

    os.rename, os.replace = wrap("rename"), wrap("replace")
    fsutil.exchange = wrap("exchange") if exchange == "1" else (lambda a, b: False)
    publish_version(tmp, out, "v2")
    done = count[0]
finally:
    with open(events, "w") as f:
        f.write(f"done {done}\n")
"""


@pytest.mark.parametrize("exchange", ["1", "0"], ids=["renameat2", "fallback"])
def test_sigkill_at_every_step_of_a_publish_leaves_old_or_new(tmp_path: Path, exchange: str) -> None:
    tests = Path(__file__).resolve().parents[1]  # tests/: the driver imports support.reports
    work = tmp_path / "w"
    out = tmp_path / "out"
    publish_version(work, out, "v2")
    new = published(out)  # what a finished v2 publish gives
    publish_version(work, out, "v1")
    old = published(out)
    assert all(entry(old, n) != entry(new, n) for n in ("lib", "include", "share", "logs", MANIFEST_JSON))
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    events = str(tmp_path / "events")
    os.mkfifo(events)
    os.mkfifo(events + ".never")
    kills, k = [], 0
    while True:
        k += 1
        proc = subprocess.Popen(
            [sys.executable, str(driver), str(tests), str(work), str(out), events, str(k), exchange],
            start_new_session=True,
            stderr=subprocess.PIPE,
            text=True,
        )
        with open(events) as fh:  # blocks until the driver reaches step k, or finishes
            line = fh.read().strip()
        if line.startswith("done"):
            _, stderr = proc.communicate(timeout=300)
            assert proc.returncode == 0 and line != "done 0", stderr
            break
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        kills.append(line)
        seen = published(out)
        # what any reader sees before qola runs again: each entry whole, from one version or the
        # other (with the fallback, possibly absent for a moment); once manifest.json is the new
        # one, every entry is
        for name in ENTRIES:
            got = entry(seen, name)
            assert got in (entry(old, name), entry(new, name)) or (not got and exchange == "0"), (line, name)
        if entry(seen, MANIFEST_JSON) == entry(new, MANIFEST_JSON):
            assert seen == new, line
        committed = outdir.interrupted(out)
        # the next qola command (here: the readers' lock, as the audit takes it) completes the switch
        with outdir.reading(out):
            now = published(out)
        assert now == (new if committed or seen == new else old), line
        assert not outdir.interrupted(out)
        publish_version(work, out, "v1")  # back to v1 for the next kill point
        assert published(out) == old
    steps = 3 + len(ENTRIES) * (1 if exchange == "1" else 3) + 1  # prev aside, record, commit, entries, prev
    assert len(kills) == steps == int(line.split()[1]), kills
    assert published(out) == new
    from qola.output.publish import prepare

    prepare(out, work / "b")  # stale staging of the killed runs removed
    assert sorted(p.name for p in (out / ".qola").iterdir()) == ["prev", "switch.lock"]


def test_the_next_build_or_jit_command_completes_a_killed_switch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from qola.core import fsutil
    from qola.jit.prebuild import find_jit_dirs
    from qola.output.publish import prepare

    for who in ("build", "jit"):
        out = tmp_path / who
        publish_version(tmp_path, out, "v1")
        publish_version(tmp_path / "ref", tmp_path / f"{who}-ref", "v2")
        real = fsutil.exchange
        calls: list[Any] = []

        def dies_after_two(a: Any, b: Any, real: Any = real, calls: list[Any] = calls) -> Any:
            if len(calls) == 2:
                raise KeyboardInterrupt  # as a SIGKILL would stop it: lib/ and include/ swapped
            calls.append(b)
            return real(a, b)

        monkeypatch.setattr(fsutil, "exchange", dies_after_two)
        with pytest.raises(KeyboardInterrupt):
            publish_version(tmp_path / "ref", out, "v2")
        monkeypatch.setattr(fsutil, "exchange", real)
        assert outdir.interrupted(out)
        assert entry(published(out), "lib") == entry(published(tmp_path / f"{who}-ref"), "lib")
        assert entry(published(out), "logs") != entry(published(tmp_path / f"{who}-ref"), "logs")
        if who == "build":
            assert any("completed the publish" in n for n in prepare(out, tmp_path / "b"))
        else:
            with pytest.raises(QolaError, match="no JIT modules"):
                find_jit_dirs(out)
        assert not outdir.interrupted(out)
        assert published(out) == published(tmp_path / f"{who}-ref")
