"""The no-op record names the interpreter (issue 51, 3): the same build under Python 3.11, then 3.13
(``PYTHONPATH=<checkout>``, as TE's CMake runs qola) said "up to date" and kept what the 3.11
generators wrote; the digest named no interpreter."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.pythons import other_python

import qola
from qola.store import fastpath

ARGS = (["qola", "build", "-o", "out"], {"PATH": "/bin"}, ["PATH"])
DIGEST = "import json, sys; from qola.store import fastpath; print(fastpath.digest(*json.loads(sys.argv[1])))"


def test_another_interpreter_is_another_digest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = tmp_path / "input.txt"
    data.write_text("x\n")
    args = (*ARGS, [str(data)])
    mine = fastpath.digest(*args)
    assert fastpath.digest(*args) == mine
    other = other_python()
    if other is not None:  # the same digest computed under another interpreter, as the no-op check does
        env = {**os.environ, "PYTHONPATH": str(Path(qola.__file__).parent.parent)}
        done = subprocess.run([other, "-c", DIGEST, json.dumps(args)], env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() != mine
    monkeypatch.setattr(sys, "version", sys.version + " (another build)")  # two identities, directly
    assert fastpath.digest(*args) != mine
