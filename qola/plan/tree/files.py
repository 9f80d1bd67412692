"""Reading the small input files qola plans from: the manifest, and the kernel tree's module
table, ``aiter/jit/core.py`` and tuned-config CSVs.

Any of them may be a FIFO, a device (``/dev/zero``), a directory or huge: they are read through
the one checked open, :mod:`qola.core.inputs` (a regular file of at most ``limit`` bytes, checked on
the open descriptor before a byte is read). A symlink is followed unless ``nofollow``. Every refusal
is a :class:`QolaError`.
"""

from __future__ import annotations

import os

from qola.core import inputs
from qola.core.errors import QolaError

MiB = 1 << 20
MAX_MANIFEST = 4 * MiB
MAX_TABLE = 16 * MiB  # aiter/jit/optCompilerConfig.json (AITER's: about 60 KiB)
MAX_CORE = 8 * MiB  # aiter/jit/core.py (AITER's: about 40 KiB)
MAX_CSV = 256 * MiB  # one tuned-config CSV


def open_regular(
    path: str | os.PathLike[str], *, limit: int, what: str, nofollow: bool = False, hint: str | None = None
) -> tuple[int, os.stat_result]:
    """(fd, its fstat) of the regular file ``path`` of at most ``limit`` bytes:
    :func:`qola.core.inputs.open_checked`. The caller closes the fd."""
    return inputs.open_checked(path, limit=limit, what=what, follow=not nofollow, hint=hint)


def read_small(
    path: str | os.PathLike[str], *, limit: int, what: str, nofollow: bool = False, hint: str | None = None
) -> bytes:
    """The bytes of the regular file ``path`` (at most ``limit``): :func:`qola.core.inputs.read_checked`.
    ``what`` names it in messages ("manifest", "module table"). A missing file raises
    :class:`FileNotFoundError` (callers decide whether that is an error); everything else is a
    :class:`QolaError`."""
    return inputs.read_checked(path, limit=limit, what=what, follow=not nofollow, hint=hint)


def read_text(
    path: str | os.PathLike[str], *, limit: int, what: str, encoding: str = "utf-8", hint: str | None = None
) -> str:
    """:func:`read_small` decoded; undecodable bytes are a :class:`QolaError`."""
    raw = read_small(path, limit=limit, what=what, hint=hint)
    try:
        return raw.decode(encoding)
    except UnicodeDecodeError as exc:
        raise QolaError(f"{what} {path} is not {encoding} text (byte {exc.start})", hint=hint) from None
