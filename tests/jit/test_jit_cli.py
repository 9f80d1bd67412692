"""``qola jit prebuild | ls | verify | clean`` against caches the runtime also uses."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from support.common import run_qola
from support.jit_lib import TestLib, build_runtime, expected, make_lib


@pytest.fixture(scope="session")
def jit_runtime(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return build_runtime(tmp_path_factory.mktemp("jit-runtime-cli"))


@pytest.fixture
def lib(tmp_path: Path, jit_runtime: list[Path]) -> TestLib:
    return make_lib(tmp_path / "lib", jit_runtime)


def ok_call(lib: TestLib, n: int = 1, x: int = 5, extra: dict[str, str] | None = None) -> None:
    proc = lib.run(n, x, extra=extra)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split()[1] == str(expected(n, x))


def test_prebuild_fills_the_cache_the_runtime_uses(lib: TestLib) -> None:
    out = lib.root / "out"
    proc = run_qola("jit", "prebuild", str(out), "-j", "2", env=lib.env)
    assert proc.returncode == 0, proc.stderr
    assert "2 built" in proc.stdout
    assert lib.compiles() == 2
    ok_call(lib, 1)
    ok_call(lib, 2)
    assert lib.compiles() == 2  # the runtime found the prebuilt entries
    again = run_qola("jit", "prebuild", str(out), env=lib.env)
    assert "0 built, 2 already present" in again.stdout
    ls = run_qola("jit", "ls", str(out), env=lib.env)
    assert "2 of 2 units ready" in ls.stdout, ls.stdout + ls.stderr


def test_prebuild_filter_and_prebuilt_dir(lib: TestLib, tmp_path: Path) -> None:
    prebuilt = tmp_path / "prebuilt"
    proc = run_qola(
        "jit", "prebuild", str(lib.root / "out"), "--filter", "unit_2", "--prebuilt-dir", str(prebuilt), env=lib.env
    )
    assert proc.returncode == 0, proc.stderr
    assert "1 built" in proc.stdout and lib.compiles() == 1
    ok_call(lib, 2, extra={"QOLA_JIT_PREBUILT_DIR": str(prebuilt)})
    assert lib.compiles() == 1 and lib.entries() == []  # loaded from the prebuilt dir
    ok_call(lib, 1, extra={"QOLA_JIT_PREBUILT_DIR": str(prebuilt)})
    assert lib.compiles() == 2  # unit_1 was not prebuilt: compiled into the cache


def test_ls_verify_fix_clean(lib: TestLib) -> None:
    ok_call(lib, 1)
    ok_call(lib, 2)
    ls = run_qola("jit", "ls", env=lib.env)
    assert ls.returncode == 0 and "2 entries" in ls.stdout and "tm/unit_1" in ls.stdout
    assert run_qola("jit", "verify", env=lib.env).returncode == 0
    so = next(p for p in lib.entries() if "unit unit_1\n" in p.with_suffix(".meta").read_text())
    data = bytearray(so.read_bytes())
    data[100] ^= 1
    so.write_bytes(data)
    bad = run_qola("jit", "verify", env=lib.env)
    assert bad.returncode == 1 and f"BROKEN {so.stem}" in bad.stdout and "sha256" in bad.stdout
    assert "--fix" in bad.stderr
    fixed = run_qola("jit", "verify", "--fix", env=lib.env)
    assert fixed.returncode == 0 and "removed" in fixed.stdout
    assert not so.exists() and len(lib.entries()) == 1
    assert run_qola("jit", "verify", env=lib.env).returncode == 0
    ok_call(lib, 1)  # rebuilt on next use
    assert lib.compiles() == 3
    (lib.cache / f".tmp-{so.stem}-junk.so").write_bytes(b"x")
    clean = run_qola("jit", "clean", env=lib.env)
    assert clean.returncode == 0 and len(lib.entries()) == 2
    assert not list(lib.cache.glob(".tmp-*"))
    clean_all = run_qola("jit", "clean", "--all", env=lib.env)
    assert clean_all.returncode == 0 and lib.entries() == []


def test_refused_cache_dir_exits_2_with_hint(lib: TestLib) -> None:
    lib.cache.mkdir(mode=0o700)
    os.chmod(lib.cache, 0o777)
    for args in (["ls"], ["verify"], ["prebuild", str(lib.root / "out")]):
        proc = run_qola("jit", *args, env=lib.env)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert "error: refusing JIT cache dir" in proc.stderr and "hint: run `chmod go-w" in proc.stderr


def test_user_errors_exit_2(lib: TestLib, tmp_path: Path) -> None:
    proc = run_qola("jit", "prebuild", str(tmp_path / "nothing"), env=lib.env)
    assert proc.returncode == 2 and "error: no JIT modules under" in proc.stderr and "hint:" in proc.stderr
    proc = run_qola("jit", "prebuild", str(lib.root / "out"), "--filter", "nope*", env=lib.env)
    assert proc.returncode == 2 and "no JIT unit matches" in proc.stderr
    proc = run_qola("jit", "ls", env={**lib.env, "QOLA_JIT_CACHE_DIR": str(tmp_path / "absent")})
    assert proc.returncode == 2 and "does not exist" in proc.stderr


def test_prebuild_reports_compile_failures(lib: TestLib) -> None:
    (lib.root / "fail").write_text("")
    proc = run_qola("jit", "prebuild", str(lib.root / "out"), env=lib.env)
    assert proc.returncode == 1
    assert "2 failed" in proc.stdout and "boom" in proc.stderr
    assert lib.entries() == []


def test_entries_are_0644_whatever_the_umask(lib: TestLib) -> None:
    """Whatever mode the linker leaves on its output (it depends on the linker and the umask: 0711
    here before), the runtime and prebuild both publish entries with the format's 0644."""
    old = os.umask(0o002)
    try:
        ok_call(lib, 1)  # compiled by the runtime
        proc = run_qola("jit", "prebuild", str(lib.root / "out"), env=lib.env)  # unit_2 by qola jit prebuild
        assert proc.returncode == 0 and "1 built" in proc.stdout, proc.stdout + proc.stderr
        ok_call(lib, 2)
        ok_call(lib, 1)
    finally:
        os.umask(old)
    assert lib.compiles() == 2
    assert sorted(p.stat().st_mode & 0o777 for p in lib.entries()) == [0o644, 0o644]
    assert run_qola("jit", "verify", env=lib.env).returncode == 0


def test_verify_and_clean_on_a_fresh_machine_exit_0(tmp_path: Path) -> None:
    """Issue 32 item 7: no cache dir yet is an empty cache (verify and clean say so, exit 0, create nothing)."""
    absent = tmp_path / "absent"
    for args in (["verify"], ["clean"]):
        proc = run_qola("jit", *args, env={"QOLA_JIT_CACHE_DIR": str(absent)})
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "does not exist yet" in proc.stdout and "nothing to" in proc.stdout
        assert not absent.exists()


@pytest.mark.parametrize("failure", ["source", "lock", "compiler", "headers"])
def test_prebuild_exits_nonzero_on_every_failure(lib: TestLib, failure: str) -> None:
    """A CI prebuild step must fail when prebuild does (a reviewer's point on ck-jit, issue 35): not
    only a failed compile (above) but a source that differs from the library's record, a lock another
    process holds past QOLA_LOCK_TIMEOUT, a compiler that is not there and a header bundle that does
    not unpack; the other units are still tried, no entry is written for the failed one."""
    import fcntl

    from qola.jit import prebuild as pb

    out, extra = lib.root / "out", {}
    units = pb.select_units(pb.find_jit_dirs(out), {**os.environ, **lib.env}, None, ())
    first = units[0]
    held = None
    if failure == "source":
        src = first.jit_dir / first.unit.source
        src.write_bytes(src.read_bytes() + b"\n// edited after the build\n")
    elif failure == "lock":
        locks = lib.cache / "locks"
        locks.mkdir(parents=True, exist_ok=True)
        lib.cache.chmod(0o700)
        locks.chmod(0o700)
        held = os.open(locks / f"{first.key}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(held, fcntl.LOCK_EX)
        extra = {"QOLA_LOCK_TIMEOUT": "0.2"}
    elif failure == "compiler":
        extra = {"QOLA_JIT_COMPILER": str(lib.root / "no-such-compiler")}
    else:
        bundle = first.jit_dir / "headers.tar.gz"
        bundle.write_bytes(b"not a tar archive")
    try:
        proc = run_qola("jit", "prebuild", str(out), env={**lib.env, **extra})
    finally:
        if held is not None:
            os.close(held)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"{first.module}/{first.unit.name}" in proc.stderr and "failed" in proc.stdout, proc.stdout + proc.stderr
    assert first.key not in {p.stem for p in lib.entries()}
