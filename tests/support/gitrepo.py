"""Helpers shared by test files (first written in test_checkout.py)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

# git refuses file:// submodules unless told (protocol.file.allow): the test's mirror is local
GIT_ENV = {
    "GIT_CONFIG_COUNT": "1",
    "GIT_CONFIG_KEY_0": "protocol.file.allow",
    "GIT_CONFIG_VALUE_0": "always",
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@t",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@t",
}


def git(cwd: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-c", "commit.gpgsign=false", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={**os.environ, **GIT_ENV},
    )
    assert done.returncode == 0, f"git {args}: {done.stderr}"
    return done.stdout.strip()
