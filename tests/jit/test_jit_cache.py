"""qola.jit.cache: the Python side of the cache (same checks, entry format and locks as the runtime)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from qola.core.errors import QolaError
from qola.jit import cache as jc
from qola.jit import format as fmt
from qola.jit.key import entry_key


def test_default_cache_dir() -> None:
    assert fmt.default_cache_dir({"QOLA_JIT_CACHE_DIR": "/x/y", "XDG_CACHE_HOME": "/c"}) == Path("/x/y")
    assert fmt.default_cache_dir({"XDG_CACHE_HOME": "/c", "HOME": "/h"}) == Path("/c/qola/jit")
    assert fmt.default_cache_dir({"XDG_CACHE_HOME": "rel", "HOME": "/h"}) == Path("/h/.cache/qola/jit")


def test_private_dir_checks(tmp_path: Path) -> None:
    d = tmp_path / "c"
    cache = jc.JitCache(d)
    assert oct(d.stat().st_mode & 0o777) == "0o700"
    assert all((d / s).is_dir() for s in fmt.SUBDIRS)
    os.chmod(d, 0o775)
    with pytest.raises(QolaError, match=r"writable by group or others \(mode 0775\)") as exc:
        jc.JitCache(d)
    assert "chmod go-w" in (exc.value.hint or "")
    os.chmod(d, 0o755)
    jc.JitCache(d)  # readable by others is fine
    (tmp_path / "file").write_text("")
    with pytest.raises(QolaError, match="not a directory"):
        jc.check_private_dir(tmp_path / "file")
    assert cache.network is None


def _key(tag: str) -> str:
    return entry_key(tag * 64, "c" * 64)


def _entry(cache: jc.JitCache, key: str, data: bytes, tag: str = "a") -> None:
    """Publish an entry as prebuild does (with the record of its sources); ``key`` = _key(tag)."""
    built = cache.path / f".tmp-{key}-x.so"
    built.write_bytes(b"\x7fELF" + data)
    cache.publish(
        key,
        built,
        {
            "unit": "u",
            "module": "m",
            "compiler_id": "c" * 64,
            "content_key": tag * 64,
            "source_sha256": "5" * 64,
            "headers_sha256": "",
        },
    )


def test_entry_states(tmp_path: Path) -> None:
    cache = jc.JitCache(tmp_path / "c")
    key = _key("a")
    assert cache.entry(key).problem == "missing"
    _entry(cache, key, b"payload" * 100)
    assert cache.entry(key).problem is None
    assert cache.entry(key).fields["unit"] == "u"
    so = cache.path / f"{key}.so"
    so.write_bytes(so.read_bytes()[:-1])
    assert "truncated" in (cache.entry(key).problem or "")
    (cache.path / f"{key}.meta").unlink()
    assert "no .meta" in (cache.entry(key).problem or "")
    with pytest.raises(QolaError, match="not a shared object"):
        bad = cache.path / ".tmp-x"
        bad.write_bytes(b"text")
        cache.publish(key, bad, {})
    assert cache.keys() == [key]


def test_locks_are_exclusive_across_processes(tmp_path: Path) -> None:
    cache = jc.JitCache(tmp_path / "c")
    key = "b" * 64
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl,os,sys,time; fd=os.open(sys.argv[1], os.O_RDWR|os.O_CREAT);"
            "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); sys.stdin.read()",
            str(cache.path / "locks" / f"{key}.lock"),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None
    try:
        assert holder.stdout.readline().strip() == "held"
        with cache.lock(key, blocking=False) as got:
            assert got is False
    finally:
        holder.kill()
        holder.wait()
    with cache.lock(key, blocking=False) as got:  # a dead holder's lock is gone with it
        assert got is True


def test_network_file_systems_lock_in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jc, "network_fs", lambda path: "nfs")
    cache = jc.JitCache(tmp_path / "c")
    assert cache.network == "nfs"
    assert cache.lock_dir() == Path(f"/tmp/qola-jit-locks-{os.geteuid()}")
    with cache.lock("c" * 64) as got:
        assert got and (cache.lock_dir() / f"{'c' * 64}.lock").exists()


def test_clean_keeps_valid_entries_unless_all(tmp_path: Path) -> None:
    cache = jc.JitCache(tmp_path / "c")
    _entry(cache, _key("d"), b"ok", "d")
    _entry(cache, _key("e"), b"broken", "e")
    (cache.path / f"{_key('e')}.so").write_bytes(b"\x7fELFbrokeN")
    (cache.path / "logs" / "x.log").write_text("log")
    (cache.path / "headers" / "h").mkdir()
    removed = cache.clean(everything=False)
    assert cache.keys() == [_key("d")] and (cache.path / "headers" / "h").exists()
    assert any(p.name == "x.log" for p in removed)
    cache.clean(everything=True)
    assert cache.keys() == [] and not (cache.path / "headers" / "h").exists()
    shutil.rmtree(cache.path)
