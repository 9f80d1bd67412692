"""``qola`` run as a user runs it, under a memory cap, for the tests of hostile input: a regression
must fail its test (a user error expected, a hang or a blow-up reported), not exhaust the machine."""

from __future__ import annotations

import resource
import subprocess
import sys
from pathlib import Path

import pytest


def _limits() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))


def qola(*args: str, cwd: Path | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    """``python -m qola ARGS``; past ``timeout`` seconds (a hang guard, never a speed check) the test
    fails naming the command."""
    try:
        return subprocess.run(
            [sys.executable, "-m", "qola", *args],
            capture_output=True,
            text=True,
            cwd=cwd,
            check=False,
            timeout=timeout,
            preexec_fn=_limits,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"qola {' '.join(args)} hung (no end in {timeout} s)")


def user_error(proc: subprocess.CompletedProcess, *needles: str) -> str:
    """``proc`` ended as a user mistake (exit 2, no traceback) saying each of ``needles``."""
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr, proc.stderr
    for needle in needles:
        assert needle in proc.stderr, (needle, proc.stderr)
    return proc.stderr
