"""Reading the small input files qola plans from: the manifest, and the kernel tree's module
table, ``aiter/jit/core.py`` and tuned-config CSVs.

Any of them may be a FIFO, a device (``/dev/zero``), a directory or huge. :func:`read_small`
opens without blocking (``O_NONBLOCK``: opening a FIFO for reading returns at once), checks with
``fstat`` on the open descriptor (so the file checked is the file read) that it is a regular file
of at most ``limit`` bytes, and never reads more than ``limit + 1`` bytes. A symlink is followed
unless ``nofollow`` (its target is what is checked). Every refusal is a :class:`QolaError`.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from qola.core.errors import QolaError

MiB = 1 << 20
MAX_MANIFEST = 4 * MiB
MAX_TABLE = 16 * MiB  # aiter/jit/optCompilerConfig.json (AITER's: about 60 KiB)
MAX_CORE = 8 * MiB  # aiter/jit/core.py (AITER's: about 40 KiB)
MAX_CSV = 256 * MiB  # one tuned-config CSV

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def open_regular(
    path: str | os.PathLike, *, limit: int, what: str, nofollow: bool = False, hint: str | None = None
) -> tuple[int, os.stat_result]:
    """(fd, its fstat) of the regular file ``path`` of at most ``limit`` bytes: opened without blocking
    (a FIFO), checked on the open descriptor (the file checked is the file read). The caller closes
    the fd. A missing file raises :class:`FileNotFoundError`; everything else is a :class:`QolaError`."""
    p = Path(path)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    if nofollow:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(p, flags)
    except FileNotFoundError:
        raise
    except ValueError:  # an embedded NUL
        raise QolaError(f"cannot read {what} {str(p)!r}: the path contains a NUL character", hint=hint) from None
    except OSError as exc:
        reason = "a symlink (not followed)" if nofollow and exc.errno == errno.ELOOP else exc.strerror
        raise QolaError(f"cannot read {what} {p}: {reason}", hint=hint) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise QolaError(
                f"{what} {p} is {_kind(st.st_mode)}, not a regular file; refusing to read it",
                hint=hint or "point qola at a plain file",
            )
        if st.st_size > limit:
            raise QolaError(
                f"{what} {p} is {st.st_size:,} bytes; at most {limit:,} are read",
                hint=hint or "is this the right file?",
            )
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def read_small(
    path: str | os.PathLike, *, limit: int, what: str, nofollow: bool = False, hint: str | None = None
) -> bytes:
    """The bytes of the regular file ``path`` (at most ``limit``). ``what`` names it in messages
    ("manifest", "module table"). A missing file raises :class:`FileNotFoundError` (callers decide
    whether that is an error); everything else is a :class:`QolaError`."""
    fd, _ = open_regular(path, limit=limit, what=what, nofollow=nofollow, hint=hint)
    p = Path(path)
    try:
        chunks, total = [], 0
        while total <= limit:
            chunk = os.read(fd, min(limit + 1 - total, MiB))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        if total > limit:
            raise QolaError(f"{what} {p} grew past {limit:,} bytes while being read", hint=hint)
        return b"".join(chunks)
    except OSError as exc:
        raise QolaError(f"cannot read {what} {p}: {exc.strerror}", hint=hint) from None
    finally:
        os.close(fd)


def read_text(
    path: str | os.PathLike, *, limit: int, what: str, encoding: str = "utf-8", hint: str | None = None
) -> str:
    """:func:`read_small` decoded; undecodable bytes are a :class:`QolaError`."""
    raw = read_small(path, limit=limit, what=what, hint=hint)
    try:
        return raw.decode(encoding)
    except UnicodeDecodeError as exc:
        raise QolaError(f"{what} {path} is not {encoding} text (byte {exc.start})", hint=hint) from None
