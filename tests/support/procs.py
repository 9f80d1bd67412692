"""Processes seen through /proc: a process's descendants, and which of some pids still run (the
tests that a killed build or a timed-out runner leaves no children); the signal dispositions a child
that a test signals starts with."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children, their children, ...)."""
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                ppid = int(Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            kids.setdefault(ppid, []).append(int(d))
    found, todo = [], [pid]
    while todo:
        todo += kids.get(todo.pop(), [])
        found += [k for k in todo if k not in found]
    return found


def alive_after(pids: list[int], timeout: float) -> list[int]:
    """Those of ``pids`` still running (not zombies) after up to ``timeout`` seconds."""
    deadline = time.time() + timeout
    while True:
        alive = []
        for p in pids:
            try:
                if Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[0] not in "ZX":
                    alive.append(p)
            except (OSError, IndexError):
                pass
        if not alive or time.time() >= deadline:
            return alive
        time.sleep(0.1)


SIGNALLED = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


def default_dispositions() -> None:
    """``preexec_fn`` of a child a test will signal: SIGTERM, SIGHUP and SIGINT at their defaults. A
    test run under ``nohup`` (SIGHUP ignored) or from a shell's background job (SIGINT ignored) passes
    that ``SIG_IGN`` on to its children, and qola rightly keeps an inherited ``SIG_IGN``: a test that
    then signals the child would wait for an end that never comes."""
    for sig in SIGNALLED:
        signal.signal(sig, signal.SIG_DFL)
