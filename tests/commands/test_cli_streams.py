"""Every command with a standard stream closed (issue 41): ``qola plan … >&-`` ended in a traceback
(``'NoneType' object has no attribute 'flush'``: Python leaves ``sys.stdout`` None for a closed fd), as
some service managers start jobs. ``qola.cli.standard_streams`` reopens a closed fd on /dev/null before
anything runs; what a command prints on a closed stream is dropped, the command does its work."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from support.common import EXAMPLES, KERNELS, qola_command

MANIFEST = ["--manifest", str(EXAMPLES / "quickstart.toml"), "--aiter-root", str(KERNELS)]
COMMANDS = {
    "plan": ["plan", *MANIFEST],
    "variants": ["variants", *MANIFEST],
    "dry-run": ["build", *MANIFEST, "--dry-run"],
    "refused": ["build", "--manifest", "/nonexistent/q.toml", "--aiter-root", str(KERNELS), "-o", "out"],
    "audit": ["audit", "/nonexistent/out"],  # refused: no manifest.json
    "reproduce": ["audit", "/nonexistent/out", "--reproduce"],
}
REFUSED = {"refused": "/nonexistent/q.toml", "audit": "/nonexistent/out", "reproduce": "/nonexistent/out"}


def _closing(fds: tuple[int, ...]) -> Callable[[], None]:
    def close() -> None:
        for fd in fds:
            os.close(fd)

    return close


@pytest.mark.parametrize("fds", [(1,), (2,), (0,), (0, 1, 2)], ids=["stdout", "stderr", "stdin", "all"])
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_closed_standard_stream_is_no_traceback(command: str, fds: tuple[int, ...], tmp_path: Path) -> None:
    argv = COMMANDS[command] + (["--output-dir", str(tmp_path / "out")] if command == "dry-run" else [])
    marker = tmp_path / "stderr.txt"
    with marker.open("w") as err:
        # stderr goes to a file the test reads unless it is one of the closed ones
        proc = subprocess.run(
            qola_command(*argv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
            cwd=tmp_path,
            preexec_fn=_closing(fds),
            timeout=300,
        )
    said = marker.read_text()
    assert "Traceback" not in said and "NoneType" not in said, said
    if command in REFUSED:
        assert proc.returncode == 2, said  # the user's mistake, said where it can be
        assert 2 in fds or REFUSED[command] in said, said
    else:
        assert proc.returncode == 0, said
    if command == "dry-run":
        assert (tmp_path / "out.build" / "build.ninja").is_file()  # the work was done all the same
