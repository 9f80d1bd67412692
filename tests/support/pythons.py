"""Another Python interpreter than the one running the tests, when the machine has one (pyenv's, as
scripts/pythons.sh finds them, or ``python3.X`` on PATH): a test that needs two interpreters runs
with it, and compares the keys of two interpreter identities directly without it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

CLAIMED = ("3.10", "3.11", "3.12", "3.13")


def _candidates(version: str) -> list[str]:
    root = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv") / "versions"
    found = sorted(str(p) for p in root.glob(f"{version}.*/bin/python{version}")) if root.is_dir() else []
    on_path = shutil.which(f"python{version}")
    return [*found, *([on_path] if on_path else [])]


def other_python() -> str | None:
    """An interpreter of another claimed version that runs, or None."""
    mine = f"{sys.version_info[0]}.{sys.version_info[1]}"
    for version in CLAIMED:
        if version == mine:
            continue
        for exe in _candidates(version):
            done = subprocess.run([exe, "-c", "import sys; print(sys.version)"], capture_output=True, text=True)
            if done.returncode == 0 and done.stdout.startswith(version):
                return exe
    return None
