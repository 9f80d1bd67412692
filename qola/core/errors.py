"""One place for qola's errors.

User mistakes raise :class:`QolaError` (exit 2); build failures raise
:class:`BuildFailed` (exit 1); a failed child process raises
:class:`FailedProcessError`, which shows the command, the return code and the
indented output.
"""

from __future__ import annotations

import shlex
import textwrap
from collections.abc import Sequence

from qola.core.secret import redact

EXIT_USER = 2
EXIT_BUILD = 1


class QolaError(Exception):
    """A problem the user can fix: message, optional location and hint."""

    exit_code = EXIT_USER

    def __init__(self, message: str, hint: str | None = None, where: str | None = None):
        message = redact(message)  # a URL's credentials never reach the console (qola.core.secret)
        super().__init__(message)
        self.message = message
        self.hint = None if hint is None else redact(hint)
        self.where = None if where is None else redact(where)

    def render(self) -> str:
        head = f"{self.where}: {self.message}" if self.where else self.message
        lines = [f"error: {head}"]
        if self.hint:
            lines.append(f"hint: {self.hint}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.render()


class BuildFailed(QolaError):
    """The build ran but something in it failed (exit 1)."""

    exit_code = EXIT_BUILD


def tail(output: str, lines: int = 40, chars: int = 4000) -> str:
    """The last ``lines`` lines (at most ``chars`` characters) of ``output``, with a note of what was cut."""
    kept = output.rstrip().splitlines()
    cut = max(0, len(kept) - lines)
    text = "\n".join(kept[cut:])
    if len(text) > chars:
        text, cut = text[-chars:], cut + 1
    return (f"[… {cut} earlier line(s) cut; the whole output is in the module's log]\n" if cut else "") + text


def _exit_reason(returncode: int) -> str:
    if returncode < 0:
        import signal  # lazy: paid only by the callers that need it

        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit code {returncode}"


class FailedProcessError(BuildFailed):
    """A child process failed: it exited non-zero, could not be started (``returncode`` 127), or
    ran past its time limit. The one error (and format) for a failed child, whoever ran it
    (:func:`qola.core.proc.run_checked` raises it): the command, why it failed, and the tail of its output."""

    def __init__(
        self,
        cmd: Sequence[str],
        returncode: int,
        output: str = "",
        hint: str | None = None,
        *,
        reason: str | None = None,
    ):
        self.cmd = [str(c) for c in cmd]
        self.returncode = returncode
        self.output = output
        self.reason = reason or _exit_reason(returncode)
        shown = textwrap.indent(tail(output), "    ") if output.strip() else "    (no output)"
        message = f"command failed ({self.reason}):\n    {shlex.join(self.cmd)}\n  output:\n{shown}"
        super().__init__(message, hint=hint)
