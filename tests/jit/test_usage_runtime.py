"""Recorded usage and the coverage contract in the C++ JIT runtime (host compiler, no GPU): the test
library of support/jit_lib.py (two units, a counting fake compiler) run with QOLA_USAGE_DIR and
QOLA_JIT_COVERAGE, its records read back by qola.store.usage.records."""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import threading
from pathlib import Path
from typing import cast

import pytest
from support.common import run_qola
from support.jit_lib import TestLib, build_runtime, expected, make_lib

from qola.jit import format as fmt
from qola.store.usage import records

E_COVERAGE = 9
N_PROCS = 16


@pytest.fixture(scope="module")
def jit_runtime(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return build_runtime(tmp_path_factory.mktemp("usage-runtime"))


@pytest.fixture
def lib(tmp_path: Path, jit_runtime: list[Path]) -> TestLib:
    return make_lib(tmp_path / "lib", jit_runtime)


def read_dir(d: Path) -> records.ReadResult:
    return records.read(records.record_files([d]))


def test_recording_writes_one_record_per_unit_and_process(lib: TestLib, tmp_path: Path) -> None:
    rec = tmp_path / "rec"
    proc = lib.run(1, 5, mode=("threads",), extra={fmt.ENV_USAGE_DIR: str(rec)})  # 16 threads, units 1 and 2
    assert proc.returncode == 0, proc.stderr
    files = list(rec.iterdir())
    assert len(files) == 1 and files[0].name.startswith(fmt.USAGE_PREFIX) and files[0].suffix == fmt.USAGE_SUFFIX
    got = read_dir(rec)
    assert got.bad_lines == 0
    assert sorted((r.module, r.md_name, r.unit, r.event) for r in got.records) == [
        ("tm", "tm", "unit_1", "compile"),
        ("tm", "tm", "unit_2", "compile"),
    ]
    assert all(r.pid > 0 and r.arch == "host" and r.build_key == "" for r in got.records)
    assert lib.run(1, 6, extra={fmt.ENV_USAGE_DIR: str(rec)}).returncode == 0  # a new process: from the cache
    events = sorted((r.unit, r.event) for r in read_dir(rec).records)
    assert events == [("unit_1", "cache"), ("unit_1", "compile"), ("unit_2", "compile")]
    assert len(list(rec.iterdir())) == 2  # one file per process


def test_without_the_setting_nothing_is_recorded(lib: TestLib, tmp_path: Path) -> None:
    assert lib.run(1, 5).returncode == 0
    assert not any(p.name.startswith(fmt.USAGE_PREFIX) for p in tmp_path.rglob("*"))


def test_strict_coverage_refuses_to_compile_and_names_the_manifest_line(lib: TestLib, tmp_path: Path) -> None:
    rec = tmp_path / "rec"
    proc = lib.run(1, 5, extra={fmt.ENV_COVERAGE: "strict", fmt.ENV_USAGE_DIR: str(rec)})
    assert proc.returncode == 3
    assert int(proc.stdout.split()[3]) == E_COVERAGE
    assert "variant unit_1 of module tm was not built ahead and is not in the JIT cache" in proc.stderr
    assert '{ module = "tm", name = "unit_1" },' in proc.stderr
    assert proc.stderr.count("qola-jit: coverage: variant unit_1") == 1  # said by the runtime itself, once
    assert lib.compiles() == 0
    assert [(r.unit, r.event) for r in read_dir(rec).records] == [("unit_1", "refused")]
    # once in the cache (a run without the contract), strict passes: no compile
    assert lib.run(1, 5).returncode == 0 and lib.compiles() == 1
    proc = lib.run(1, 7, extra={fmt.ENV_COVERAGE: "strict"})
    assert proc.returncode == 0 and proc.stdout.split()[1] == str(expected(1, 7)), proc.stderr
    assert lib.compiles() == 1


def test_an_unknown_coverage_value_fails_closed(lib: TestLib) -> None:
    proc = lib.run(1, 5, extra={fmt.ENV_COVERAGE: "stirct"})
    assert proc.returncode == 3 and int(proc.stdout.split()[3]) == E_COVERAGE
    assert "is not strict, report or off: taking it as strict" in proc.stderr
    assert lib.compiles() == 0


def test_report_coverage_compiles_and_reports_each_miss_once(lib: TestLib, tmp_path: Path) -> None:
    rec = tmp_path / "rec"
    proc = lib.run(1, 5, mode=("threads",), extra={fmt.ENV_COVERAGE: "report", fmt.ENV_USAGE_DIR: str(rec)})
    assert proc.returncode == 0, proc.stderr
    assert [int(v) for v in proc.stdout.split()] == [expected(1 + i % 2, 5) for i in range(16)]
    lines = [ln for ln in proc.stderr.splitlines() if "coverage:" in ln]
    assert len(lines) == 2, proc.stderr  # 16 threads, 2 units: each miss said once
    assert any('{ module = "tm", name = "unit_2" },' in ln for ln in lines)
    assert lib.compiles() == 2
    assert sorted((r.unit, r.event) for r in read_dir(rec).records) == [("unit_1", "compile"), ("unit_2", "compile")]
    proc = lib.run(2, 5, extra={fmt.ENV_COVERAGE: "report"})  # from the cache: no miss, nothing said
    assert proc.returncode == 0 and "coverage:" not in proc.stderr


def _worker(lib_path: str, env: dict[str, str], rec: str, barrier: threading.Barrier, i: int) -> int:
    os.environ.update(env)  # this child process only: the runtime reads its cache dir from the environment
    so = ctypes.CDLL(lib_path)
    so.qt_qola_usage_configure.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    assert so.qt_qola_usage_configure(rec.encode(), None) == 0  # the loader API, not the environment
    barrier.wait(timeout=120)  # all 16 resolve (and record) at once
    return cast("int", so.qt_call(1, i) * 1000 + so.qt_call(2, i))


def test_16_processes_record_concurrently_without_loss(lib: TestLib, tmp_path: Path) -> None:
    assert lib.run(1, 5).returncode == 0 and lib.run(2, 5).returncode == 0  # both units in the cache
    rec = tmp_path / "shared-rec"
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Manager().Barrier(N_PROCS)
    so = str(lib.caller.parent.parent / "lib" / "libqt.so")
    with ctx.Pool(N_PROCS) as pool:
        got = pool.starmap(_worker, [(so, lib.env, str(rec), barrier, i) for i in range(N_PROCS)])
    assert got == [expected(1, i) * 1000 + expected(2, i) for i in range(N_PROCS)]
    res = read_dir(rec)
    assert res.files == N_PROCS and res.bad_lines == 0
    assert sorted((r.pid, r.unit) for r in res.records) == sorted(
        (pid, u) for pid in {r.pid for r in res.records} for u in ("unit_1", "unit_2")
    )
    assert len({r.pid for r in res.records}) == N_PROCS
    assert {r.event for r in res.records} == {"cache"}
    assert lib.compiles() == 2


def test_configure_refuses_an_unknown_coverage_value(lib: TestLib) -> None:
    so = ctypes.CDLL(str(lib.caller.parent.parent / "lib" / "libqt.so"))
    so.qt_qola_usage_configure.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    assert so.qt_qola_usage_configure(None, b"sometimes") == -1
    assert so.qt_qola_usage_configure(None, b"report") == 0


def _fork_worker(lib_path: str, env: dict[str, str], rec: str) -> tuple[int, int]:
    os.environ.update(env)  # this child process only (see _worker)
    so = ctypes.CDLL(lib_path)
    so.qt_qola_usage_configure.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    so.qt_qola_usage_configure(rec.encode(), None)
    assert so.qt_call(1, 1) == expected(1, 1)
    child = os.fork()
    if child == 0:  # the forked child records into a file of its own
        os._exit(0 if so.qt_call(2, 1) == expected(2, 1) else 1)
    _, status = os.waitpid(child, 0)
    return os.getpid(), child if status == 0 else -1


def test_a_forked_child_records_into_its_own_file(lib: TestLib, tmp_path: Path) -> None:
    assert lib.run(1, 5).returncode == 0 and lib.run(2, 5).returncode == 0
    rec = tmp_path / "rec"
    so = str(lib.caller.parent.parent / "lib" / "libqt.so")
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        parent, child = pool.apply(_fork_worker, (so, lib.env, str(rec)))
    assert child > 0
    res = read_dir(rec)
    assert res.files == 2 and res.bad_lines == 0
    assert sorted((r.pid, r.unit) for r in res.records) == sorted([(parent, "unit_1"), (child, "unit_2")])


def test_a_shipped_prebuilt_variant_is_recorded_once_and_passes_strict(lib: TestLib, tmp_path: Path) -> None:
    """How an image records the variants it ships compiled (docs/usage.md, "What is recorded"):
    defer them and ship their entries in OUT/jit/prebuilt (``qola jit prebuild --prebuilt-dir``).
    Each resolves from there with event ``prebuilt``, one record per variant per process, whatever
    the number of calls, and the strict contract passes without compiling."""
    out = lib.root / "out"
    shipped = out / "jit" / fmt.PREBUILT
    proc = run_qola("jit", "prebuild", str(out), "--prebuilt-dir", str(shipped), env=lib.env)
    assert proc.returncode == 0, proc.stderr
    assert lib.compiles() == 2 and lib.entries() == []  # into the shipped dir, not the cache
    rec = tmp_path / "rec"
    fresh = {fmt.ENV_CACHE_DIR: str(tmp_path / "fresh"), fmt.ENV_COVERAGE: "strict", fmt.ENV_USAGE_DIR: str(rec)}
    proc = lib.run(0, 5, mode=("threads",), extra=fresh)  # 16 calls, 8 of each unit
    assert proc.returncode == 0, proc.stderr
    assert [int(v) for v in proc.stdout.split()] == [expected(1 + i % 2, 5) for i in range(16)]
    assert "coverage:" not in proc.stderr and lib.compiles() == 2
    assert not list((tmp_path / "fresh").glob("*.so"))
    got = read_dir(rec)
    assert got.files == 1 and got.bad_lines == 0
    assert sorted((r.unit, r.event) for r in got.records) == [("unit_1", fmt.PREBUILT), ("unit_2", fmt.PREBUILT)]
