"""``qola`` run as a user runs it, under a memory cap, for the tests of hostile input: a regression
must fail its test (a user error expected, a hang or a blow-up reported), not exhaust the machine."""

from __future__ import annotations

import subprocess
from functools import partial

from support.common import run_qola

HANG_GUARD = 300  # seconds: past it a run is a hang (the test fails naming the command), never a speed check
# support.common.run_qola under a 3 GiB address-space cap and the hang guard
qola = partial(run_qola, memory_cap=True, timeout=HANG_GUARD)


def user_error(proc: subprocess.CompletedProcess[str], *needles: str) -> str:
    """``proc`` ended as a user mistake (exit 2, no traceback) saying each of ``needles``."""
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr, proc.stderr
    for needle in needles:
        assert needle in proc.stderr, (needle, proc.stderr)
    return proc.stderr
