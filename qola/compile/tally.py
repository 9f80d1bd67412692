"""What each compile of a build did, as its launcher writes it (:func:`record`: one line per compile,
``<what> <object> [why]``, appended to ``tally`` in the launcher's dir) and the build reads it as it
grows (:class:`Tally`: the progress line and the notes after ninja). The remote launcher writes
``remote``/``cached``/``local``/``failed`` (:mod:`qola.compile.remote_launch`), the compile cache's
``hit``/``miss``/``corrupt``/``aside`` (:mod:`qola.compile.cache_launch`, :class:`CacheTally`)."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from qola.core import inputs
from qola.core.errors import QolaError
from qola.core.fsutil import append_text

Show = Callable[[int, int, str], None]  # ninja's progress: (done, total, text)
NAME = "tally"


def record(work: str | os.PathLike[str], what: str, obj: str, why: str = "") -> None:
    """One compile's line, appended to ``work``'s tally (a line is one write: launchers running side
    by side never interleave)."""
    append_text(Path(work) / NAME, f"{what} {obj}" + (f" {' '.join(why.split())[:300]}" if why else "") + "\n")


@dataclass
class Tally:
    """The remote launcher's record of where each compile ran (read as it grows)."""

    path: Path
    counts: dict[str, int] = field(default_factory=dict)
    reasons: list[str] = field(default_factory=list)
    _offset: int = 0

    def update(self) -> Tally:
        try:
            fd, st = inputs.open_checked(self.path, limit=inputs.MAX_RECORD, what="tally", follow=False)
            try:
                data = os.pread(fd, max(0, st.st_size - self._offset), self._offset)
            finally:
                os.close(fd)
        except (OSError, QolaError):
            return self
        end = data.rfind(b"\n") + 1
        self._offset += end
        for line in data[:end].decode("utf-8", "replace").splitlines():
            where, _, rest = line.partition(" ")
            self.counts[where] = self.counts.get(where, 0) + 1
            if where in ("local", "failed"):
                self.reasons.append(rest)
        return self

    def status(self, show: Show) -> Show:
        """``show`` (ninja's progress) with where the compiles ran so far after its text (the reporter
        reads a module's end from the edge's description, at the text's start)."""

        def status(done: int, total: int, text: str) -> None:
            show(done, total, f"{text} [{self.update().line()}]")  # after: the reporter reads the edge first

        return status

    def line(self) -> str:
        c = self.counts
        return f"remote {c.get('remote', 0)}, cached {c.get('cached', 0)}, local {c.get('local', 0)}" + (
            f", failed {c['failed']}" if c.get("failed") else ""
        )

    def describe(self, url: str) -> str:
        c = self.counts
        text = (
            f"--remote ({url}): {c.get('remote', 0)} compile(s) ran on workers, {c.get('cached', 0)} came "
            f"from the action cache, {c.get('local', 0)} compiled locally"
        )
        if c.get("failed"):
            text += f", {c['failed']} failed"
        if c.get("local"):
            text += f" (the service failed; --remote-fallback: {self.reasons[0][:200]})"
        return text


class CacheTally(Tally):
    """The compile cache's record of each compile: taken (``hit``), compiled (``miss``, ``corrupt``:
    its entry failed its digest), or compiled without the cache (``aside``)."""

    def line(self) -> str:
        c = self.counts
        return f"cache {c.get('hit', 0)} hit, {c.get('miss', 0) + c.get('corrupt', 0)} compiled"

    def describe(self, url: str) -> str:
        c = self.counts
        text = (
            f"compile cache ({url}): {c.get('hit', 0)} object(s) taken from it, "
            f"{c.get('miss', 0) + c.get('corrupt', 0)} compiled"
        )
        if c.get("corrupt"):
            text += f" ({c['corrupt']} of them over an entry that failed its digest, replaced)"
        if c.get("aside"):
            text += f", {c['aside']} compiled without it"
        return text
