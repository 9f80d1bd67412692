"""Every command with a standard stream closed or unwritable (issue 41): ``qola plan … >&-`` ended in a traceback
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
    "checkout": ["checkout", "--manifest", "/nonexistent/q.toml"],
    "package": ["package", "/nonexistent/out"],
    "embed": ["embed", "--hsa-dir", "/nonexistent/hsa", "--arch", "gfx942", "--all-types", "--output-dir", "e"],
    "jit": ["jit", "--cache-dir", "/nonexistent/jit", "ls"],
    "usage": ["usage", "merge", "--manifest", "/nonexistent/q.toml", "/nonexistent/records"],
    "doctor": ["doctor"],  # its exit code depends on this host's tools: compared with an open-stream run
}
REFUSED = {
    "refused": "/nonexistent/q.toml",
    "audit": "/nonexistent/out",
    "reproduce": "/nonexistent/out",
    "checkout": "/nonexistent/q.toml",
    "package": "/nonexistent/out",
    "embed": "/nonexistent/hsa",
    "jit": "/nonexistent/jit",
    "usage": "/nonexistent/records",
}


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
    elif command == "doctor":
        assert proc.returncode == _open_run(argv, tmp_path), said
    else:
        assert proc.returncode == 0, said
    if command == "dry-run":
        assert (tmp_path / "out.build" / "build.ninja").is_file()  # the work was done all the same


def _open_run(argv: list[str], cwd: Path) -> int:
    return subprocess.run(qola_command(*argv), capture_output=True, cwd=cwd, timeout=300).returncode


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_an_unwritable_stderr_loses_the_messages_not_the_work(command: str, tmp_path: Path) -> None:
    """``2>/dev/full`` (a full disk under a log file): every write to stderr fails with ENOSPC. Messages
    are all stderr carries, so they are dropped (qola.cli.Diagnostics) and the command ends as its work
    went: a dry run wrote its graph and exits 0 (it exited 1 with nothing written, its first warning
    an OSError), a refusal is still exit 2."""
    argv = COMMANDS[command] + (["--output-dir", str(tmp_path / "out")] if command == "dry-run" else [])
    with open("/dev/full", "w") as full:
        proc = subprocess.run(
            qola_command(*argv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=full,
            cwd=tmp_path,
            timeout=300,
        )
    want = 2 if command in REFUSED else _open_run(argv, tmp_path) if command == "doctor" else 0
    assert proc.returncode == want
    if command == "dry-run":
        assert (tmp_path / "out.build" / "build.ninja").is_file()


@pytest.mark.parametrize("command", ["plan", "variants"])
def test_an_unwritable_stdout_is_an_error_said_on_stderr(command: str, tmp_path: Path) -> None:
    """stdout is a command's product: ``qola plan >/dev/full`` cannot deliver it, so it fails, saying
    why on stderr, without a traceback."""
    with open("/dev/full", "w") as full:
        proc = subprocess.run(
            qola_command(*COMMANDS[command]),
            stdout=full,
            capture_output=False,
            stderr=subprocess.PIPE,
            text=True,
            cwd=tmp_path,
            timeout=300,
        )
    assert proc.returncode != 0 and "No space left on device" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
