"""Helpers shared by test files (first written in test_cli_compat.py)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from subprocess import CompletedProcess
from typing import Any

from support.common import REPO, run_qola

MODULE = '[[modules]]\nname = "module_tiny"\nsrcs = ["csrc/tiny/tiny.cu"]\nis_python_module = false\n'


def copy_checkout(dest: Path, version: str = "0.1.0+copy") -> Path:
    """The package as a plain git checkout holds it, with a version of its own (to prove which one ran)."""
    shutil.copytree(REPO / "qola", dest / "qola", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", dest / "pyproject.toml")
    init = dest / "qola" / "__init__.py"
    init.write_text(init.read_text().replace('__version__ = "', f'__version__ = "{version}"  # was "', 1))
    return dest


def no_pythonpath(**extra: str) -> dict[str, Any]:
    return {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, **extra}


def qola_cli(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None, pythonpath: Path | None = REPO
) -> CompletedProcess[str]:
    """``python -m qola.cli …`` as TE's CMake (PYTHONPATH=<checkout>) or ck-jit (cwd, pythonpath None) runs it."""
    from support.gitrepo import GIT_ENV

    full = no_pythonpath(**GIT_ENV, **(env or {}))
    if pythonpath is not None:
        full["PYTHONPATH"] = str(pythonpath)
    return run_qola(*args, entry="qola.cli", cwd=cwd, env=full, whole_env=True)
