"""The JIT cache on disk — the same layout, checks and locking as the C++ runtime.

    <cache>/<key>.so        a compiled unit (shared object)
    <cache>/<key>.meta      "qola-jit-entry 1" + key, size, sha256, unit, module, compiler,
                            compiler_id, content_key, source_sha256, headers_sha256, created;
                            written after the .so; both by temp + fsync + rename
    <cache>/.tmp-<key>-*    in-flight temp files (a killed compile's are stale: removed by the next
                            compile, `qola jit clean` or `verify --fix`, reported by `verify`)
    <cache>/locks/<key>.lock  flock per key; headers-<sha>.lock per header bundle
                            (network file systems: /tmp/qola-jit-locks-<uid>/)
    <cache>/logs/<key>.log  compiler output (kept when a compile fails)
    <cache>/headers/<sha>/  unpacked header bundles (checked against the library's digest before use)
    <cache>/compilers/      compiler identity memos

The cache dir must be owned by the user and not writable by group/others; every subdir and file
in it must be a real directory / regular file (no symlinks, FIFOs, devices) owned by the user or
root and not writable by group/others (:mod:`qola.jit.safeio`). An entry is valid only if its
.meta names the key, the key is sha256 of the recorded content key and compiler identity, and
the .so has the recorded size and sha256. Configuration comes in as arguments (``env``
mappings), never from os.environ here.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import re
import shutil
import stat
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from qola.errors import QolaError
from qola.jit import safeio
from qola.jit.key import entry_key, file_sha256

META_HEAD = "qola-jit-entry 1\n"
SUBDIRS = ("logs", "headers", "compilers", "locks")
PROVENANCE = ("content_key", "source_sha256", "compiler_id")
NETWORK_FS = {
    0x6969: "nfs", 0x517B: "smb", 0xFF534D42: "cifs", 0xFE534D42: "smb2", 0x00C36400: "ceph",
    0x0BD00BD0: "lustre", 0x47504653: "gpfs", 0x5346414F: "afs", 0x01021997: "9p", 0x65735546: "fuse",
    0x19830326: "beegfs", 0xAAD7AAEA: "panfs", 0x20030528: "orangefs", 0x7461636F: "ocfs2", 0x01161970: "gfs2",
}  # fmt: skip
_HEX64 = re.compile(r"[0-9a-f]{64}")
_TEMP = re.compile(r"\.tmp-([0-9a-f]{64})")
LOCKLESS_STALE_S = 600  # a temp file without a lock (e.g. a memo being written) is stale after this
NETWORK_STALE_S = 3600  # on network file systems a compile on another host may own it
NOT_A_DIR_HINT = "give a directory (it is created if missing) with --cache-dir or QOLA_JIT_CACHE_DIR"


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
        raise QolaError(f"JIT cache dir {path} is not a directory",
                        hint=NOT_A_DIR_HINT)
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


def check_subdir(path: Path) -> None:
    """A cache subdir: a real directory (not a symlink) owned by us or root, not group/other-writable."""
    try:
        safeio.check_dir(path, what="JIT cache dir")
    except safeio.Refused as exc:
        raise QolaError(exc.message, hint=f"remove it (it is recreated) or run `chmod go-w {path}`") from None


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


def _mkdir_private(d: Path, what: str) -> None:
    """``mkdir d`` at 0700 unless it exists; any other failure is a QolaError (``what`` names it)."""
    try:
        d.mkdir(mode=0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise QolaError(f"cannot create {what}{d}: {exc.strerror}") from None


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
            return self.so.lstat().st_size
        except OSError:
            return 0


@dataclass(frozen=True)
class Temp:
    path: Path
    lock: str | None  # the lock whose holder owns it (None: no lock; judged by age)
    stale: bool  # False: a compile/unpack holding its lock is still running (or too young to judge)


def parse_meta(text: str) -> dict[str, str]:
    """Fields of a .meta, exactly as the runtime reads them ('\\n'-separated, first space splits)."""
    fields = {}
    for line in text.split("\n")[1:]:
        k, sep, v = line.partition(" ")
        if sep:
            fields[k] = v
    return fields


def render_meta(fields: Mapping[str, str]) -> str:
    for k, v in fields.items():
        if " " in k or "\n" in k or "\n" in str(v):
            raise ValueError(f"bad .meta field {k!r}: {v!r}")
    return META_HEAD + "".join(f"{k} {v}\n" for k, v in fields.items())


def provenance_problem(fields: Mapping[str, str], key: str) -> str | None:
    """Why a .meta does not say what the entry was built from (None: it does, consistently)."""
    if not all(_HEX64.fullmatch(fields.get(k, "")) for k in PROVENANCE) or not (
        fields.get("headers_sha256") == "" or _HEX64.fullmatch(fields.get("headers_sha256", "-"))
    ):
        return "no record of its sources in .meta (built by an older qola or damaged; rebuilt on next use)"
    if entry_key(fields["content_key"], fields["compiler_id"]) != key:
        return ".meta content key and compiler identity do not give this key"
    return None


class JitCache:
    """One cache directory, or (``readonly``) a prebuilt dir: trusted, but only read."""

    def __init__(self, path: Path, *, create: bool = True, check: bool = True, readonly: bool = False):
        self.path = Path(path)
        self.readonly = readonly
        if self.path.exists() and not self.path.is_dir():
            raise QolaError(f"JIT cache dir {self.path} is not a directory",
                            hint=NOT_A_DIR_HINT)
        if create and not readonly:
            try:
                self.path.mkdir(mode=0o700, parents=True, exist_ok=True)
            except OSError as exc:
                hint = "give a writable directory with --cache-dir or QOLA_JIT_CACHE_DIR"
                raise QolaError(f"cannot create JIT cache dir {self.path}: {exc.strerror}", hint=hint) from None
        if readonly:
            try:
                safeio.check_dir(self.path, follow=True, what="prebuilt JIT dir")
            except safeio.Refused as exc:
                raise QolaError(exc.message, hint=exc.hint) from None
        elif check:
            check_private_dir(self.path)
        if check and not readonly:
            for sub in SUBDIRS:
                d = self.path / sub
                if create and not os.path.lexists(d):
                    _mkdir_private(d, "")
                if os.path.lexists(d):
                    check_subdir(d)
        self.network = network_fs(self.path) if self.path.exists() else None

    # ------------------------------------------------------------------ entries
    def entry(self, key: str) -> Entry:
        """The entry ``key``, checked as the runtime checks it before dlopen."""
        so, meta = self.path / f"{key}.so", self.path / f"{key}.meta"
        try:
            text = safeio.read_regular(meta, max_size=safeio.MAX_META, trusted=True).decode(errors="surrogateescape")
        except safeio.Refused as exc:
            if exc.missing:
                why = "missing" if not os.path.lexists(so) else "no .meta (interrupted write)"
                return Entry(key, so, meta, {}, why)
            return Entry(key, so, meta, {}, exc.message)
        fields = parse_meta(text)
        size_text = fields.get("size", "")
        if (not text.startswith(META_HEAD) or fields.get("key") != key or not _HEX64.fullmatch(fields.get("sha256", ""))
                or not (size_text.isascii() and size_text.isdigit() and len(size_text) <= 19)):  # fmt: skip
            return Entry(key, so, meta, fields, "malformed .meta")
        if why := provenance_problem(fields, key):
            return Entry(key, so, meta, fields, why)
        try:
            digest, size = safeio.sha256_regular(so, max_size=safeio.MAX_OBJECT, trusted=True,
                                                 expect_size=int(size_text))  # fmt: skip
        except safeio.Refused as exc:
            return Entry(key, so, meta, fields, ".meta without .so" if exc.missing else exc.message)
        if str(size) != size_text:
            return Entry(key, so, meta, fields, f"size {size} != {size_text} (truncated?)")
        if digest != fields["sha256"]:
            return Entry(key, so, meta, fields, "sha256 mismatch (corrupted)")
        return Entry(key, so, meta, fields, None)

    def keys(self) -> list[str]:
        found = set()
        for p in self.path.iterdir():
            if p.suffix in (".so", ".meta") and _HEX64.fullmatch(p.stem):
                found.add(p.stem)
        return sorted(found)

    def entries(self) -> Iterator[Entry]:
        for k in self.keys():
            yield self.entry(k)

    def temps(self) -> list[Temp]:
        """Temp files of compiles (cache root), unpacks (headers/) and atomic writes (all dirs):
        stale when no process holds their lock (or, without a lock, when they are old)."""
        out = []
        now = time.time()
        for sub, prefix in (("", ""), ("headers", "headers-"), ("compilers", None), ("logs", None)):
            d = self.path / sub if sub else self.path
            try:
                names = sorted(n for n in os.listdir(d) if n.startswith(".tmp-"))
            except OSError:
                continue
            for n in names:
                p = d / n
                try:
                    age = now - p.lstat().st_mtime
                except OSError:
                    continue
                m = _TEMP.match(n)
                lock = f"{prefix}{m.group(1)}" if m and prefix is not None else None
                if lock is None or (self.network and age < NETWORK_STALE_S):
                    out.append(Temp(p, lock, age >= (NETWORK_STALE_S if self.network else LOCKLESS_STALE_S)))
                    continue
                with self.lock(lock, blocking=False) as got:
                    out.append(Temp(p, lock, bool(got)))
        return out

    def temp_files(self) -> list[Path]:
        return [t.path for t in self.temps()]

    def remove_temp(self, t: Temp) -> bool:
        """Remove a stale temp (under its lock, re-checked); False if it is in use now."""
        if t.lock is None:
            _remove(t.path)
            return True
        with self.lock(t.lock, blocking=False) as got:
            if got:
                _remove(t.path)
            return bool(got)

    def remove_stale_temps(self, key: str | None = None) -> list[Path]:
        """Stale temps (all, or those of ``key`` when the caller holds its lock)."""
        removed = []
        for t in self.temps():
            if key is not None and t.lock == key:
                _remove(t.path)
                removed.append(t.path)
            elif key is None and t.stale and self.remove_temp(t):
                removed.append(t.path)
        return removed

    def publish(self, key: str, built: Path, fields: Mapping[str, str]) -> Entry:
        """Move a finished shared object into the cache as ``key`` (caller holds the lock):
        fsync, rename, then write .meta atomically. ``fields`` carry the provenance."""
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

    # ------------------------------------------------------------------ locks
    def lock_dir(self) -> Path:
        d = Path(f"/tmp/qola-jit-locks-{os.geteuid()}") if self.network else self.path / "locks"
        _mkdir_private(d, "the lock dir ")
        if self.network:
            check_private_dir(d, follow=False)
        else:
            check_subdir(d)
        return d

    @contextmanager
    def lock(self, key: str, *, blocking: bool = True) -> Iterator[bool]:
        """flock the key's lock file (same file and protocol as the runtime). Yields False
        if ``blocking`` is False and another process holds it."""
        if self.readonly:
            raise QolaError(f"{self.path} is a prebuilt dir: it is never locked or written")
        path = self.lock_dir() / f"{key}.lock"
        for _ in range(100):
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK, 0o600)
            except OSError as exc:
                raise QolaError(f"cannot open the lock {path}: {exc.strerror}") from None
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
                    removed += [p for p in (e.so, e.meta) if os.path.lexists(p)]
                    self.remove(e.key)
        removed += self.remove_stale_temps()
        for sub in ("logs", "compilers", *(("headers",) if everything else ())):
            d = self.path / sub  # unpacked headers may be in use by a compile: only with --all
            if d.is_dir() and not d.is_symlink():
                for p in d.iterdir():
                    if p.name.startswith(".tmp-"):
                        continue  # temps: above, only when stale
                    removed.append(p)
                    _remove(p)
        return removed


def _remove(p: Path) -> None:
    """Remove a file, symlink or directory tree (never following a link)."""
    try:
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
    except OSError:
        pass
