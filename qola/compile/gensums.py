"""The generated files' bytes as their runs left them: each one's sha256, kept in the module's stamp
(:mod:`qola.compile.genruns`), checked before a run is reused and before the incremental path
compiles (:func:`altered`). Light on purpose: the no-op path imports it."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

from qola.core import inputs
from qola.core.errors import QolaError

STAMP = "stamp.json"  # beside the blob dir: the module's runs (qola.compile.codegen writes it)
FORMAT = 2  # the stamp's runs: 2, each written file's sha256 (sums)
MAX_GENERATED = 256 << 20  # bytes of one generated file qola hashes (as a generator's input: genread.MAX_INPUT)


def sums(directory: Path, names: Sequence[str]) -> tuple[str, ...]:
    """The sha256 of each of ``names`` under ``directory`` ("" for one that is not a regular file): a
    run's files are checked against these before it is reused (a generated source truncated in the
    build dir was reused for good, and the library built without its kernel)."""
    out = []
    for name in names:
        try:
            out.append(inputs.sha256_checked(directory / name, limit=MAX_GENERATED, what="generated file")[0])
        except (OSError, QolaError):
            out.append("")
    return tuple(out)


def _newer(blob: Path, since: int) -> list[str]:
    """The files under ``blob`` (relative) changed at or after ``since`` (ns): file times are as coarse
    as the kernel's tick, so a change in the stamp's own tick counts too (hashed, not trusted)."""
    found = []
    for top, _, names in os.walk(blob):
        for name in names:
            path = os.path.join(top, name)
            try:
                if os.lstat(path).st_mtime_ns >= since:
                    found.append(os.path.relpath(path, blob))
            except OSError:
                continue
    return found


def altered(blob: Path) -> list[str]:
    """The generated files in ``blob`` whose bytes are no longer those their run left: each file
    changed after the stamp beside it was written is hashed against the sha256 its run recorded (a
    touch alone keeps the bytes; a file cut short or edited in the build dir does not). The stamp is
    read only when a file is newer than it (a file gone or added changes the dir's listing, which the
    no-op record holds). No stamp, or one of another format: none."""
    stamp = blob.parent / STAMP
    try:
        since = stamp.stat().st_mtime_ns
    except OSError:
        return []
    if not (newer := _newer(blob, since)):
        return []
    try:
        doc = json.loads(inputs.read_record(stamp))
        runs = doc["runs"] if isinstance(doc, dict) and doc.get("runs_format") == FORMAT else []
        left: dict[str, str] = {}
        for run in runs:  # in command order: a file two runs wrote holds the later one's bytes
            left.update(zip(run["wrote"], run["sums"], strict=False))
    except (OSError, ValueError, KeyError, TypeError):
        return []
    return [n for n in sorted(newer) if n in left and sums(blob, [n]) != (left[n],)]
