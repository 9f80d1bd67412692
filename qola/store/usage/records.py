"""Usage records: what the JIT runtime writes when recording is on (``QOLA_USAGE_DIR``), read back.

One file per process (``qola-usage-<host>-<pid>-<random>.rec``), one line per variant the process
resolved, tab-separated (:data:`qola.jit.format.USAGE_FIELDS`), ending with the first 16 hex digits
of the sha256 of the line before them. A line that does not parse, has a bad sum or names an
unusable variant is skipped and counted (a process killed mid-write leaves at most one torn last
line): merging never trusts a record file. :func:`render` writes a line exactly as the runtime
does (tests and Python callers that record by hand).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from qola.core import rules
from qola.core.errors import QolaError
from qola.jit import format as fmt
from qola.plan.tree.files import read_small

MAX_FILES = 100_000  # record files one merge reads
MAX_FILE = 4 * fmt.USAGE_MAX_FILE  # a record file bigger than this was not written by the runtime


@dataclass(frozen=True)
class Record:
    event: str  # prebuilt | cache | compile | refused | failed | ahead (a recorded variant built ahead)
    module: str  # the module's manifest name
    md_name: str  # its library name (<namespace>_<name>)
    unit: str  # the variant: the instance file stem
    arch: str  # the library's archs, ';'-joined
    build_key: str  # the output's build key ("" when the library did not know it)
    host: str
    pid: int
    time: int


@dataclass
class ReadResult:
    records: list[Record] = field(default_factory=list)
    files: int = 0
    bad_lines: int = 0  # torn, damaged or foreign lines (skipped)
    problems: list[str] = field(default_factory=list)  # the first few, for the message
    first_seen: dict[tuple[str, str], str] = field(default_factory=dict)  # (module, unit) -> "file:line"


def _sum(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[: fmt.USAGE_SUM_LEN]


def render(rec: Record) -> str:
    """The line the runtime writes for ``rec`` (with its trailing newline)."""
    body = "\t".join([fmt.USAGE_HEAD, rec.event, rec.module, rec.md_name, rec.unit, rec.arch, rec.build_key,
                      rec.host, str(rec.pid), str(rec.time)])  # fmt: skip
    return f"{body}\t{_sum(body)}\n"


def parse_line(line: str) -> Record | str:
    """The record of one line, or why it is not one."""
    if len(line.encode()) > fmt.USAGE_MAX_LINE:
        return "longer than a record may be"
    body, sep, got = line.rstrip("\n").rpartition("\t")
    if not sep or got != _sum(body):
        return "torn or damaged (its checksum does not match)"
    parts = body.split("\t")
    if len(parts) != len(fmt.USAGE_FIELDS) or parts[0] != fmt.USAGE_HEAD:
        return f"not a {fmt.USAGE_HEAD!r} record"
    _, event, module, md_name, unit, arch, key, host, pid, when = parts
    if event not in fmt.USAGE_EVENTS:
        return f"unknown event {event!r}"
    for what, value, problem in (("module", module, rules.module_key_problem(module)),
                                 ("library", md_name, rules.md_name_problem(md_name)),
                                 ("variant", unit, rules.usage_name_problem(unit))):  # fmt: skip
        if problem:
            return f"{what} name {value!r} {problem}"
    if key and not fmt.HEX64.fullmatch(key):
        return f"build key {key!r} is not 64 hex digits"
    if not (pid.isdigit() and when.isdigit()):
        return "pid or time is not a number"
    return Record(event, module, md_name, unit, arch, key, host, int(pid), int(when))


def record_files(paths: Sequence[str | os.PathLike[str]]) -> list[Path]:
    """``paths`` with each directory replaced by the record files in it (not recursive), sorted."""
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            out += sorted(
                q for q in p.iterdir() if q.name.startswith(fmt.USAGE_PREFIX) and q.name.endswith(fmt.USAGE_SUFFIX)
            )
        elif p.exists():
            out.append(p)
        else:
            raise QolaError(
                f"usage records {str(p)!r} not found",
                hint="pass record files or the QOLA_USAGE_DIR directories the runs wrote into",
            )
        if len(out) > MAX_FILES:
            raise QolaError(
                f"more than {MAX_FILES:,} record files", hint="merge them in parts, then merge the fragments"
            )
    return out


def read(paths: Iterable[Path]) -> ReadResult:
    """Every valid record of the files ``paths`` (regular files, bounded; see the module doc)."""
    res = ReadResult()
    for path in paths:
        raw = read_small(
            path,
            limit=MAX_FILE,
            what="usage record file",
            hint="record files are written by the JIT runtime (QOLA_USAGE_DIR)",
        )
        res.files += 1
        text = raw.decode("utf-8", errors="replace")
        for n, line in enumerate(text.splitlines(keepends=True), 1):
            got = parse_line(line)
            if isinstance(got, Record):
                res.records.append(got)
                res.first_seen.setdefault((got.module, got.unit), f"{path}:{n}")
            else:
                res.bad_lines += 1
                if len(res.problems) < 5:
                    res.problems.append(f"{path}:{n}: {got}")
    return res
