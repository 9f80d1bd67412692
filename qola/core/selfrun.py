"""How a child process runs one of qola's own modules (a ninja check edge, a link step).

``python -m qola.x`` finds qola only where the parent found it through the interpreter's own paths
(an install, ``PYTHONPATH``). A caller that starts qola from its checkout's directory with no
``PYTHONPATH`` (ck-jit's ``ck_jit_build.py --with-qola``: ``cwd`` is the qola checkout) has qola
importable through the parent's working directory alone, and ninja runs its edges from the build
dir: every such edge failed with "No module named 'qola'". :func:`module_argv` names the directory
this qola was imported from, so the child imports the same qola whatever its cwd and environment.

Standard library only, nothing at import time.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path


def root() -> str:
    """The directory holding the ``qola`` package this process runs (a checkout or site-packages)."""
    return str(Path(__file__).resolve().parents[2])


def module_argv(python: str, module: str) -> list[str]:
    """argv running ``python -m module`` with this qola first on ``sys.path``; arguments follow it
    (``sys.argv[1:]`` in the module, as with ``-m``)."""
    code = f"import runpy, sys; sys.path.insert(0, {root()!r}); runpy.run_module({module!r}, run_name='__main__', alter_sys=True)"
    return [python, "-c", code]


def launcher_script(module: str, config: str) -> str:
    """A compiler launcher's ``sh`` script (ninja puts it in front of every compile): ``python -m
    module CONFIG -- <compiler> <args…>`` with this qola first on the path (the remote launcher, the
    compile cache's)."""
    return (
        f"#!/bin/sh\nexec env PYTHONPATH={shlex.quote(root())} {shlex.quote(sys.executable)} -m {module} "
        f'{shlex.quote(config)} -- "$@"\n'
    )
