"""Open only what the JIT may trust — the rules the C++ runtime applies too (qola_jit_sys.cpp).

* Files are opened with ``O_NOFOLLOW | O_NONBLOCK`` (a symlink is refused, a FIFO never blocks)
  and checked with ``fstat`` *before* a byte is read: a regular file, at most ``max_size``
  bytes. Inputs verified by hash afterwards (``OUT/jit``, libraries) may pass ``follow=True``.
* Cache files and directories must also be *trusted*: owned by the current user or root and
  not writable by group or others (:func:`untrusted`).

Errors are :class:`Refused` (a :class:`~qola.core.errors.QolaError`: exit 2 at the CLI, or a
"problem" string where the cache reports broken entries); ``missing`` says the path did not exist.
Every open goes through the one checked open, :func:`qola.core.inputs.open_checked` (type, size,
owner and mode on the open descriptor); this module only turns its refusals into :class:`Refused`.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from qola.core import inputs
from qola.core.errors import QolaError


class Refused(QolaError):
    """A file or directory the JIT will not use (type, owner, mode, size) or cannot read."""

    def __init__(self, message: str, hint: str | None = None, *, missing: bool = False):
        super().__init__(message, hint=hint)
        self.missing = missing


_kind = inputs.kind
untrusted = inputs.untrusted


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
def open_regular(path: str | os.PathLike[str], *, max_size: int, trusted: bool = False, follow: bool = False,
                 dir_fd: int | None = None) -> Iterator[tuple[int, os.stat_result]]:  # fmt: skip
    """(fd, fstat) of a regular file opened for reading, checked before anything is read: the one
    checked open, :func:`qola.core.inputs.open_checked`, its refusals as :class:`Refused`."""
    try:
        where = path if dir_fd is None else inputs.At(dir_fd, path)
        fd, st = inputs.open_checked(where, limit=max_size, what="JIT file", follow=follow, trusted=trusted)
    except FileNotFoundError as exc:
        raise Refused(f"cannot read {path}: {exc.strerror}", missing=True) from None
    except QolaError as exc:
        raise Refused(exc.message.replace("a symlink (not followed)", "it is a symbolic link"), exc.hint) from None
    try:
        yield fd, st
    finally:
        os.close(fd)


def read_fd(fd: int, max_size: int, what: object) -> bytes:
    """All bytes of ``fd`` from offset 0, at most ``max_size`` (the file may grow meanwhile)."""
    try:
        return inputs.read_fd(fd, max_size, "JIT file", what)
    except QolaError as exc:
        raise Refused(exc.message, exc.hint) from None


sha256_fd = inputs.sha256_fd


def read_regular(path: str | os.PathLike[str], *, max_size: int, trusted: bool = False, follow: bool = False) -> bytes:
    """The bytes of a regular file (:func:`open_regular`: owner and mode with ``trusted``)."""
    with open_regular(path, max_size=max_size, trusted=trusted, follow=follow) as (fd, _):
        return read_fd(fd, max_size, path)


def sha256_regular(path: str | os.PathLike[str], *, max_size: int, trusted: bool = False, follow: bool = False,
                   expect_size: int | None = None) -> tuple[str, int]:  # fmt: skip
    """(sha256, size) of a regular file; with ``expect_size``, a file of another size is not
    hashed at all (returns ``("", size)``)."""
    with open_regular(path, max_size=max_size, trusted=trusted, follow=follow) as (fd, st):
        if expect_size is not None and st.st_size != expect_size:
            return "", st.st_size
        return sha256_fd(fd, max_size)
