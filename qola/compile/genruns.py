"""Each generator command of a module reused or rerun on its own (issue 41): what one run wrote
and read, kept in the module's stamp, and which runs of the last generation still hold.

A module's generators write into one output dir, in command order. For each run the stamp keeps
its key (:func:`run_key`: its command, the variables qola sets for it, the merged tuned configs
it names), what it read (:class:`qola.plan.genread.Deps`), the files it created or changed and
those it removed there (a snapshot of the dir before and after it), the generated sources new at
its turn (its group: whose files they are) and whether it read what the earlier runs wrote.

A run is reused when a run of the last generation had its key, its depfile still holds and every
file it wrote is still in the blob dir with the bytes it wrote (their sha256, kept in the stamp); then its files are linked from the blob dir into the new
staging dir at its turn, instead of running it, so the staging dir ends as a full run would leave it
(a removed generator's files are in no run: the sync removes them). Two runs that wrote or removed
the same file are reused together or not at all (the blob dir holds the last writer's bytes), and a
run that read the output dir only when every run before it is reused.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from qola.compile import gensums
from qola.compile.gensums import sums
from qola.plan import genread

FORMAT = gensums.FORMAT
STAMP = gensums.STAMP
GENERATED_EXTS = (".cu", ".cpp")
Snapshot = dict[str, tuple[int, int, int]]  # relative path -> (inode, size, mtime_ns)


@dataclass(frozen=True)
class RunRecord:
    """One generator command's run (see the module); ``ran`` False: an absent per-arch asm
    generator, skipped (its deps: the script's absence)."""

    key: str
    command: str
    deps: genread.Deps | None
    wrote: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    group: tuple[str, ...] = ()
    read_out: bool = False
    warnings: tuple[str, ...] = ()
    ran: bool = True
    sums: tuple[str, ...] = ()  # the sha256 of each of ``wrote``, as the run left it

    def to_json(self) -> dict[str, object]:
        return {
            "key": self.key,
            "command": self.command,
            "deps": None if self.deps is None else self.deps.to_json(),
            "wrote": list(self.wrote),
            "removed": list(self.removed),
            "group": list(self.group),
            "read_out": self.read_out,
            "warnings": list(self.warnings),
            "ran": self.ran,
            "sums": list(self.sums),
        }

    @classmethod
    def from_json(cls, doc: object) -> RunRecord:
        if not isinstance(doc, dict):
            raise ValueError("not a run record")
        strs = {k: tuple(str(x) for x in doc[k]) for k in ("wrote", "removed", "group", "warnings", "sums")}
        deps = genread.Deps.from_json(doc["deps"]) if doc["deps"] is not None else None
        return cls(
            str(doc["key"]), str(doc["command"]), deps, read_out=bool(doc["read_out"]), ran=bool(doc["ran"]), **strs
        )

    def touched(self) -> set[str]:
        return {*self.wrote, *self.removed}


def run_key(argv: Sequence[str], env: Sequence[tuple[str, str]], configs: Mapping[str, str]) -> str:
    """One run's key: its command (``argv``, the output dir as its token), the interpreter it names
    (``argv[0]``: :func:`qola.plan.genread.interpreter`, so a ``python3`` re-pointed from 3.11 to 3.13
    is another run), the variables qola sets for it, the digests of the merged configs its command names."""
    named = {n: d for n, d in configs.items() if any(n in a for a in argv)}
    payload = {
        "format": FORMAT,
        "deps": genread.FORMAT,
        "argv": list(argv),
        "python": genread.interpreter(argv[0]) if argv else None,
        "env": dict(env),
        "configs": named,
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def load(doc: object) -> list[RunRecord]:
    """The runs a stamp's ``doc`` holds ([]: none, or a stamp of another format)."""
    if not isinstance(doc, dict) or doc.get("runs_format") != FORMAT:
        return []
    try:
        return [RunRecord.from_json(r) for r in doc["runs"]]
    except (KeyError, TypeError, ValueError):
        return []


def reusable(prev: Sequence[RunRecord], keys: Sequence[str], blob: Path, env: Mapping[str, str]) -> dict[int, int]:
    """Which of the runs ``keys`` names (by index) reuse which run of ``prev`` (see the module)."""
    free = list(range(len(prev)))
    chosen: dict[int, int] = {}
    for i, key in enumerate(keys):
        j = next((j for j in free if prev[j].key == key), None)
        if j is not None and _holds(prev[j], blob, env):
            chosen[i] = j
            free.remove(j)
    changed = True
    while changed:  # drop what shares a file with a run not reused, or read the output of one
        changed = False
        kept = set(chosen.values())
        others = {f for j, r in enumerate(prev) if j not in kept for f in r.touched()}
        for i, j in sorted(chosen.items()):
            earlier_rerun = j != i or any(k not in chosen for k in range(i))
            if prev[j].touched() & others or (prev[j].read_out and earlier_rerun):
                del chosen[i]
                changed = True
                break
    return chosen


def _holds(run: RunRecord, blob: Path, env: Mapping[str, str]) -> bool:
    if run.deps is None or not genread.unchanged(run.deps, env):
        return False
    return len(run.sums) == len(run.wrote) and sums(blob, run.wrote) == run.sums


def snapshot(directory: Path) -> Snapshot:
    """Every file under ``directory`` (relative) with its inode, size and mtime."""
    out: Snapshot = {}
    for top, _, files in os.walk(directory):
        for name in files:
            path = os.path.join(top, name)
            try:
                st = os.lstat(path)
            except OSError:
                continue
            out[os.path.relpath(path, directory)] = (st.st_ino, st.st_size, st.st_mtime_ns)
    return out


def changes(before: Snapshot, after: Snapshot) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """(the files created or changed, those removed, the generated sources new) between two snapshots."""
    wrote = tuple(sorted(p for p, s in after.items() if before.get(p) != s))
    removed = tuple(sorted(p for p in before if p not in after))
    new = tuple(sorted(p for p in after if p not in before and p.endswith(GENERATED_EXTS)))
    return wrote, removed, new


def replay(run: RunRecord, blob: Path, staging: Path) -> None:
    """Leave in ``staging`` what ``run`` did there last time: its files, linked from ``blob``
    (copied where a link cannot be made), and the files it removed gone."""
    for rel in run.removed:
        (staging / rel).unlink(missing_ok=True)
    for rel in run.wrote:
        dst = staging / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.unlink(missing_ok=True)
        try:
            os.link(blob / rel, dst)
        except OSError:
            shutil.copy2(blob / rel, dst)
