"""Progress without a terminal: plain lines, as ninja prints ``[n/N]`` in a CI log.

Piped to a file (CI, CMake's ``execute_process``) a build says, at each module's end and at least
every :data:`EVERY` seconds while it runs, one line: what is done of the total, the phase, the unit
that has been running longest and the time since the build began::

    qola: [12/40] compiling, 31 s: longest running: fmha_fwd_d128.o (25 s)
    qola: [13/40] module_rmsnorm done, 33 s

:class:`PlainProgress` holds only the rule (its clock, its writer and the running units are
given: tests drive it with a fake clock, never a sleep); :class:`Ticker` calls its
:meth:`PlainProgress.tick` from a thread while ninja runs (an edge can compile for minutes without
a status line). :func:`running_units` reads the compiles qola's children run now from ``/proc``.
Standard library only.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable, Iterable

EVERY = 30.0  # seconds: the longest a build stays silent without a terminal
_UNIT_DONE = re.compile(r"^(?:LINK|AR) (\S+) ")  # a module's last edge (qola.compile.ninja's descriptions)


class PlainProgress:
    """The plain-line progress of one build. ``write`` gets each line; ``clock`` gives seconds
    (monotonic); ``running`` the units running now as (name, seconds running)."""

    def __init__(
        self,
        write: Callable[[str], None],
        *,
        clock: Callable[[], float] = time.monotonic,
        running: Callable[[], Iterable[tuple[str, float]]] = lambda: (),
        every: float = EVERY,
    ) -> None:
        self.write, self.clock, self.running, self.every = write, clock, running, every
        self.began = self.last = clock()
        self.phase_ = "starting"
        self.done, self.total = 0, 0
        self.lock = threading.Lock()

    def _say(self, what: str) -> None:
        now = self.clock()
        self.last = now
        count = f"[{self.done}/{self.total}] " if self.total else ""
        self.write(f"qola: {count}{what}, {int(now - self.began)} s")

    def phase(self, name: str) -> None:
        """A new phase (generating, compiling): said at once."""
        with self.lock:
            self.phase_ = name
            self._say(name)

    def status(self, done: int, total: int, text: str) -> None:
        """ninja's status line (``text``: the edge's description): a module's link ends the module."""
        with self.lock:
            self.done, self.total = done, total
            m = _UNIT_DONE.match(text)
            if m:
                self._say(f"{m.group(1)} done")
            elif self.clock() - self.last >= self.every:
                self._say(self._running_text())

    def tick(self) -> None:
        """Say where the build is if nothing was said for :attr:`every` seconds."""
        with self.lock:
            if self.clock() - self.last >= self.every:
                self._say(self._running_text())

    def _running_text(self) -> str:
        units = sorted(self.running(), key=lambda u: -u[1])
        if not units:
            return self.phase_
        name, secs = units[0]
        more = f", {len(units)} running" if len(units) > 1 else ""
        return f"{self.phase_}{more}, longest running: {name} ({int(secs)} s)"


class Ticker:
    """Calls ``tick`` every ``period`` seconds from a daemon thread until closed (a context manager)."""

    def __init__(self, tick: Callable[[], None], period: float = 1.0) -> None:
        self.tick, self.period = tick, period
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="qola-progress", daemon=True)

    def _loop(self) -> None:
        while not self.stop.wait(self.period):
            self.tick()

    def __enter__(self) -> Ticker:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()


def _stat(pid: str) -> tuple[int, int] | None:
    """(parent pid, start time in clock ticks since boot) of ``pid``."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read()
    except OSError:
        return None
    fields = data[data.rfind(b")") + 2 :].split()  # after "pid (comm) "
    try:
        return int(fields[1]), int(fields[19])
    except (IndexError, ValueError):
        return None


def _output_of(pid: str) -> str | None:
    """The ``-o`` operand of ``pid``'s command line, if it writes an object."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            argv = fh.read().decode(errors="replace").split("\0")
    except OSError:
        return None
    words = [w for a in argv for w in a.split()]  # ninja runs `sh -c "<command>"`
    for i, w in enumerate(words[:-1]):
        if w == "-o" and words[i + 1].endswith(".o"):
            return os.path.basename(words[i + 1])
    return None


def running_units(root: int | None = None) -> list[tuple[str, float]]:
    """The objects being compiled by descendants of ``root`` (default: this process) now, each
    with the seconds it has run (from ``/proc``; empty where there is none)."""
    root = os.getpid() if root is None else root
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
        with open("/proc/uptime") as fh:
            uptime = float(fh.read().split()[0])
        hz = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError):
        return []
    info = {p: s for p in pids if (s := _stat(p)) is not None}
    children: dict[int, list[str]] = {}
    for p, (ppid, _) in info.items():
        children.setdefault(ppid, []).append(p)
    seen: dict[str, float] = {}
    todo = list(children.get(root, ()))
    while todo:
        p = todo.pop()
        todo += children.get(int(p), ())
        out = _output_of(p)
        if out is not None:  # the shell and its compiler name the same object: the oldest counts
            seen[out] = max(seen.get(out, 0.0), uptime - info[p][1] / hz)
    return sorted(seen.items())
