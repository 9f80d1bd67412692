"""The JIT cache on disk — the same layout, checks and locking as the C++ runtime. The format
(names, .meta fields, modes, limits) is :mod:`qola.jit.format`, specified in docs/jit-cache.md:

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

import contextlib
import ctypes
import math
import os
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from qola.core import inputs
from qola.core.errors import QolaError
from qola.core.fsutil import atomic_write, commit, remove
from qola.core.hashing import file_sha256
from qola.core.owner import private_problem
from qola.jit import format as fmt
from qola.jit import safeio
from qola.jit.format import HEX64, NETWORK_FS, parse_meta, render_meta
from qola.jit.key import entry_key

NOT_A_DIR_HINT = "give a directory (it is created if missing) with --cache-dir or QOLA_JIT_CACHE_DIR"


def check_private_dir(path: Path, *, follow: bool = True) -> None:
    """Raise QolaError unless ``path`` is a directory owned by us and not group/other-writable."""
    try:
        st = os.stat(path) if follow else os.lstat(path)
    except OSError as exc:
        raise QolaError(f"cannot use JIT cache dir {path}: {exc.strerror}") from exc
    problem = private_problem(st)
    if problem is None:
        return
    kind, why = problem
    if kind == "type":
        raise QolaError(f"JIT cache dir {path} is {why}", hint=NOT_A_DIR_HINT)
    hint = "set QOLA_JIT_CACHE_DIR to a directory of your own" if kind == "owner" else None
    raise QolaError(
        f"refusing JIT cache dir {path}: {why}", hint=hint or f"run `chmod go-w {path}` or set QOLA_JIT_CACHE_DIR"
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


def provenance_problem(fields: Mapping[str, str], key: str) -> str | None:
    """Why a .meta does not say what the entry was built from (None: it does, consistently)."""
    if not all(HEX64.fullmatch(fields.get(k, "")) for k in fmt.PROVENANCE) or not (
        fields.get("headers_sha256") == "" or HEX64.fullmatch(fields.get("headers_sha256", "-"))
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
            raise QolaError(f"JIT cache dir {self.path} is not a directory", hint=NOT_A_DIR_HINT)
        if create and not readonly:
            try:
                self.path.mkdir(mode=fmt.DIR_MODE, parents=True, exist_ok=True)
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
            for sub in fmt.SUBDIRS:
                d = self.path / sub
                if create and not os.path.lexists(d):
                    _make_dir(d, "")
                if os.path.lexists(d):
                    check_subdir(d)
        self.network = network_fs(self.path) if self.path.exists() else None

    # ------------------------------------------------------------------ entries
    def entry(self, key: str) -> Entry:
        """The entry ``key``, checked as the runtime checks it before dlopen."""
        so, meta = self.path / fmt.so_name(key), self.path / fmt.meta_name(key)
        try:
            text = safeio.read_regular(meta, max_size=fmt.MAX_META, trusted=True).decode(errors="surrogateescape")
        except safeio.Refused as exc:
            if exc.missing:
                why = "missing" if not os.path.lexists(so) else "no .meta (interrupted write)"
                return Entry(key, so, meta, {}, why)
            return Entry(key, so, meta, {}, exc.message)
        fields = parse_meta(text)
        size_text = fields.get("size", "")
        if (not text.startswith(fmt.META_HEAD) or fields.get("key") != key or not HEX64.fullmatch(fields.get("sha256", ""))
                or not (size_text.isascii() and size_text.isdigit() and len(size_text) <= fmt.MAX_SIZE_DIGITS)):  # fmt: skip
            return Entry(key, so, meta, fields, "malformed .meta")
        if problem := provenance_problem(fields, key):
            return Entry(key, so, meta, fields, problem)
        try:
            digest, size = safeio.sha256_regular(so, max_size=fmt.MAX_OBJECT, trusted=True,
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
            if p.suffix in (fmt.SO_SUFFIX, fmt.META_SUFFIX) and HEX64.fullmatch(p.stem):
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
        for sub, prefix in (("", ""), (fmt.HEADERS, fmt.HEADERS_LOCK_PREFIX), (fmt.COMPILERS, None), (fmt.LOGS, None)):
            d = self.path / sub if sub else self.path
            try:
                names = sorted(n for n in os.listdir(d) if n.startswith(fmt.TEMP_PREFIX))
            except OSError:
                continue
            for n in names:
                p = d / n
                try:
                    age = now - p.lstat().st_mtime
                except OSError:
                    continue
                m = fmt.TEMP_RE.match(n)
                lock = f"{prefix}{m.group(1)}" if m and prefix is not None else None
                if lock is None or (self.network and age < fmt.NETWORK_STALE_S):
                    out.append(Temp(p, lock, age >= (fmt.NETWORK_STALE_S if self.network else fmt.LOCKLESS_STALE_S)))
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
        fsync, rename, then write .meta atomically. ``fields`` carry the provenance (every
        :data:`~qola.jit.format.META_FIELDS` but key, size, sha256 and created)."""
        fd, _ = inputs.open_checked(built, limit=fmt.MAX_OBJECT, what="compiled object", follow=False)
        try:
            head = os.pread(fd, 4, 0)
        finally:
            os.close(fd)
        if head != b"\x7fELF":
            raise QolaError(f"{built} is not a shared object")
        meta = {"key": key, "size": str(built.stat().st_size), "sha256": file_sha256(built), **fields,
                "created": str(int(time.time()))}  # fmt: skip
        os.chmod(built, fmt.FILE_MODE)
        commit(built, self.path / fmt.so_name(key))
        self.write_atomic(fmt.meta_name(key), render_meta(meta).encode())
        return self.entry(key)

    def write_atomic(self, name: str, data: bytes) -> None:
        """``<cache>/<name>`` by temp (``.tmp-<name>-…``, which :meth:`temps` knows) + fsync + rename."""
        atomic_write(self.path / name, data, fmt.FILE_MODE, temp_prefix=fmt.temp_prefix(name), sync_dir=True)

    def remove(self, key: str) -> None:
        for name in (fmt.meta_name(key), fmt.so_name(key)):  # .meta first: never a .meta without its .so
            (self.path / name).unlink(missing_ok=True)
        (self.path / fmt.LOGS / fmt.log_name(key)).unlink(missing_ok=True)

    # ------------------------------------------------------------------ locks
    def lock_dir(self) -> Path:
        d = fmt.network_lock_dir(os.geteuid()) if self.network else self.path / fmt.LOCKS
        _make_dir(d, "the lock dir ")
        if self.network:
            check_private_dir(d, follow=False)
        else:
            check_subdir(d)
        return d

    @contextmanager
    def lock(self, key: str, *, blocking: bool = True, wait: float = math.inf) -> Iterator[bool]:
        """flock the key's lock file (same file and protocol as the runtime). Yields False
        if ``blocking`` is False and another process holds it. Blocking, it waits up to ``wait``
        seconds, saying so (:func:`qola.core.lock.wait_flock`: a QolaError past it, Interrupted on SIGTERM)."""
        from qola.core.lock import try_flock, wait_flock  # lazy: paid only by the callers that need it

        if self.readonly:
            raise QolaError(f"{self.path} is a prebuilt dir: it is never locked or written")
        path = self.lock_dir() / fmt.lock_name(key)
        for _ in range(100):
            try:
                fd = os.open(
                    path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK, fmt.PRIVATE_MODE
                )
            except OSError as exc:
                raise QolaError(f"cannot open the lock {path}: {exc.strerror}") from None
            try:
                got = wait_flock(fd, f"the JIT cache lock {path}", wait=wait) if blocking else try_flock(fd)
            except BaseException:
                os.close(fd)
                raise
            if not got:
                os.close(fd)
                if blocking:
                    raise QolaError(
                        f"waited {wait:g} s for the JIT cache lock {path}: another process still holds it",
                        hint="a JIT compile of the same kernel is running; try again later, or raise QOLA_LOCK_TIMEOUT",
                    )
                yield False
                return
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
        for sub in (fmt.LOGS, fmt.COMPILERS, *((fmt.HEADERS,) if everything else ())):
            d = self.path / sub  # unpacked headers may be in use by a compile: only with --all
            if d.is_dir() and not d.is_symlink():
                for p in d.iterdir():
                    if p.name.startswith(fmt.TEMP_PREFIX):
                        continue  # temps: above, only when stale
                    removed.append(p)
                    _remove(p)
        return removed


def _make_dir(d: Path, what: str) -> None:
    """Create ``d`` with the format's mode unless it exists (its checks come after)."""
    try:
        d.mkdir(mode=fmt.DIR_MODE)
    except FileExistsError:
        pass
    except OSError as exc:
        raise QolaError(f"cannot create {what}{d}: {exc.strerror}") from None


def _remove(p: Path) -> None:
    """:func:`qola.core.fsutil.remove` (never follows a link), ignoring what cannot be removed."""
    with contextlib.suppress(OSError):
        remove(p)
