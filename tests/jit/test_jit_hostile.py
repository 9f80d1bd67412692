"""Hardening of the JIT (issue 11): a hostile cache or OUT/jit never gets code compiled or loaded,
never hangs the runtime or `qola jit`, and bad input is one clear error (exit 2)."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from subprocess import CompletedProcess
from typing import Any, cast

import pytest
from support.common import run_qola, wait_for
from support.jit_lib import TestLib, build_runtime, expected, make_lib, sh

from qola.jit.cache import JitCache

E_DISABLED, E_CACHE, E_SOURCE = 1, 3, 6
OTHER_UID = 12345
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")


@pytest.fixture(scope="session")
def jit_runtime(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return build_runtime(tmp_path_factory.mktemp("jit-runtime-harden"))


@pytest.fixture
def lib(tmp_path: Path, jit_runtime: list[Path]) -> TestLib:
    return make_lib(tmp_path / "lib", jit_runtime)


def index_of(lib: TestLib) -> dict[str, Any]:
    return cast("dict[str, Any]", json.loads((lib.root / "out/jit/tm/index.json").read_text()))


def call(
    lib: TestLib, n: int, x: int, extra: dict[str, Any] | None = None, timeout: float = 30
) -> CompletedProcess[str]:
    """The caller, with a short timeout (a hang fails the test instead of stalling it)."""
    return subprocess.run(
        [str(lib.caller), str(n), str(x)],
        capture_output=True,
        text=True,
        env={**lib.env, **(extra or {})},
        timeout=timeout,
    )


def result(proc: subprocess.CompletedProcess[str]) -> tuple[int, int]:
    """(value, status) printed by the caller."""
    words = proc.stdout.split()
    assert words[:1] == ["result"], proc.stdout + proc.stderr
    return int(words[1]), int(words[3])


def no_traceback(proc: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in proc.stderr, proc.stderr


def plant_headers(lib: TestLib, *, const: int = 900, uid: int | None = None) -> Path:
    """A complete-looking unpacked bundle with another api.h at <cache>/headers/<bundle sha>."""
    dst = lib.cache / "headers" / index_of(lib)["headers"]["sha256"]
    (dst / "inc0").mkdir(parents=True)
    api = (lib.root / "src/include/api.h").read_text().replace("HEADER_CONST 7", f"HEADER_CONST {const}")
    (dst / "inc0" / "api.h").write_text(api)
    (dst / ".qola-complete").write_text("ok\n")
    if uid is not None:
        for p in (dst, dst / "inc0", dst / "inc0" / "api.h", dst / ".qola-complete"):
            os.chown(p, uid, uid)
    return cast("Path", dst)


def cache_with_open_headers_dir(lib: TestLib) -> None:
    JitCache(lib.cache)  # 0700 root and subdirs
    os.chmod(lib.cache, 0o755)
    os.chmod(lib.cache / "headers", 0o777)


# ------------------------------------------------------------------ item 2: planted headers


@root_only
def test_runtime_refuses_a_group_writable_headers_dir_and_replaces_planted_headers(lib: TestLib) -> None:
    cache_with_open_headers_dir(lib)
    planted = plant_headers(lib, uid=OTHER_UID)
    proc = lib.run(1, 5)
    value, status = result(proc)
    assert status == E_CACHE and value == -1, proc.stderr
    assert "headers" in proc.stderr and "writable by group or others (mode 0777)" in proc.stderr
    assert lib.compiles() == 0  # nothing compiled with what another user planted
    os.chmod(lib.cache / "headers", 0o700)
    proc = lib.run(1, 5)
    assert result(proc) == (expected(1, 5), 0), proc.stderr  # HEADER_CONST 7, not 900
    assert lib.compiles() == 1
    assert planted.stat().st_uid == os.geteuid() and "HEADER_CONST 7" in (planted / "inc0/api.h").read_text()


def test_runtime_unpacks_again_when_the_unpacked_headers_differ_from_the_library(lib: TestLib) -> None:
    JitCache(lib.cache)
    planted = plant_headers(lib, const=900)  # ours, private, complete-looking, but not the bundle's content
    proc = lib.run(2, 3)
    assert result(proc) == (expected(2, 3), 0), proc.stderr
    assert "HEADER_CONST 7" in (planted / "inc0/api.h").read_text()


def test_runtime_refuses_a_symlinked_header_in_the_unpacked_tree(lib: TestLib, tmp_path: Path) -> None:
    JitCache(lib.cache)
    planted = plant_headers(lib, const=7)
    outside = tmp_path / "outside.h"
    outside.write_text((planted / "inc0/api.h").read_text())
    (planted / "inc0/api.h").unlink()
    (planted / "inc0/api.h").symlink_to(outside)  # same bytes, but through a link: not trusted
    proc = lib.run(1, 5)
    assert result(proc) == (expected(1, 5), 0), proc.stderr
    assert not (planted / "inc0/api.h").is_symlink()


@root_only
def test_prebuild_refuses_open_headers_dir_and_never_compiles_planted_headers(lib: TestLib) -> None:
    cache_with_open_headers_dir(lib)
    plant_headers(lib, uid=OTHER_UID)
    proc = run_qola("jit", "prebuild", lib.root / "out", env=lib.env, timeout=60)
    no_traceback(proc)
    assert proc.returncode == 2 and "writable by group or others (mode 0777)" in proc.stderr
    assert lib.compiles() == 0
    os.chmod(lib.cache / "headers", 0o700)
    proc = run_qola("jit", "prebuild", lib.root / "out", env=lib.env, timeout=60)
    assert proc.returncode == 0 and "2 built" in proc.stdout, proc.stdout + proc.stderr
    proc = lib.run(1, 5, extra={"QOLA_JIT": "0"})  # the prebuilt entry, built from the library's headers
    assert result(proc) == (expected(1, 5), 0), proc.stderr
    assert lib.compiles() == 2


def test_prebuild_unpacks_again_when_the_unpacked_headers_differ(lib: TestLib) -> None:
    JitCache(lib.cache)
    plant_headers(lib, const=900)
    proc = run_qola("jit", "prebuild", lib.root / "out", "--filter", "unit_2", env=lib.env, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert result(lib.run(2, 4, extra={"QOLA_JIT": "0"})) == (expected(2, 4), 0)


@root_only
def test_untrusted_entries_and_memos_are_not_used(lib: TestLib) -> None:
    assert result(lib.run(1, 5))[1] == 0
    so = lib.entries()[0]
    os.chown(so, OTHER_UID, -1)  # same bytes, another owner
    proc = lib.run(1, 5, extra={"QOLA_JIT": "0"})
    assert result(proc)[1] == E_DISABLED, proc.stderr
    bad = run_qola("jit", "verify", env=lib.env, timeout=60)
    assert bad.returncode == 1 and f"owned by uid {OTHER_UID}" in bad.stdout


# ------------------------------------------------------------------ item 3: the library is the authority


def tamper_source(lib: TestLib, unit: str = "unit_1") -> Path:
    src = lib.root / f"out/jit/tm/src/{unit}.cpp"
    text = src.read_text().replace("return x * 10 + HEADER_CONST", "return x * 10 + 5000 + HEADER_CONST")
    assert text != src.read_text()
    src.write_text(text)
    return src


def test_prebuild_from_a_tampered_out_jit_is_refused(lib: TestLib) -> None:
    src = tamper_source(lib)
    index = index_of(lib)
    for u in index["units"]:
        if u["name"] == "unit_1":
            u["source_sha256"] = hashlib.sha256(src.read_bytes()).hexdigest()  # the index "agrees"
    (lib.root / "out/jit/tm/index.json").write_text(json.dumps(index))
    proc = run_qola("jit", "prebuild", lib.root / "out", env=lib.env, timeout=60)
    no_traceback(proc)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "does not match the library" in proc.stderr and "unit_1: source_sha256" in proc.stderr
    assert lib.entries() == [] and lib.compiles() == 0
    ls = run_qola("jit", "ls", lib.root / "out", env=lib.env, timeout=60)
    assert ls.returncode == 2 and "does not match the library" in ls.stderr


def test_prebuild_never_compiles_a_source_the_library_did_not_record(lib: TestLib) -> None:
    tamper_source(lib)  # index.json untouched: its hash disagrees with the file, as the library's does
    proc = run_qola("jit", "prebuild", lib.root / "out", env=lib.env, timeout=60)
    assert proc.returncode == 1 and "1 built" in proc.stdout, proc.stdout + proc.stderr
    assert "unit_1" in proc.stderr and "does not match the library" in proc.stderr
    assert lib.compiles() == 1  # unit_2 only


def _tampered_entry(lib: TestLib) -> Path:
    """Replace unit_1's entry by one compiled from a tampered source, with a .meta whose size and
    sha256 fit the new .so and that truthfully records the tampered source's hash. OUT/jit is
    restored afterwards: only the cache is hostile."""
    assert run_qola("jit", "prebuild", lib.root / "out", "--filter", "unit_1", env=lib.env, timeout=60).returncode == 0
    so = lib.entries()[0]
    original = (lib.root / "out/jit/tm/src/unit_1.cpp").read_bytes()
    src = tamper_source(lib)
    sh(
        [
            "g++",
            "-std=c++17",
            "-O1",
            "-fPIC",
            "-shared",
            "-fvisibility=hidden",
            "-Wl,-Bsymbolic",
            "-I",
            lib.root / "src/include",
            "-o",
            so,
            src,
        ]
    )
    meta = so.with_suffix(".meta")
    fields = dict(line.split(" ", 1) for line in meta.read_text().splitlines()[1:])
    fields.update(
        size=str(so.stat().st_size),
        sha256=hashlib.sha256(so.read_bytes()).hexdigest(),
        source_sha256=hashlib.sha256(src.read_bytes()).hexdigest(),
    )
    meta.write_text("qola-jit-entry 1\n" + "".join(f"{k} {v}\n" for k, v in fields.items()))
    src.write_bytes(original)
    return so


def test_an_entry_built_from_other_sources_is_not_loaded_and_verify_says_so(lib: TestLib) -> None:
    so = _tampered_entry(lib)
    good = run_qola("jit", "verify", env=lib.env, timeout=60)  # by itself the entry is consistent...
    assert good.returncode == 0, good.stdout + good.stderr
    bad = run_qola(
        "jit", "verify", lib.root / "out", env=lib.env, timeout=60
    )  # ...but not with what the library recorded
    assert bad.returncode == 1 and f"BROKEN {so.stem}" in bad.stdout, bad.stdout + bad.stderr
    assert "not built from the sources" in bad.stdout and "unit_1" in bad.stdout
    proc = lib.run(1, 5, extra={"QOLA_JIT": "0"})
    assert result(proc)[1] == E_DISABLED  # the runtime does not load it
    proc = lib.run(1, 5)
    assert result(proc) == (expected(1, 5), 0), proc.stderr  # rebuilt from its own sources, not +5000


def test_entries_without_a_record_of_their_sources_are_rebuilt(lib: TestLib) -> None:
    """What an older prebuild wrote from a tampered OUT/jit: a consistent entry, no provenance."""
    so = _tampered_entry(lib)
    meta = so.with_suffix(".meta")
    meta.write_text(
        "".join(
            ln + "\n"
            for ln in meta.read_text().splitlines()
            if ln.split(" ")[0] not in ("content_key", "source_sha256", "headers_sha256")
        )
    )
    bad = run_qola("jit", "verify", env=lib.env, timeout=60)
    assert bad.returncode == 1 and "no record of its sources" in bad.stdout
    assert result(lib.run(1, 5)) == (expected(1, 5), 0)


def test_the_table_is_read_from_shared_objects_and_static_archives(lib: TestLib, tmp_path: Path) -> None:
    from qola.jit import libtable, schema  # new with the hardening: imported here so the other tests run on older trees

    [mod] = libtable.read_library(lib.root / "out/lib/libqt.so")
    index = index_of(lib)
    libtable.check_index(schema.JitIndex.parse(index, "index.json"), mod, "index.json")
    assert mod.module == "tm" and set(mod.units) == {"unit_1", "unit_2"} and mod.headers_digest
    table_src = lib.root / "build/qola_jit_table_tm.cpp"
    obj = tmp_path / "t.o"
    sh(
        [
            "g++",
            "-std=c++17",
            "-c",
            "-fPIC",
            "-I",
            lib.root / "build/include",
            "-I",
            libtable_data(),
            "-I",
            libtable_data() / "jit",
            table_src,
            "-o",
            obj,
        ]
    )
    ar = tmp_path / "libqt.a"
    sh(["ar", "rcs", ar, obj])
    [again] = libtable.read_library(ar)
    assert again.same_table(mod)
    # --library names it explicitly; a library that records nothing is an error, not a traceback
    proc = run_qola("jit", "ls", lib.root / "out", "--library", ar, env=lib.env, timeout=60)
    assert proc.returncode == 0 and "0 of 2 units ready" in proc.stdout, proc.stdout + proc.stderr
    proc = run_qola("jit", "ls", lib.root / "out", "--library", lib.root / "out/bin/caller", env=lib.env, timeout=60)
    assert proc.returncode == 2 and "no library records the JIT module" in proc.stderr


def libtable_data() -> Path:
    import qola

    return Path(qola.__file__).parent / "runtime"


# ------------------------------------------------------------------ item 3: FIFOs and /dev/zero never hang


def _hostile(lib: TestLib, what: str) -> Path:
    assert result(lib.run(1, 5))[1] == 0
    so = lib.entries()[0]
    target = {"meta-fifo": so.with_suffix(".meta"), "so-zero": so, "meta-zero": so.with_suffix(".meta")}[what]
    target.unlink()
    if what == "meta-fifo":
        os.mkfifo(target)
    else:
        target.symlink_to("/dev/zero")
    return so


@pytest.mark.parametrize("what", ["meta-fifo", "so-zero", "meta-zero"])
def test_fifos_and_device_links_in_the_cache_never_hang(lib: TestLib, what: str) -> None:
    so = _hostile(lib, what)
    proc = call(lib, 1, 5, extra={"QOLA_JIT": "0"})  # would block/read forever before
    assert result(proc)[1] == E_DISABLED, proc.stderr
    for args, rc in ((["verify"], 1), (["ls"], 0), (["ls", lib.root / "out"], 0)):
        p = run_qola("jit", *args, env=lib.env, timeout=30)
        no_traceback(p)
        assert p.returncode == rc, p.stdout + p.stderr
    v = run_qola("jit", "verify", env=lib.env, timeout=60)
    assert f"BROKEN {so.stem}" in v.stdout and ("symbolic link" in v.stdout or "FIFO" in v.stdout), v.stdout
    assert result(lib.run(1, 5)) == (expected(1, 5), 0)  # replaced by a fresh compile
    assert run_qola("jit", "verify", env=lib.env, timeout=60).returncode == 0


def test_fifo_inputs_in_out_jit_never_hang(lib: TestLib) -> None:
    src = lib.root / "out/jit/tm/src/unit_1.cpp"
    src.unlink()
    os.mkfifo(src)
    proc = call(lib, 1, 5)
    assert result(proc)[1] == E_SOURCE and "not a regular file" in proc.stderr
    index = lib.root / "out/jit/tm/index.json"
    index.unlink()
    os.mkfifo(index)
    p = run_qola("jit", "ls", lib.root / "out", env=lib.env, timeout=30)
    assert p.returncode == 2 and "FIFO" in p.stderr, p.stderr


# ------------------------------------------------------------------ item 4: bad input, one clear error


def _index_cases() -> dict[str, Any]:
    deep = "[" * 100_000 + "]" * 100_000
    return {
        "not-json": b"{nope",
        "list": b"[]",
        "units-not-a-list": b'{"format": "qola-jit-index", "version": 1, "units": 3}',
        "missing-keys": b'{"format": "qola-jit-index", "version": 1}',
        "deep": ('{"format": "qola-jit-index", "version": 1, "units": ' + deep + "}").encode(),
        "binary": b"\xff\xfe\x00garbage",
        "huge": b" " * (65 << 20),
    }


@pytest.mark.parametrize("case", list(_index_cases()))
def test_malformed_index_json_is_exit_2(lib: TestLib, case: str) -> None:
    index = lib.root / "out/jit/tm/index.json"
    index.write_bytes(_index_cases()[case])
    for args in (["prebuild", lib.root / "out"], ["ls", lib.root / "out"], ["verify", lib.root / "out"]):
        p = run_qola("jit", *map(str, args), env=lib.env, timeout=60)
        no_traceback(p)
        assert p.returncode == 2, (case, args, p.stdout, p.stderr)
        assert "index.json" in p.stderr and "hint:" in p.stderr, p.stderr


def test_index_json_with_wrong_types_names_the_key(lib: TestLib) -> None:
    index = index_of(lib)
    index["units"][0]["content_key"] = 5
    (lib.root / "out/jit/tm/index.json").write_text(json.dumps(index))
    p = run_qola("jit", "prebuild", lib.root / "out", env=lib.env, timeout=60)
    assert p.returncode == 2 and "units[0].content_key" in p.stderr and "expected a lowercase sha256" in p.stderr
    index["units"][0] = {"name": "../../etc/x"}
    (lib.root / "out/jit/tm/index.json").write_text(json.dumps(index))
    p = run_qola("jit", "ls", lib.root / "out", env=lib.env, timeout=60)
    assert p.returncode == 2 and "units[0].name" in p.stderr


@pytest.mark.parametrize("action", [["prebuild", "OUT"], ["ls"], ["ls", "OUT"], ["verify"], ["clean"]])
def test_cache_dir_that_is_a_file_is_exit_2(lib: TestLib, tmp_path: Path, action: list[str]) -> None:
    a_file = tmp_path / "passwd"
    a_file.write_text("root:x:0:0::/root:/bin/sh\n")
    args = [str(lib.root / "out") if a == "OUT" else a for a in action]
    p = run_qola("jit", "--cache-dir", str(a_file), *args, env=lib.env)
    no_traceback(p)
    assert p.returncode == 2 and "is not a directory" in p.stderr and "hint:" in p.stderr, p.stderr
    assert a_file.read_text().startswith("root:")


# ------------------------------------------------------------------ item 5: stale temp files


def test_killed_compile_leaves_a_temp_that_verify_reports_and_the_next_compile_removes(lib: TestLib) -> None:
    (lib.root / "slow").write_text("30")
    victim = lib.spawn(1, 5)
    assert wait_for(lambda: lib.compiles() == 1), "the compiler never started"
    compiler = int((lib.root / "count").read_text().split()[0])
    victim.send_signal(signal.SIGKILL)
    victim.wait(timeout=30)
    os.kill(compiler, signal.SIGKILL)  # the compiler dies with it (as a killed job's would)
    (lib.root / "slow").unlink()
    temps = sorted(lib.cache.glob(".tmp-*"))
    assert temps, "the killed compile left no temp file"
    v = run_qola("jit", "verify", env=lib.env, timeout=60)
    assert v.returncode == 1, v.stdout + v.stderr
    assert all(f"STALE {t}" in v.stdout for t in temps) and "--fix" in v.stderr
    assert result(lib.run(2, 1)) == (expected(2, 1), 0)  # another key's compile sweeps them
    assert not list(lib.cache.glob(".tmp-*"))
    assert run_qola("jit", "verify", env=lib.env, timeout=60).returncode == 0


def test_verify_fix_removes_stale_temps_but_not_those_of_a_running_compile(lib: TestLib) -> None:
    assert result(lib.run(1, 5))[1] == 0
    cache = JitCache(lib.cache)
    stale = lib.cache / f".tmp-{'a' * 64}-dead.so"
    busy = lib.cache / f".tmp-{'b' * 64}-live.so"
    stale_dir = lib.cache / "headers" / f".tmp-{'c' * 64}-x"
    for p in (stale, busy):
        p.write_bytes(b"x")
    stale_dir.mkdir()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl,os,sys,time; fd=os.open(sys.argv[1], os.O_RDWR|os.O_CREAT);"
            "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); sys.stdin.read()",
            str(cache.lock_dir() / f"{'b' * 64}.lock"),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None
    try:
        assert holder.stdout.readline().strip() == "held"
        v = run_qola("jit", "verify", env=lib.env, timeout=60)
        assert v.returncode == 1 and f"STALE {stale}" in v.stdout and f"STALE {stale_dir}" in v.stdout
        assert str(busy) not in v.stdout
        fixed = run_qola("jit", "verify", "--fix", env=lib.env, timeout=60)
        assert fixed.returncode == 0 and not stale.exists() and not stale_dir.exists() and busy.exists()
    finally:
        holder.kill()
        holder.wait()
    assert run_qola("jit", "verify", env=lib.env, timeout=60).returncode == 1  # the holder is gone: now it is stale
    assert run_qola("jit", "clean", env=lib.env, timeout=60).returncode == 0 and not busy.exists()
