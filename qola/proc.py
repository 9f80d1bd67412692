"""The one way qola runs child processes.

Every child (ninja, compilers, probes, generators) starts in its own process group and, on Linux,
with a parent-death signal: if qola is killed — even by SIGKILL — the kernel sends the child
SIGTERM (ninja then stops its compilers, a compiler driver its sub-tools). While qola lives, an
exception while waiting (Ctrl-C, SIGTERM/SIGHUP turned into :class:`Interrupted` by
:func:`signals_end_children`, a timeout) ends the child's whole group: SIGTERM, a grace period,
then SIGKILL. Only groups this process started are ever signalled.

Standard library only, nothing at import time (the no-op fast path imports this module).
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

PIPE, STDOUT, DEVNULL = subprocess.PIPE, subprocess.STDOUT, subprocess.DEVNULL
TimeoutExpired = subprocess.TimeoutExpired
CompletedProcess = subprocess.CompletedProcess
GRACE = 5.0  # seconds between SIGTERM and SIGKILL for a group being ended
_PR_SET_PDEATHSIG = 1

_live: dict[int, subprocess.Popen] = {}  # process group id -> its leader (started here, not yet reaped)
_live_lock = threading.Lock()
_prctl: Any = None  # libc's prctl, resolved once in the parent (never in a forked child)


class Interrupted(KeyboardInterrupt):
    """qola received ``signum`` (SIGINT, SIGTERM, SIGHUP); its children are being ended."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def _libc_prctl() -> Any:
    global _prctl
    if _prctl is None and sys.platform.startswith("linux"):
        try:
            import ctypes  # noqa: PLC0415 (only when a child is started)

            fn = ctypes.CDLL(None, use_errno=True).prctl
            fn.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
            fn.restype = ctypes.c_int
            _prctl = fn
        except (OSError, AttributeError, ImportError):
            _prctl = False
    return _prctl


def _death_signal(parent: int, sig: int):
    """A preexec function: ask for ``sig`` when the parent dies, and exit at once if it already has.
    It calls a function pointer resolved before the fork and nothing else (safe beside threads)."""
    prctl = _libc_prctl()
    if not prctl:
        return None

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(127)

    return preexec


def popen(argv: Sequence[str], *, env: Mapping[str, str] | None = None, cwd: str | os.PathLike | None = None,
          stdin: Any = DEVNULL, stdout: Any = PIPE, stderr: Any = STDOUT, text: bool = True,
          death_signal: int = signal.SIGTERM) -> subprocess.Popen:
    """Start ``argv`` in a new process group with a parent-death signal and remember its group.
    Prefer :func:`run` or :func:`started`; a caller of this must call :func:`finish`."""
    kwargs: dict[str, Any] = {"errors": "replace"} if text else {}
    proc = subprocess.Popen(
        [os.fspath(a) for a in argv], env=None if env is None else dict(env), cwd=cwd, stdin=stdin, stdout=stdout,
        stderr=stderr, text=text, process_group=0, preexec_fn=_death_signal(os.getpid(), death_signal),
        **kwargs,
    )
    with _live_lock:
        _live[proc.pid] = proc
    return proc


def finish(proc: subprocess.Popen, *, ended: bool = False) -> None:
    """Forget ``proc``; with ``ended`` (the caller stops waiting early) end its group first."""
    try:
        if ended:
            end_group(proc)
    finally:
        with _live_lock:
            _live.pop(proc.pid, None)
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                try:
                    stream.close()
                except OSError:
                    pass


def _signal_group(pgid: int, sig: int) -> bool:
    try:
        os.killpg(pgid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def end_group(proc: subprocess.Popen, grace: float = GRACE) -> None:
    """SIGTERM to ``proc``'s group, up to ``grace`` seconds for its leader, then SIGKILL to the group."""
    if proc.returncode is None:
        _signal_group(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
    # the leader is reaped only here or by its waiter: its pid (= the group id) is not reused before
    _signal_group(proc.pid, signal.SIGKILL)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        pass


def terminate_all(grace: float = GRACE) -> None:
    """Send SIGTERM to every group started here that is still running; SIGKILL after ``grace``
    seconds (from a timer thread: callable from a signal handler)."""
    with _live_lock:
        procs = [p for p in _live.values() if p.returncode is None]
    for p in procs:
        _signal_group(p.pid, signal.SIGTERM)
    if procs:
        def kill_rest() -> None:
            for p in procs:
                if p.poll() is None:
                    _signal_group(p.pid, signal.SIGKILL)

        timer = threading.Timer(grace, kill_rest)
        timer.daemon = True
        timer.start()


@contextmanager
def started(argv: Sequence[str], **kwargs: Any) -> Iterator[subprocess.Popen]:
    """``with started(argv, ...) as p:`` — the group is ended if the block exits by an exception."""
    proc = popen(argv, **kwargs)
    ok = False
    try:
        yield proc
        ok = True
    finally:
        finish(proc, ended=not ok or proc.returncode is None and proc.poll() is None)


def run(argv: Sequence[str], *, env: Mapping[str, str] | None = None, cwd: str | os.PathLike | None = None,
        input: str | bytes | None = None, timeout: float | None = None, stdout: Any = PIPE, stderr: Any = STDOUT,
        text: bool = True, log: str | os.PathLike | None = None) -> subprocess.CompletedProcess:
    """Run ``argv`` to completion (output captured, stderr into stdout unless told otherwise); never
    raises for a non-zero exit. A timeout ends the whole group and raises ``TimeoutExpired``; so does
    any exception while waiting. ``log``: also append the command, its output and exit status there."""
    with started(argv, env=env, cwd=cwd, stdin=PIPE if input is not None else DEVNULL, stdout=stdout,
                 stderr=stderr, text=text) as proc:
        try:
            out, err = proc.communicate(input, timeout=timeout)
        except subprocess.TimeoutExpired:
            end_group(proc, grace=1.0)
            raise
    result = subprocess.CompletedProcess(list(argv), proc.returncode, out, err)
    if log is not None:
        write_log(Path(log), argv, result)
    return result


def run_checked(argv: Sequence[str], *, hint: str | None = None, any_exit: bool = False,
                timeout: float | None = None, **kwargs: Any) -> subprocess.CompletedProcess:
    """:func:`run` for a child that must work: one that cannot be started, runs past ``timeout``
    or (unless ``any_exit``) exits non-zero raises :class:`qola.errors.FailedProcessError` — the
    one error, and format, for a failed child (its command, why, the tail of its output, ``hint``)."""
    from qola.errors import FailedProcessError  # noqa: PLC0415 (only when a child runs)

    try:
        result = run(argv, timeout=timeout, **kwargs)
    except TimeoutExpired as exc:
        raise FailedProcessError(argv, 124, _as_text(exc.output), hint,
                                 reason=f"no answer within {timeout:g} s; ended") from None
    except OSError as exc:
        raise FailedProcessError(argv, 127, "", hint,
                                 reason=f"cannot run {os.fspath(argv[0])}: {exc.strerror or exc}") from None
    if result.returncode != 0 and not any_exit:
        raise FailedProcessError(argv, result.returncode, _as_text(result.stdout) + _as_text(result.stderr), hint)
    return result


def _as_text(x: Any) -> str:
    return x.decode(errors="replace") if isinstance(x, bytes) else (x or "")


def write_log(path: Path, argv: Sequence[str], result: subprocess.CompletedProcess) -> None:
    as_text = _as_text
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8", errors="replace") as fh:
        fh.write(f"$ {shlex.join(str(a) for a in argv)}\n{as_text(result.stdout)}{as_text(result.stderr)}"
                 f"(exit code {result.returncode})\n")


_HANDLED = ("SIGINT", "SIGTERM", "SIGHUP")


@contextmanager
def signals_end_children() -> Iterator[None]:
    """While active (main thread only), SIGINT/SIGTERM/SIGHUP end every child group started here and
    raise :class:`Interrupted` in the main thread; the previous handlers come back afterwards."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        terminate_all()
        raise Interrupted(signum)

    previous: dict[int, Any] = {}
    try:
        for name in _HANDLED:
            sig = getattr(signal, name, None)
            if sig is not None and signal.getsignal(sig) is not signal.SIG_IGN:
                previous[sig] = signal.signal(sig, handler)
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def wait_gone(pids: Sequence[int], timeout: float) -> list[int]:
    """The pids among ``pids`` still alive (not zombies) after up to ``timeout`` seconds (for tests
    and diagnostics; reads /proc)."""
    deadline = time.monotonic() + timeout
    while True:
        alive = [p for p in pids if _alive(p)]
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(0.1)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False
