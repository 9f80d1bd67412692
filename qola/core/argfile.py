"""Argument lists that grow with input, kept within the OS's limits by construction.

Linux refuses one argument longer than ``MAX_ARG_STRLEN`` (32 pages: 128 KiB, its NUL included) and
a whole command line past ``ARG_MAX`` ("Argument list too long"). A list qola hands a child that
grows with what it is given (a CK ``--filter`` naming every kernel of a ``[usage]`` set or a narrowed
variant on several archs, a file list) goes through :func:`passed`: within :data:`THRESHOLD` it is
passed as it is; past it, written to a file (a JSON list) and replaced by one argument,
``<flag><path>``, that the child's wrapper reads back (qola's recorder,
``templates/genwrap/record_reads.py``, runs every generator and takes ``--qola-argv-file=PATH``).
Link lines have their own response files (``@file``: :mod:`qola.compile.link`, ninja's rspfile). A
tool that reads no list from a file decides by :func:`fits` and passes the list its own way: ninja's
targets (one per module) past it go into a manifest naming them as one phony target
(:func:`qola.compile.ninja.target_args`).

Standard library only (and :mod:`qola.core.fsutil`)."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

ONE_ARG_MAX = 128 * 1024  # Linux's MAX_ARG_STRLEN (32 pages of 4 KiB): one argument, its NUL included
THRESHOLD = 32 * 1024  # one argument, or the list together, past this goes by file (well within both limits)


def fits(args: Sequence[str], threshold: int = THRESHOLD) -> bool:
    """Whether ``args`` may go on a command line as they are: each, and all together, within ``threshold`` bytes."""
    sizes = [len(os.fsencode(a)) + 1 for a in args]
    return max(sizes, default=0) <= threshold and sum(sizes) <= threshold


def passed(args: Sequence[str], path: str | os.PathLike[str], flag: str, threshold: int = THRESHOLD) -> list[str]:
    """``args`` as they go on a child's command line: themselves while they :func:`fit <fits>`, else
    ``[flag + path]`` with ``args`` written to ``path`` as a JSON list (what the child's wrapper reads)."""
    if fits(args, threshold):
        return list(args)
    from qola.core.fsutil import atomic_write  # lazy: only a list past the threshold writes

    atomic_write(path, json.dumps(list(args)).encode("utf-8", "surrogateescape"))
    return [flag + os.fspath(path)]
