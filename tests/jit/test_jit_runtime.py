"""The C++ JIT runtime, end to end: a library of stubs + table + runtime built by hand, a
caller process, and a counting fake compiler (g++ behind a shell script)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
from support.common import wait_for
from support.jit_lib import TestLib, build_runtime, expected, fake_compiler, make_lib

from qola.jit import key as jkey
from qola.jit.cache import JitCache

E_DISABLED, E_CACHE, E_COMPILE, E_SOURCE = 1, 3, 4, 6


@pytest.fixture(scope="session")
def jit_runtime(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return build_runtime(tmp_path_factory.mktemp("jit-runtime"))


@pytest.fixture
def lib(tmp_path: Path, jit_runtime: list[Path]) -> TestLib:
    return make_lib(tmp_path / "lib", jit_runtime)


def ok(proc: subprocess.CompletedProcess[str], n: int = 1, x: int = 5) -> None:
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["result", str(expected(n, x)), "status", "0"], proc.stdout + proc.stderr


def status_of(proc: subprocess.CompletedProcess[str]) -> int:
    return int(proc.stdout.split()[3])


def test_first_call_compiles_then_other_processes_hit_the_cache(lib: TestLib) -> None:
    ok(lib.run(1, 5))
    assert lib.compiles() == 1
    ok(lib.run(1, 6, extra={"QOLA_JIT_VERBOSE": "1"}), 1, 6)
    assert lib.compiles() == 1  # a new process: loaded from the cache
    # the entry is named by the key Python computes (same SHA-256, same definition)
    index = json.loads((lib.root / "out/jit/tm/index.json").read_text())
    unit = next(u for u in index["units"] if u["name"] == "unit_1")
    ident = jkey.probe_compiler(str(lib.compiler), lib.env).identity
    assert (lib.cache / f"{jkey.entry_key(unit['content_key'], ident)}.so").is_file()
    assert len(lib.entries()) == 1
    # second unit, a void function: its own compile, then cached
    proc = lib.run(2, 3, store=True)
    assert proc.stdout.split()[:2] == ["result", "2003"], proc.stderr
    assert lib.compiles() == 2
    assert all(JitCache(lib.cache).entry(p.stem).problem is None for p in lib.entries())


def test_32_processes_one_compile(lib: TestLib) -> None:
    (lib.root / "slow").write_text("1")  # keep the compile running while all 32 start
    procs = [lib.spawn(1, i) for i in range(32)]
    outs = [(p.wait(timeout=300), *p.communicate()) for p in procs]
    for i, (rc, out, err) in enumerate(outs):
        assert rc == 0, err
        assert out.split()[1] == str(expected(1, i))
    assert lib.compiles() == 1
    assert len(lib.entries()) == 1


def test_sigkill_during_compile_recovers(lib: TestLib) -> None:
    (lib.root / "slow").write_text("3")
    victim = lib.spawn(1, 5)
    assert wait_for(lambda: lib.compiles() == 1), "the compiler never started"
    victim.send_signal(signal.SIGKILL)
    victim.wait(timeout=30)
    (lib.root / "slow").unlink()
    assert lib.entries() == []  # nothing published by the killed compile
    ok(lib.run(1, 5))  # the dead holder's lock is gone: compiles once, no deadlock
    assert lib.compiles() == 2
    # the orphaned compiler of the killed process finishes later: it must not break the entry
    orphan = int((lib.root / "count").read_text().split()[0])
    wait_for(lambda: not Path(f"/proc/{orphan}").exists(), 60)
    cache = JitCache(lib.cache)
    assert [cache.entry(p.stem).problem for p in lib.entries()] == [None]
    ok(lib.run(1, 5))
    assert lib.compiles() == 2


@pytest.mark.parametrize("damage", ["truncate", "bitflip", "no-meta", "wrong-key"])
def test_damaged_entry_is_detected_and_rebuilt(lib: TestLib, damage: str) -> None:
    ok(lib.run(1, 5))
    so = lib.entries()[0]
    meta = so.with_suffix(".meta")
    data = bytearray(so.read_bytes())
    if damage == "truncate":
        so.write_bytes(data[: len(data) // 2])
    elif damage == "bitflip":
        data[len(data) // 2] ^= 0x10
        so.write_bytes(data)
    elif damage == "no-meta":
        meta.unlink()
    else:
        meta.write_text(meta.read_text().replace(so.stem, "0" * 64))
    ok(lib.run(1, 5))
    assert lib.compiles() == 2
    assert JitCache(lib.cache).entry(so.stem).problem is None


def test_cache_dir_writable_by_others_is_refused(lib: TestLib) -> None:
    lib.cache.mkdir(mode=0o700)
    os.chmod(lib.cache, 0o777)
    proc = lib.run(1, 5)
    assert proc.returncode == 3 and status_of(proc) == E_CACHE
    assert proc.stdout.split()[1] == "-1"  # the stub's failure value, no crash
    assert "writable by group or others (mode 0777)" in proc.stderr
    assert "QOLA_JIT_CACHE_DIR" in proc.stderr
    assert lib.compiles() == 0


@pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")
def test_cache_dir_of_another_user_is_refused(lib: TestLib) -> None:
    import pwd

    lib.cache.mkdir(mode=0o700)
    os.chown(lib.cache, pwd.getpwnam("nobody").pw_uid, -1)
    proc = lib.run(1, 5)
    assert status_of(proc) == E_CACHE
    assert "not by the current user" in proc.stderr
    assert lib.compiles() == 0


def test_qola_jit_0_never_compiles_but_uses_the_cache(lib: TestLib) -> None:
    proc = lib.run(1, 5, extra={"QOLA_JIT": "0"})
    assert status_of(proc) == E_DISABLED and "QOLA_JIT=0" in proc.stderr
    assert lib.compiles() == 0
    ok(lib.run(1, 5))
    ok(lib.run(1, 5, extra={"QOLA_JIT": "0"}))
    assert lib.compiles() == 1


def test_compile_failure_reports_log_and_does_not_crash(lib: TestLib) -> None:
    (lib.root / "fail").write_text("")
    proc = lib.run(1, 5)
    assert proc.returncode == 3 and status_of(proc) == E_COMPILE
    assert "fake compiler error: boom" in proc.stderr
    log = proc.stderr.split("log: ")[1].split()[0]
    assert Path(log).is_file() and "boom" in Path(log).read_text()
    assert lib.entries() == [] and not list(lib.cache.glob(".tmp-*"))
    (lib.root / "fail").unlink()
    ok(lib.run(1, 5))


def test_changed_compiler_gets_its_own_entry(lib: TestLib) -> None:
    ok(lib.run(1, 5))
    # another compiler (path): a new key, one more compile
    other = lib.root / "other"
    other.mkdir()
    cc2 = fake_compiler(other)
    ok(lib.run(1, 5, extra={"QOLA_JIT_COMPILER": str(cc2)}))
    assert len(lib.entries()) == 2
    # the same path whose --version output changed (an upgrade): noticed, recompiled
    text = lib.compiler.read_text().replace("exec g++ --version; fi", 'echo "fake 2.0"; exit 0; fi')
    lib.compiler.write_text(text)
    ok(lib.run(1, 5))
    assert len(lib.entries()) == 3
    assert lib.compiles() == 2  # (the other compiler counted in its own dir)
    ok(lib.run(1, 5))
    assert lib.compiles() == 2


def test_missing_or_modified_sources_are_reported(lib: TestLib) -> None:
    src = lib.root / "out/jit/tm/src/unit_1.cpp"
    src.write_text(src.read_text() + "\n// edited\n")
    proc = lib.run(1, 5)
    assert status_of(proc) == E_SOURCE and "does not match this library" in proc.stderr
    src.unlink()
    proc = lib.run(1, 5)
    assert status_of(proc) == E_SOURCE and "cannot read" in proc.stderr
    assert lib.compiles() == 0


def test_a_loaded_library_keeps_its_jit_sources_across_a_publish(lib: TestLib, tmp_path: Path) -> None:
    """A publish swaps OUT/lib and OUT/jit as whole dirs (renameat2 exchange) and keeps the old
    ones in OUT/.qola/prev: a process that loaded the old library finds its own JIT sources there
    (the runtime follows its mapping, not the path it was loaded by, which now holds the next
    version with other sources)."""
    from qola.core import fsutil

    out = lib.root / "out"
    nxt = tmp_path / "next"
    shutil.copytree(out / "lib", nxt / "lib")
    shutil.copytree(out / "jit", nxt / "jit")
    edited = nxt / "jit/tm/src/unit_2.cpp"
    edited.write_text(edited.read_text() + "\n// the next build's sources\n")
    proc = subprocess.Popen(
        [str(lib.caller), "1", "5", "wait"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=lib.env,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().split() == ["first", str(expected(1, 5)), "status", "0"]  # loaded, unit 1 built
    for name in ("lib", "jit"):
        if not fsutil.exchange(nxt / name, out / name):
            proc.kill()
            pytest.skip("the file system has no renameat2 exchange")
    stdout, stderr = proc.communicate("go\n", timeout=300)
    assert proc.returncode == 0, stderr
    assert stdout.split() == ["second", str(expected(2, 5)), "status", "0"], stdout + stderr
    assert lib.compiles() == 2
    # a new process loads the library now in OUT/lib and reads OUT/jit: there the edited source does
    # not match its table (so the process above did not read it)
    ok(lib.run(1, 5))
    done = lib.run(2, 5, extra={"QOLA_JIT_CACHE_DIR": str(tmp_path / "fresh")})
    assert status_of(done) == E_SOURCE and "does not match this library" in done.stderr


def test_prebuilt_dir_is_used_before_compiling(lib: TestLib, tmp_path: Path) -> None:
    ok(lib.run(1, 5))
    prebuilt = tmp_path / "prebuilt"
    prebuilt.mkdir(mode=0o755)
    for p in lib.cache.glob("*.so"):
        for suffix in (".so", ".meta"):
            (prebuilt / (p.stem + suffix)).write_bytes(p.with_suffix(suffix).read_bytes())
    fresh = {"QOLA_JIT_CACHE_DIR": str(tmp_path / "fresh"), "QOLA_JIT_PREBUILT_DIR": str(prebuilt)}
    ok(lib.run(1, 5, extra=fresh))
    assert lib.compiles() == 1
    assert not list((tmp_path / "fresh").glob("*.so"))


def test_threads_of_one_process_share_one_load(lib: TestLib) -> None:
    (lib.root / "slow").write_text("1")
    proc = lib.run(0, 4, mode=("threads",))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [str(expected(1 + i % 2, 4)) for i in range(16)]
    assert lib.compiles() == 2


def test_prepare_compiles_ahead(lib: TestLib) -> None:
    proc = lib.run(0, 0, mode=("prepare", "unit_*"))
    assert proc.stdout.split() == ["failed", "0", "unknown", "-1"], proc.stderr
    assert lib.compiles() == 2
    ok(lib.run(2, 1), 2, 1)
    assert lib.compiles() == 2


def test_killed_compiler_leaves_no_entry(lib: TestLib) -> None:
    (lib.root / "slow").write_text("5")
    victim = lib.spawn(1, 5)
    assert wait_for(lambda: lib.compiles() == 1)
    os.kill(int((lib.root / "count").read_text().split()[0]), signal.SIGKILL)  # the compiler, not the caller
    out, err = victim.communicate(timeout=60)
    assert victim.returncode == 3 and f"status {E_COMPILE}" in out and "exit status 137" in err
    assert lib.entries() == [] and not list(lib.cache.glob(".tmp-*"))
    (lib.root / "slow").unlink()
    ok(lib.run(1, 5))
    assert lib.compiles() == 2


def test_batched_stubs(tmp_path: Path, jit_runtime: list[Path]) -> None:
    lib = make_lib(tmp_path / "lib", jit_runtime, batch=4)
    assert [p.name for p in (lib.root / "build").glob("qola_jit_stubs_*")] == ["qola_jit_stubs_tm_0.cpp"]
    ok(lib.run(2, 7), 2, 7)
    proc = lib.run(1, 3, store=True)
    assert proc.stdout.split()[:2] == ["result", "1003"]
