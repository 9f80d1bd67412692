"""The one checked open for everything qola reads from outside itself: a kernel tree, a manifest, a
patches dir, a JIT cache, an output or build dir, what a remote service returns.

:func:`open_checked` opens without blocking (``O_NONBLOCK``: a FIFO opens at once and is then
refused), never follows a final symlink unless ``follow``, and checks on the open descriptor
(``fstat``: the file checked is the file read) that it is a regular file of at most ``limit`` bytes
and, with ``trusted``, owned by this user or root and not writable by group or others. Only then
is a byte read or hashed. :func:`read_checked` reads at most ``limit + 1`` bytes,
:func:`sha256_checked` hashes without holding the file, :func:`check_type` is the same check for a
path that is not opened (``lstat``: a directory expected, or a size/type test before a child reads
it). Every refusal is a :class:`~qola.core.errors.QolaError`; a missing file raises
:class:`FileNotFoundError` (callers decide whether that is an error).

``tests/core/test_shared_primitives.py`` keeps it the only open of such input.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from qola.core.errors import QolaError

MiB = 1 << 20

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISLNK, "a symbolic link"),
)


def kind(mode: int) -> str:
    """What a file of this mode is, in words ("a FIFO", "a directory", …)."""
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def untrusted(st: os.stat_result) -> str | None:
    """Why a file/dir with this stat may not be trusted (None: owned by us or root, not g/o-writable)."""
    if st.st_uid not in (os.geteuid(), 0):
        return f"owned by uid {st.st_uid}, not by the current user (uid {os.geteuid()}) or root"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"writable by group or others (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def check_stat(st: os.stat_result, path: object, *, limit: int, what: str, trusted: bool = False,
               hint: str | None = None) -> None:  # fmt: skip
    """The checks of :func:`open_checked` on a stat already taken."""
    if not stat.S_ISREG(st.st_mode):
        raise QolaError(
            f"{what} {path} is {kind(st.st_mode)}, not a regular file; refusing to read it",
            hint=hint or "point qola at a plain file",
        )
    if st.st_size > limit:
        raise QolaError(f"{what} {path} is {st.st_size:,} bytes; at most {limit:,} are read",
                        hint=hint or "is this the right file?")  # fmt: skip
    if trusted and (why := untrusted(st)):
        raise QolaError(f"refusing {what} {path}: {why}", hint=hint or f"remove it or run `chmod go-w {path}`")


@dataclass(frozen=True)
class At:
    """A file named relative to an open directory (``openat``): ``dir_fd`` and the ``name`` in it."""

    dir_fd: int
    name: str | os.PathLike[str]


def open_checked(
    where: str | os.PathLike[str] | At,
    *,
    limit: int,
    what: str,
    follow: bool = True,
    trusted: bool = False,
    hint: str | None = None,
) -> tuple[int, os.stat_result]:
    """(fd, its fstat) of the regular file ``where`` (see the module's docstring). The caller closes
    the fd."""
    path, dir_fd = (where.name, where.dir_fd) if isinstance(where, At) else (where, None)
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags, dir_fd=dir_fd)
    except FileNotFoundError:
        raise
    except ValueError:  # an embedded NUL
        raise QolaError(f"cannot read {what} {str(path)!r}: the path contains a NUL character", hint=hint) from None
    except OSError as exc:
        reason = "a symlink (not followed)" if not follow and exc.errno == errno.ELOOP else exc.strerror
        try:  # a socket (ENXIO), a device without a driver (ENODEV): say what it is
            mode = (os.stat if follow else os.lstat)(path, dir_fd=dir_fd).st_mode
        except (OSError, ValueError):
            mode = stat.S_IFREG
        if exc.errno != errno.ELOOP and not stat.S_ISREG(mode):
            reason = f"it is {kind(mode)}, not a regular file"
        raise QolaError(f"cannot read {what} {path}: {reason}", hint=hint) from None
    try:
        check_stat(os.fstat(fd), path, limit=limit, what=what, trusted=trusted, hint=hint)
    except BaseException:
        os.close(fd)
        raise
    return fd, os.fstat(fd)


def read_fd(fd: int, limit: int, what: str, path: object, hint: str | None = None) -> bytes:
    """All bytes of ``fd`` from offset 0, at most ``limit`` (a file that grows past it is refused)."""
    parts: list[bytes] = []
    total = 0
    try:
        while True:
            chunk = os.pread(fd, min(MiB, limit + 1 - total), total)
            if not chunk:
                return b"".join(parts)
            parts.append(chunk)
            total += len(chunk)
            if total > limit:
                raise QolaError(f"{what} {path} grew past {limit:,} bytes while being read", hint=hint)
    except OSError as exc:
        raise QolaError(f"cannot read {what} {path}: {exc.strerror}", hint=hint) from None


def read_checked(path: str | os.PathLike[str], *, limit: int, what: str, follow: bool = True, trusted: bool = False,
                 hint: str | None = None) -> bytes:  # fmt: skip
    """The bytes of the regular file ``path`` (at most ``limit``), checked before the first read."""
    fd, _ = open_checked(path, limit=limit, what=what, follow=follow, trusted=trusted, hint=hint)
    try:
        return read_fd(fd, limit, what, path, hint)
    finally:
        os.close(fd)


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


def sha256_checked(path: str | os.PathLike[str], *, limit: int, what: str, follow: bool = True, trusted: bool = False,
                   hint: str | None = None) -> tuple[str, int]:  # fmt: skip
    """(sha256, size) of the regular file ``path``, its size checked before a byte is hashed; one
    that grows past ``limit`` while hashed is refused."""
    fd, _ = open_checked(path, limit=limit, what=what, follow=follow, trusted=trusted, hint=hint)
    try:
        digest, size = sha256_fd(fd, limit)
    finally:
        os.close(fd)
    if size > limit:
        raise QolaError(f"{what} {path} grew past {limit:,} bytes while being hashed", hint=hint)
    return digest, size


def check_type(path: str | os.PathLike[str], *, want: str, what: str, follow: bool = False, limit: int | None = None,
               hint: str | None = None) -> os.stat_result:  # fmt: skip
    """``path`` (not opened: a child reads it, or it is listed) must be ``want`` ("file": a regular
    file of at most ``limit`` bytes; "dir": a directory); a symbolic link only with ``follow``.
    A missing path raises :class:`FileNotFoundError`."""
    try:
        st = os.stat(path) if follow else os.lstat(path)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise QolaError(f"cannot use {what} {path}: {exc.strerror}", hint=hint) from None
    test = stat.S_ISDIR if want == "dir" else stat.S_ISREG
    if not test(st.st_mode):
        raise QolaError(
            f"{what} {Path(path)} is {kind(st.st_mode)}, not a {'directory' if want == 'dir' else 'regular file'}",
            hint=hint,
        )
    if limit is not None and want != "dir" and st.st_size > limit:
        raise QolaError(f"{what} {path} is {st.st_size:,} bytes; at most {limit:,} are read",
                        hint=hint or "is this the right file?")  # fmt: skip
    return st


MAX_RECORD = 64 * MiB  # a record, stamp or cache entry qola wrote itself (JSON)
MAX_SOURCE = 64 * MiB  # one source or header file of a kernel tree


def read_record(path: str | os.PathLike[str], *, limit: int = MAX_RECORD, what: str = "record") -> str:
    """The text of a small file qola wrote itself (a record, a stamp, a cache entry, a child's output
    file) through the checked read; a refusal is an :class:`OSError` (callers treat the file as
    absent or broken, as for any unreadable one)."""
    try:
        return read_checked(path, limit=limit, what=what).decode("utf-8", "surrogateescape")
    except QolaError as exc:
        raise OSError(exc.message) from None
