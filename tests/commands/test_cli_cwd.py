"""Issue 51: a command run from a working directory that was deleted says so, naming it (the shell's
``$PWD``), and leaves nothing behind (it said "No such file or directory" with no path, and left the
build dir of an absolute ``-o``)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from support.common import KERNELS, REPO, qola_command


def test_a_deleted_working_directory_is_named_and_nothing_is_left(tmp_path: Path) -> None:
    gone = tmp_path / "gone"
    gone.mkdir()
    m = tmp_path / "q.toml"
    m.write_text('[qola]\nnamespace = "qk"\n[build]\narchitectures = ["sm_90"]\n[[modules]]\nname = "module_softmax"\n')
    argv = qola_command("build", "--manifest", m, "--aiter-root", KERNELS, "-o", tmp_path / "out", "--dry-run")
    shell = 'cd "$1" && rmdir "$1" && shift && exec "$@"'
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        ["sh", "-c", shell, "sh", str(gone), *argv], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert f"the working directory {gone} no longer exists" in proc.stderr, proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["q.toml"]
