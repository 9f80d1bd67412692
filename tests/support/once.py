"""A session fixture's directory made once per test run, whichever worker asks first.

Under pytest-xdist each worker runs its own session, so a ``scope="session"`` fixture is made once
per worker: CK's whole fMHA generation (``ck_fmha_600``) was made twice on two workers. Only a
directory its tests never change may be shared this way: the ROCm set's ``te`` build is not (one of
its tests hides the build dir for a while), and that set runs in one process. :func:`made_once` makes the directory under the run's
common base dir (the parent of every worker's base temp dir) while holding an exclusive ``flock``;
a worker that asks later waits on the lock and finds it made. A ``.made`` marker is written only
after ``make`` returned, so a failed attempt is never taken for a made one: the next worker that
asks removes what it left and makes it again (and fails its tests the same way). Without xdist it
is the same with the session's own base dir.
"""

from __future__ import annotations

import fcntl
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

MARK = ".made"


def run_base(factory: pytest.TempPathFactory) -> Path:
    """The dir every worker of this run shares: the parent of a worker's base temp dir under xdist
    (``…/pytest-N/popen-gwK`` → ``…/pytest-N``), the session's own base temp dir otherwise."""
    base = factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def made_once(factory: pytest.TempPathFactory, name: str, make: Callable[[Path], None]) -> Path:
    """``<run base>/<name>``, made by ``make(dir)`` (into an empty dir) by the first worker to ask."""
    return made_in(run_base(factory), name, make)


def made_in(base: Path, name: str, make: Callable[[Path], None]) -> Path:
    """``base/name``, made by ``make`` unless a process made it before (``base/name.lock`` held)."""
    assert name.isidentifier(), f"made_once: {name!r} is not a plain name"
    root = base / name
    with open(base / f"{name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (root / MARK).is_file():
            return root
        if root.exists():  # what a failed attempt left
            shutil.rmtree(root)
        root.mkdir()
        make(root)
        (root / MARK).write_text("")
    return root
