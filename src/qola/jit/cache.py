"""The JIT cache on disk — the same layout, checks and locking as the C++ runtime.

    <cache>/<key>.so        a compiled unit (shared object)
    <cache>/<key>.meta      "qola-jit-entry 1" + key, size, sha256, unit, module, compiler...
                            written after the .so; both by temp + fsync + rename
    <cache>/.tmp-<key>-*    in-flight temp files (removed by the next holder of the key's lock)
    <cache>/locks/<key>.lock  flock per key (network file systems: /tmp/qola-jit-locks-<uid>/)
    <cache>/logs/<key>.log  compiler output (kept when a compile fails)
    <cache>/headers/<sha>/  unpacked header bundles
    <cache>/compilers/      compiler identity memos

An entry is valid only if its .meta names the key and the .so has the recorded size
and sha256. The cache dir must be owned by the user and not writable by group/others.
Configuration comes in as arguments (``env`` mappings), never from os.environ here.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import shutil
import stat
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from qola.errors import QolaError
from qola.jit.key import file_sha256

META_HEAD = "qola-jit-entry 1\n"
SUBDIRS = ("logs", "headers", "compilers", "locks")
NETWORK_FS = {
    0x6969: "nfs", 0x517B: "smb", 0xFF534D42: "cifs", 0xFE534D42: "smb2", 0x00C36400: "ceph",
    0x0BD00BD0: "lustre", 0x47504653: "gpfs", 0x5346414F: "afs", 0x01021997: "9p", 0x65735546: "fuse",
    0x19830326: "beegfs", 0xAAD7AAEA: "panfs", 0x20030528: "orangefs", 0x7461636F: "ocfs2", 0x01161970: "gfs2",
}  # fmt: skip


def default_cache_dir(env: Mapping[str, str]) -> Path:
    """QOLA_JIT_CACHE_DIR, else $XDG_CACHE_HOME/qola/jit (absolute only), else ~/.cache/qola/jit."""
    if env.get("QOLA_JIT_CACHE_DIR"):
        return Path(env["QOLA_JIT_CACHE_DIR"])
    xdg = env.get("XDG_CACHE_HOME", "")
    if xdg.startswith("/"):
        return Path(xdg) / "qola" / "jit"
    home = env.get("HOME") or os.path.expanduser("~")
    return Path(home) / ".cache" / "qola" / "jit"


def check_private_dir(path: Path, *, follow: bool = True) -> None:
    """Raise QolaError unless ``path`` is a directory owned by us and not group/other-writable."""
    try:
        st = os.stat(path) if follow else os.lstat(path)
    except OSError as exc:
        raise QolaError(f"cannot use JIT cache dir {path}: {exc.strerror}") from exc
    if not stat.S_ISDIR(st.st_mode):
        raise QolaError(f"JIT cache dir {path} is not a directory")
    if st.st_uid != os.geteuid():
        raise QolaError(
            f"refusing JIT cache dir {path}: owned by uid {st.st_uid}, not by the current user (uid {os.geteuid()})",
            hint="set QOLA_JIT_CACHE_DIR to a directory of your own",
        )
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise QolaError(
            f"refusing JIT cache dir {path}: writable by group or others (mode {stat.S_IMODE(st.st_mode):04o})",
            hint=f"run `chmod go-w {path}` or set QOLA_JIT_CACHE_DIR",
        )


def network_fs(path: Path) -> str | None:
    """Name of the network file system ``path`` lives on (statfs f_type), or None."""
    buf = ctypes.create_string_buffer(256)  # struct statfs; f_type is the first field
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.statfs(os.fsencode(path), buf) != 0:
            return None
    except (OSError, AttributeError):
        return None
    f_type = ctypes.c_long.from_buffer(buf).value & 0xFFFFFFFF
    return NETWORK_FS.get(f_type)


@dataclass(frozen=True)
class Entry:
    key: str
    so: Path
    meta: Path
    fields: dict[str, str]
    problem: str | None  # None = valid

    @property
    def size(self) -> int:
        try:
            return self.so.stat().st_size
        except OSError:
            return 0


def parse_meta(text: str) -> dict[str, str]:
    fields = {}
    for line in text.splitlines()[1:]:
        k, _, v = line.partition(" ")
        fields[k] = v
    return fields


def render_meta(fields: Mapping[str, str]) -> str:
    return META_HEAD + "".join(f"{k} {v}\n" for k, v in fields.items())


class JitCache:
    """One cache (or prebuilt) directory."""

    def __init__(self, path: Path, *, create: bool = True, check: bool = True):
        self.path = Path(path)
        if create:
            self.path.mkdir(mode=0o700, parents=True, exist_ok=True)
        if check:
            check_private_dir(self.path)
        if create:
            for sub in SUBDIRS:
                (self.path / sub).mkdir(mode=0o700, exist_ok=True)
        self.network = network_fs(self.path) if self.path.exists() else None

    # ------------------------------------------------------------------ entries
    def entry(self, key: str) -> Entry:
        so, meta = self.path / f"{key}.so", self.path / f"{key}.meta"
        try:
            text = meta.read_text()
        except OSError:
            return Entry(key, so, meta, {}, "missing" if not so.exists() else "no .meta (interrupted write)")
        fields = parse_meta(text)
        if not text.startswith(META_HEAD) or fields.get("key") != key or len(fields.get("sha256", "")) != 64:
            return Entry(key, so, meta, fields, "malformed .meta")
        try:
            size = so.stat().st_size
        except OSError:
            return Entry(key, so, meta, fields, ".meta without .so")
        if str(size) != fields.get("size"):
            return Entry(key, so, meta, fields, f"size {size} != {fields.get('size')} (truncated?)")
        if file_sha256(so) != fields["sha256"]:
            return Entry(key, so, meta, fields, "sha256 mismatch (corrupted)")
        return Entry(key, so, meta, fields, None)

    def keys(self) -> list[str]:
        found = set()
        for p in self.path.iterdir():
            if p.suffix in (".so", ".meta") and not p.name.startswith(".") and len(p.stem) == 64:
                found.add(p.stem)
        return sorted(found)

    def entries(self) -> Iterator[Entry]:
        for k in self.keys():
            yield self.entry(k)

    def temp_files(self) -> list[Path]:
        return sorted(p for p in self.path.iterdir() if p.name.startswith(".tmp-"))

    def publish(self, key: str, built: Path, fields: Mapping[str, str]) -> Entry:
        """Move a finished shared object into the cache as ``key`` (caller holds the lock):
        fsync, rename, then write .meta atomically."""
        with open(built, "rb") as f:
            head = f.read(4)
            os.fsync(f.fileno())
        if head != b"\x7fELF":
            raise QolaError(f"{built} is not a shared object")
        meta = {"key": key, "size": str(built.stat().st_size), "sha256": file_sha256(built), **fields,
                "created": str(int(time.time()))}  # fmt: skip
        os.replace(built, self.path / f"{key}.so")
        self.write_atomic(f"{key}.meta", render_meta(meta).encode())
        return self.entry(key)

    def write_atomic(self, name: str, data: bytes) -> None:
        fd, tmp = tempfile.mkstemp(dir=self.path, prefix=f".tmp-{name}-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fchmod(f.fileno(), 0o644)
                os.fsync(f.fileno())
            os.replace(tmp, self.path / name)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        dfd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

    def remove(self, key: str) -> None:
        for suffix in (".meta", ".so"):  # .meta first: a reader never sees meta without .so as valid
            (self.path / f"{key}{suffix}").unlink(missing_ok=True)
        (self.path / "logs" / f"{key}.log").unlink(missing_ok=True)

    def remove_stale_temps(self, key: str) -> None:
        """Temp files of ``key`` left by dead lock holders (call with the key's lock held)."""
        now = time.time()
        for p in self.path.glob(f".tmp-{key}*"):
            try:
                if self.network and now - p.lstat().st_mtime < 3600:
                    continue  # may belong to a compile on another host
                shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
            except OSError:
                pass

    # ------------------------------------------------------------------ locks
    def lock_dir(self) -> Path:
        if not self.network:
            return self.path / "locks"
        d = Path(f"/tmp/qola-jit-locks-{os.geteuid()}")
        try:
            d.mkdir(mode=0o700)
        except FileExistsError:
            pass
        check_private_dir(d, follow=False)
        return d

    @contextmanager
    def lock(self, key: str, *, blocking: bool = True) -> Iterator[bool]:
        """flock the key's lock file (same file and protocol as the runtime). Yields False
        if ``blocking`` is False and another process holds it."""
        path = self.lock_dir() / f"{key}.lock"
        for _ in range(100):
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
            except OSError as exc:
                os.close(fd)
                if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                    yield False
                    return
                raise
            try:
                a, b = os.fstat(fd), os.stat(path)
                same = (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)
            except OSError:
                same = False
            if not same:
                os.close(fd)
                continue
            try:
                yield True
            finally:
                os.close(fd)
            return
        raise QolaError(f"cannot lock {path}: it keeps being replaced")

    # ------------------------------------------------------------------ maintenance
    def clean(self, *, everything: bool) -> list[Path]:
        """Remove broken entries, stale temp files, logs and compiler memos; with
        ``everything`` also the valid entries and the unpacked headers.
        Keys whose lock is held (a compile in progress) are skipped."""
        removed: list[Path] = []
        for e in self.entries():
            if e.problem is None and not everything:
                continue
            with self.lock(e.key, blocking=False) as got:
                if got:
                    removed += [p for p in (e.so, e.meta) if p.exists()]
                    self.remove(e.key)
        for p in self.temp_files():
            key = p.name[5:69]
            with self.lock(key, blocking=False) as got:
                if got:
                    removed.append(p)
                    shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
        for sub in ("logs", "compilers", *(("headers",) if everything else ())):
            d = self.path / sub  # unpacked headers may be in use by a compile: only with --all
            if d.is_dir():
                for p in d.iterdir():
                    removed.append(p)
                    if p.is_dir() and not p.is_symlink():
                        shutil.rmtree(p, ignore_errors=True)
                    else:
                        p.unlink(missing_ok=True)
        return removed
