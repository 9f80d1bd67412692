"""Open only what the JIT may trust — the rules the C++ runtime applies too (qola_jit_sys.cpp).

* Files are opened with ``O_NOFOLLOW | O_NONBLOCK`` (a symlink is refused, a FIFO never blocks)
  and checked with ``fstat`` *before* a byte is read: a regular file, at most ``max_size``
  bytes. Inputs verified by hash afterwards (``OUT/jit``, libraries) may pass ``follow=True``.
* Cache files and directories must also be *trusted*: owned by the current user or root and
  not writable by group or others (:func:`untrusted`).

Errors are :class:`Refused` (a :class:`~qola.core.errors.QolaError`: exit 2 at the CLI, or a
"problem" string where the cache reports broken entries); ``missing`` says the path did not exist.
Plain reads of untrusted inputs reuse :func:`qola.plan.tree.files.read_small`; what it cannot do (owner
and mode checks on the open descriptor, ``dir_fd``, hashing large files without reading them
into memory, comparing the size before hashing) is here.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from qola.core.errors import QolaError
from qola.jit.format import MiB


class Refused(QolaError):
    """A file or directory the JIT will not use (type, owner, mode, size) or cannot read."""

    def __init__(self, message: str, hint: str | None = None, *, missing: bool = False):
        super().__init__(message, hint=hint)
        self.missing = missing


def _kind(mode: int) -> str:
    kinds = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
             (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symlink"))  # fmt: skip
    for test, name in kinds:
        if test(mode):
            return name
    return "not a regular file"


def untrusted(st: os.stat_result) -> str | None:
    """Why a file/dir with this stat may not be trusted (None: owned by us or root, not g/o-writable)."""
    if st.st_uid not in (os.geteuid(), 0):
        return f"owned by uid {st.st_uid}, not by the current user (uid {os.geteuid()}) or root"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"writable by group or others (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def check_dir(path: Path, *, follow: bool = False, trusted: bool = True, what: str = "directory") -> os.stat_result:
    """``path`` must be a directory (not a symlink unless ``follow``), trusted unless told otherwise."""
    try:
        st = os.stat(path) if follow else os.lstat(path)
    except OSError as exc:
        raise Refused(f"cannot use {what} {path}: {exc.strerror}", missing=exc.errno == errno.ENOENT) from None
    if not stat.S_ISDIR(st.st_mode):
        raise Refused(f"refusing {what} {path}: it is {_kind(st.st_mode)}, not a directory")
    if trusted and (why := untrusted(st)):
        raise Refused(f"refusing {what} {path}: {why}", hint=f"remove it or run `chmod go-w {path}`")
    return st


@contextmanager
def open_regular(path: str | os.PathLike, *, max_size: int, trusted: bool = False, follow: bool = False,
                 dir_fd: int | None = None) -> Iterator[tuple[int, os.stat_result]]:  # fmt: skip
    """(fd, fstat) of a regular file opened for reading, checked before anything is read."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP and not follow:
            raise Refused(f"refusing {path}: it is a symbolic link") from None
        raise Refused(f"cannot read {path}: {exc.strerror}", missing=exc.errno == errno.ENOENT) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Refused(f"refusing {path}: it is {_kind(st.st_mode)}, not a regular file")
        if st.st_size > max_size:
            raise Refused(f"refusing {path}: {st.st_size} bytes, more than the {max_size} allowed")
        if trusted and (why := untrusted(st)):
            raise Refused(f"refusing {path}: {why}")
        yield fd, st
    finally:
        os.close(fd)


def read_fd(fd: int, max_size: int, what: object) -> bytes:
    """All bytes of ``fd`` from offset 0, at most ``max_size`` (the file may grow meanwhile)."""
    parts: list[bytes] = []
    total = off = 0
    while True:
        chunk = os.pread(fd, min(MiB, max_size + 1 - total), off)
        if not chunk:
            return b"".join(parts)
        parts.append(chunk)
        total += len(chunk)
        off += len(chunk)
        if total > max_size:
            raise Refused(f"refusing {what}: more than the {max_size} bytes allowed")


def sha256_fd(fd: int, limit: int) -> tuple[str, int]:
    """(sha256 hex, size) of ``fd`` from offset 0, reading at most ``limit`` + 1 bytes."""
    h, off = hashlib.sha256(), 0
    while off <= limit:
        chunk = os.pread(fd, MiB, off)
        if not chunk:
            break
        h.update(chunk)
        off += len(chunk)
    return h.hexdigest(), off


def read_regular(path: str | os.PathLike, *, max_size: int, trusted: bool = False, follow: bool = False) -> bytes:
    """The bytes of a regular file. Untrusted inputs that are followed through links (index.json,
    sources, the bundle: all verified afterwards) go through the tree inputs' reader
    (:func:`qola.plan.tree.files.read_small`); cache files through :func:`open_regular` (owner, mode)."""
    reader: Callable[..., bytes] | None = None
    if follow and not trusted:
        try:
            from qola.plan.tree.files import read_small  # lazy: paid only by the callers that need it
        except ImportError:  # a tree without the tree inputs' reader: the same checks below
            pass
        else:
            reader = read_small
    if reader is not None:
        try:
            return reader(path, limit=max_size, what="JIT input")
        except FileNotFoundError:
            raise Refused(f"cannot read {path}: No such file or directory", missing=True) from None
        except QolaError as exc:
            raise Refused(exc.message, exc.hint) from None
    with open_regular(path, max_size=max_size, trusted=trusted, follow=follow) as (fd, _):
        return read_fd(fd, max_size, path)


def sha256_regular(path: str | os.PathLike, *, max_size: int, trusted: bool = False, follow: bool = False,
                   expect_size: int | None = None) -> tuple[str, int]:  # fmt: skip
    """(sha256, size) of a regular file; with ``expect_size``, a file of another size is not
    hashed at all (returns ``("", size)``)."""
    with open_regular(path, max_size=max_size, trusted=trusted, follow=follow) as (fd, st):
        if expect_size is not None and st.st_size != expect_size:
            return "", st.st_size
        return sha256_fd(fd, max_size)
