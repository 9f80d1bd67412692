"""Helpers shared by test files (first written in conftest.py)."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


EXAMPLES = REPO / "examples"


KERNELS = EXAMPLES / "kernels"


def _memory_cap() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))


# `python -c` in place of `python -m qola`: runs the CLI, then writes the names of every module loaded
# (sorted, one a line) to argv[1]
_MODULES_DUMP = """import sys
from qola.cli import main
code = main(sys.argv[2:])
with open(sys.argv[1], "w") as f:
    f.write("\\n".join(sorted(sys.modules)))
raise SystemExit(code)
"""


def qola_command(*args: str | os.PathLike[str], entry: str = "qola") -> list[str]:
    """``python -m ENTRY ARGS``: the command line of :func:`run_qola`, for a test that starts qola in
    the background (``subprocess.Popen``)."""
    return [sys.executable, "-m", entry, *map(str, args)]


def run_qola(
    *args: str | os.PathLike[str],
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    whole_env: bool = False,
    check: bool = False,
    timeout: float | None = None,
    entry: str = "qola",
    memory_cap: bool = False,
    modules_to: Path | None = None,
    stdout: int | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run the CLI in a subprocess, as a user would: ``python -m ENTRY ARGS`` (``entry="qola.cli"`` as
    Transformer Engine's CMake and ck-jit call it), stdout and stderr captured as text (``stdout``: a
    file descriptor to send stdout to instead).

    ``env`` is added to this process's environment, or with ``whole_env`` is the whole of it. ``check``:
    a non-zero exit fails the test with the output. ``timeout``: a hang guard, never a speed check;
    past it the test fails naming the command. ``memory_cap``: under a 3 GiB address-space cap (the
    tests of hostile input: a blow-up fails its test, not the machine). ``modules_to``: the names of
    every module the run loaded are written there, one a line (the import-set test)."""
    words = [str(a) for a in args]
    full_env = dict(env or {}) if whole_env else {**os.environ, **(env or {})}
    command = (
        [sys.executable, "-c", _MODULES_DUMP, str(modules_to), *words]
        if modules_to
        else qola_command(*words, entry=entry)
    )
    try:
        proc = subprocess.run(
            command,
            capture_output=stdout is None,
            stdout=stdout,
            stderr=None if stdout is None else subprocess.PIPE,
            text=True,
            cwd=cwd,
            env=full_env,
            timeout=timeout,
            preexec_fn=_memory_cap if memory_cap else None,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"qola {' '.join(words)} hung (no end in {timeout} s)")
    if check and proc.returncode != 0:
        raise AssertionError(f"qola {' '.join(words)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


def wait_for(cond: Callable[[], object], timeout: float = 60.0) -> bool:
    """Poll ``cond`` until it is true (True) or ``timeout`` seconds pass (False)."""
    import time

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.05)
    return False


def cmake_build(proj: Path, bld: Path, prefix: Path) -> None:
    """Configure ``proj`` with ``CMAKE_PREFIX_PATH=prefix`` into ``bld`` and build it (asserting both)."""
    cfg = subprocess.run(
        ["cmake", "-S", str(proj), "-B", str(bld), f"-DCMAKE_PREFIX_PATH={prefix}"], capture_output=True, text=True
    )
    assert cfg.returncode == 0, cfg.stdout + cfg.stderr
    made = subprocess.run(["cmake", "--build", str(bld)], capture_output=True, text=True)
    assert made.returncode == 0, made.stdout + made.stderr


def compile_commands(build: Path) -> list[dict[str, str]]:
    """Every compile edge of ``build``'s graph as ninja expands it (``ninja -t compdb``: directory,
    command, file, output), a host-only edge's as its two lines, the host-only one first and the one
    with device passes it falls back to (:func:`qola.compile.passes.host_and_device`): what a
    compiler wrapper can be called with."""
    from qola.compile import ninja
    from qola.compile.passes import host_and_device

    argv = ["ninja", "-C", str(build), "-t", "compdb", ninja.COMPILE_RULE, ninja.HOST_RULE]
    units = []
    for u in json.loads(subprocess.run(argv, capture_output=True, text=True, check=True).stdout):
        lines = host_and_device(u["command"])
        units += [{**u, "command": line} for line in lines] if lines else [u]
    return units
