"""The one file-hashing helper (sha256, streamed), on the one checked open (:mod:`qola.core.inputs`):
a FIFO, a device or a directory is refused before a byte is read, and so is a file over the limit
(checked with ``fstat`` before hashing: a sparse 2 TB file costs nothing)."""

from __future__ import annotations

import os

from qola.core import inputs
from qola.core.errors import QolaError

GiB = 1 << 30
MAX_HASHED = 64 * GiB  # a compiler, an archive, a library: anything larger is not what qola hashes


def file_sha256(path: str | os.PathLike[str], limit: int = MAX_HASHED) -> str:
    """sha256 of the regular file ``path`` (a symlink followed), at most ``limit`` bytes; anything
    else raises :class:`OSError` (:class:`TooLarge` for the size)."""
    return regular_file_sha256(path, limit, follow=True)[0]


class TooLarge(OSError):
    """A file over the size a caller allows (checked with ``fstat`` before anything is read)."""


def regular_file_sha256(
    path: str | os.PathLike[str], limit: int | None = None, *, follow: bool = False
) -> tuple[str, int]:
    """(sha256, size) of a regular file, opened without following a final symlink (unless ``follow``)
    and checked with ``fstat`` before reading: a FIFO, device or symlink raises OSError instead of
    hanging or being followed, and a file over ``limit`` bytes (a sparse 64 GiB file) raises
    :class:`TooLarge`."""
    cap = MAX_HASHED if limit is None else limit
    try:
        fd, st = inputs.open_checked(path, limit=1 << 62, what="file", follow=follow)
    except QolaError as exc:
        raise OSError(exc.message) from None
    try:
        if st.st_size > cap:
            raise TooLarge(f"{os.fspath(path)}: {st.st_size:,} bytes, over the {cap:,} allowed")
        digest, size = inputs.sha256_fd(fd, cap)
    finally:
        os.close(fd)
    if size > cap:
        raise TooLarge(f"{os.fspath(path)}: grew past the {cap:,} bytes allowed while being read")
    return digest, size
