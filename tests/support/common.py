"""Helpers shared by test files (moved out of conftest.py by scripts/restructure_tests.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


EXAMPLES = REPO / "examples"


KERNELS = EXAMPLES / "kernels"


def run_qola(*args: str, cwd: Path | None = None, env: dict | None = None, check: bool = False):
    """Run the CLI in a subprocess, as a user would."""
    full_env = dict(os.environ)
    if env:
        full_env.update(env)
    proc = subprocess.run([sys.executable, "-m", "qola", *args], capture_output=True, text=True, cwd=cwd, env=full_env)
    if check and proc.returncode != 0:
        raise AssertionError(f"qola {' '.join(args)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


def wait_for(cond, timeout: float = 60.0) -> bool:
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
