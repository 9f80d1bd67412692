"""The one file-hashing helper (sha256, streamed)."""

from __future__ import annotations

import hashlib
import os
import stat


def file_sha256(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


class TooLarge(OSError):
    """A file over the size a caller allows (checked with ``fstat`` before anything is read)."""


def regular_file_sha256(path: str | os.PathLike, limit: int | None = None) -> tuple[str, int]:
    """(sha256, size) of a regular file, opened without following a final symlink and checked with
    ``fstat`` before reading: a FIFO, device or symlink raises OSError instead of hanging or being
    followed, and a file over ``limit`` bytes (a sparse 64 GiB file) raises :class:`TooLarge`."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags)
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise OSError(f"{os.fspath(path)}: not a regular file")
        if limit is not None and st.st_size > limit:
            raise TooLarge(f"{os.fspath(path)}: {st.st_size:,} bytes, over the {limit:,} allowed")
        h = hashlib.sha256()
        size = 0
        while chunk := f.read(1 << 20):
            h.update(chunk)
            size += len(chunk)
            if limit is not None and size > limit:
                raise TooLarge(f"{os.fspath(path)}: grew past the {limit:,} bytes allowed while being read")
    return h.hexdigest(), size
