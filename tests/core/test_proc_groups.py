"""The process runner (qola/core/proc.py; issue 11 item 5, moved from
tests/pipeline/test_refused_before_work.py): a child leads a process group of its own and gets a death
signal (also on Python 3.10, without Popen(process_group=)), a timed-out child's group ends with it, and
only the runner starts processes."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from subprocess import Popen
from typing import Any

import pytest
from support.procs import alive_after


def test_runner_group_death_signal_and_timeout(tmp_path: Path) -> None:
    from qola.core import proc

    probe = (
        "import ctypes, os; buf = ctypes.c_int(); "
        "ctypes.CDLL(None).prctl(2, ctypes.byref(buf), 0, 0, 0); print(os.getpgid(0), buf.value)"
    )
    done = proc.run([sys.executable, "-c", probe])
    pgid, deathsig = map(int, done.stdout.split())
    assert pgid != os.getpgid(0) and deathsig == signal.SIGTERM
    marker = tmp_path / "grandchild"
    with pytest.raises(proc.TimeoutExpired):
        proc.run(["sh", "-c", f"sleep 600 & echo $! > {marker}; wait"], timeout=10)
    assert not alive_after([int(marker.read_text())], 60), "a timed-out child's group survived"


def test_runner_new_group_without_popen_process_group(monkeypatch: pytest.MonkeyPatch) -> None:
    """Python 3.10 (requires-python) has no Popen(process_group=): there the child still leads a
    group of its own and gets the death signal, through its preexec function (3.10's Popen faked)."""
    from qola.core import proc

    real = subprocess.Popen

    def popen_310(*args: Any, **kwargs: Any) -> Popen[Any]:
        if "process_group" in kwargs:
            raise TypeError("__init__() got an unexpected keyword argument 'process_group'")
        return real(*args, **kwargs)

    monkeypatch.setattr(proc, "_POPEN_PROCESS_GROUP", False)
    monkeypatch.setattr("qola.core.proc.subprocess.Popen", popen_310)
    probe = (
        "import ctypes, os; buf = ctypes.c_int(); "
        "ctypes.CDLL(None).prctl(2, ctypes.byref(buf), 0, 0, 0); print(os.getpid(), os.getpgid(0), buf.value)"
    )
    done = proc.run([sys.executable, "-c", probe])
    pid, pgid, deathsig = map(int, done.stdout.split())
    assert pgid == pid != os.getpgid(0) and deathsig == signal.SIGTERM


def test_runner_files_start_no_process_of_their_own() -> None:
    import qola

    src = Path(qola.__file__).parent
    own = [
        "commands/build.py",
        "commands/common.py",
        "cli.py",
        "store/fastpath.py",
        "compile/ninja.py",
        "compile/steps.py",
        "plan/genrules.py",
        "hooks/isolation.py",
        "hooks/jit.py",
        "pipeline/run.py",
        "pipeline/spec.py",
        "compile/extras.py",
        "compile/layout.py",
        *(f"toolchain/{p.name}" for p in (src / "toolchain").glob("*.py")),
    ]
    for rel in own:
        text = (src / rel).read_text()
        assert not re.search(r"subprocess\.(run|Popen|call|check_output|check_call)\(|os\.system\(", text), rel
