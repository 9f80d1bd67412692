"""The one way qola runs child processes.

Every child (ninja, compilers, probes, generators) starts in its own process group and, on Linux,
with a parent-death signal: if qola is killed — even by SIGKILL — the kernel sends the child
SIGTERM (ninja then stops its compilers, a compiler driver its sub-tools). While qola lives, an
exception while waiting (Ctrl-C, SIGTERM/SIGHUP turned into :class:`Interrupted` by
:func:`signals_end_children`, a timeout) ends the child's whole group: SIGTERM, a grace period,
then SIGKILL. Only groups this process started are ever signalled. Once such a signal came, no
new child starts (:func:`popen` raises :class:`Interrupted`) and waits that poll :func:`stopping`
(:mod:`qola.core.lock`) end, in every thread.

Output is read as it comes, never held whole: :func:`run` keeps at most :data:`MAX_CAPTURE` bytes
of a stream (a child printing more is ended: :class:`OutputLimit`), or with ``keep=N`` the first and
last ``N/2`` bytes with a note of how much was cut between them (for output that only goes to logs);
the bounded buffers are :mod:`qola.core.capture`'s.

Standard library only, nothing at import time (the no-op fast path imports this module).
"""

from __future__ import annotations

import os
import selectors
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qola.core import capture
from qola.core.capture import LOG_KEEP as LOG_KEEP
from qola.core.capture import Lines as Lines
from qola.core.capture import read_lines as read_lines
from qola.core.childenv import ChildEnv as ChildEnv
from qola.core.childenv import TimedEnv as TimedEnv

PIPE, STDOUT, DEVNULL = subprocess.PIPE, subprocess.STDOUT, subprocess.DEVNULL
TimeoutExpired = subprocess.TimeoutExpired
CompletedProcess = subprocess.CompletedProcess
GRACE = 5.0  # seconds between SIGTERM and SIGKILL for a group being ended
MAX_CAPTURE = 64 << 20  # bytes of one captured stream :func:`run` holds for a caller that parses it
_CHUNK = capture.CHUNK
_PR_SET_PDEATHSIG = 1

_live: dict[int, subprocess.Popen[Any]] = {}  # process group id -> its leader (started here, not yet reaped)
_live_lock = threading.Lock()
_prctl: Any = None  # libc's prctl, resolved once in the parent (never in a forked child)
_stop = threading.Event()  # set by the handler of signals_end_children: stop starting and waiting
_stop_signal: list[int] = [int(signal.SIGTERM)]


class OutputLimit(subprocess.TimeoutExpired):
    """A child printed more than a caller may hold; its group was ended. (A TimeoutExpired: every
    caller that handles a child running past its limit handles this one.)"""

    def __init__(self, cmd: Sequence[str], limit: int, output: bytes = b""):
        super().__init__(list(cmd), 0, output)
        self.limit = limit

    def __str__(self) -> str:
        return f"printed more than {self.limit >> 20} MiB; ended"


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
            import ctypes  # lazy: only when a child is started

            fn = ctypes.CDLL(None, use_errno=True).prctl
            fn.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
            fn.restype = ctypes.c_int
            _prctl = fn
        except (OSError, AttributeError, ImportError):
            _prctl = False
    return _prctl


# Popen's ``process_group`` came in Python 3.11; on 3.10 the child's preexec function calls setpgid.
_POPEN_PROCESS_GROUP = sys.version_info >= (3, 11)


def _death_signal(parent: int, sig: int, new_group: bool = False) -> Callable[[], None] | None:
    """A preexec function: (with ``new_group``, enter a new process group, as Popen's
    ``process_group=0``,) ask for ``sig`` when the parent dies, and exit at once if it already has.
    It calls os.setpgid and a function pointer resolved before the fork, nothing else (safe beside
    threads)."""
    prctl = _libc_prctl()
    if not prctl and not new_group:
        return None

    def preexec() -> None:
        if new_group:
            os.setpgid(0, 0)
        if prctl:
            prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)
            if os.getppid() != parent:
                os._exit(127)

    return preexec


def stopping() -> bool:
    """Whether qola was told to stop (SIGINT/SIGTERM/SIGHUP under :func:`signals_end_children`)."""
    return _stop.is_set()


def check_stop() -> None:
    """Raise :class:`Interrupted` once qola was told to stop (for loops in worker threads)."""
    if _stop.is_set():
        raise Interrupted(_stop_signal[0])


def reset_stop() -> None:
    """Forget an earlier stop: for a process that goes on to run more after an interrupted command
    (a test suite). :func:`signals_end_children` calls it when it starts."""
    _stop.clear()


def why_ended(exc: subprocess.TimeoutExpired) -> str:
    """Why a child was ended early, for messages: past its time limit or past its output limit."""
    return str(exc) if isinstance(exc, OutputLimit) else f"no answer within {exc.timeout:g} s; ended"


def _env_of(env: Mapping[str, str] | ChildEnv | None) -> dict[str, str] | None:
    return None if env is None else env.as_dict() if isinstance(env, ChildEnv) else dict(env)


@dataclass(frozen=True)
class Streams:
    """Where a child's standard streams go (``subprocess`` spellings: :data:`PIPE`, :data:`STDOUT`,
    :data:`DEVNULL`, a file), and whether its pipes carry text."""

    stdin: Any = DEVNULL
    stdout: Any = PIPE
    stderr: Any = STDOUT
    text: bool = True


def popen(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | ChildEnv | None = None,
    cwd: str | os.PathLike[str] | None = None,
    streams: Streams | None = None,
    death_signal: int = signal.SIGTERM,
    own_group: bool = True,
) -> subprocess.Popen[Any]:
    """Start ``argv`` in a new process group with a parent-death signal and remember its group.
    Prefer :func:`run` or :func:`started`; a caller of this must call :func:`finish`. Raises
    :class:`Interrupted` once qola was told to stop. ``own_group=False``: the child stays in this
    process's group (a compile a launcher runs under ninja: ended with ninja's group, as the compile
    without a launcher would be)."""
    check_stop()
    streams = streams or Streams()
    text = streams.text
    kwargs: dict[str, Any] = {"errors": "replace"} if text else {}
    if _POPEN_PROCESS_GROUP and own_group:
        kwargs["process_group"] = 0
    proc = subprocess.Popen(
        [os.fspath(a) for a in argv],
        env=_env_of(env),
        cwd=cwd,
        stdin=streams.stdin,
        stdout=streams.stdout,
        stderr=streams.stderr,
        text=text,
        preexec_fn=_death_signal(os.getpid(), death_signal, new_group=own_group and not _POPEN_PROCESS_GROUP),
        **kwargs,
    )
    with _live_lock:
        _live[proc.pid] = proc
    if _stop.is_set():  # the signal came while it started: terminate_all did not see it
        finish(proc, ended=True)
        check_stop()
    return proc


def finish(proc: subprocess.Popen[Any], *, ended: bool = False) -> None:
    """Forget ``proc``; with ``ended`` (the caller stops waiting early) end its group first."""
    try:
        if ended:
            end_group(proc)
    finally:
        with _live_lock:
            _live.pop(proc.pid, None)
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                with suppress(OSError):
                    stream.close()


def _leads_group(proc: subprocess.Popen[Any]) -> bool:
    """Whether ``proc`` leads its own process group (True when it is gone: its group is what is left)."""
    try:
        return os.getpgid(proc.pid) == proc.pid
    except ProcessLookupError:
        return True


def _signal_one(pid: int, sig: int) -> bool:
    try:
        os.kill(pid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def _signal_group(pgid: int, sig: int) -> bool:
    try:
        os.killpg(pgid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def end_group(proc: subprocess.Popen[Any], grace: float = GRACE) -> None:
    """SIGTERM to ``proc``'s group, up to ``grace`` seconds for its leader, then SIGKILL to the group
    (a child started in this process's group, ``own_group=False``: to the child alone)."""
    send = _signal_group if _leads_group(proc) else _signal_one
    if proc.returncode is None:
        send(proc.pid, signal.SIGTERM)
        with suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace)
    # the leader is reaped only here or by its waiter: its pid (= the group id) is not reused before
    send(proc.pid, signal.SIGKILL)
    with suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace)


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
def started(argv: Sequence[str], **kwargs: Any) -> Iterator[subprocess.Popen[Any]]:
    """``with started(argv, ...) as p:`` — the group is ended if the block exits by an exception."""
    proc = popen(argv, **kwargs)
    ok = False
    try:
        yield proc
        ok = True
    finally:
        finish(proc, ended=not ok or (proc.returncode is None and proc.poll() is None))


def _communicate(
    proc: subprocess.Popen[Any], argv: Sequence[str], data: bytes | None, timeout: float | None, keep: int | None
) -> tuple[bytes | None, bytes | None]:
    """Feed ``data``, read stdout/stderr as they come into bounded buffers, wait for the exit;
    TimeoutExpired past ``timeout`` seconds (the caller ends the group)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    kept: dict[int, capture.Kept] = {}
    sel = selectors.DefaultSelector()
    view, sent = memoryview(data or b""), 0
    try:
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                kept[stream.fileno()] = capture.Kept(MAX_CAPTURE, keep)
                sel.register(stream.fileno(), selectors.EVENT_READ)
        if proc.stdin is not None:
            if len(view):
                os.set_blocking(proc.stdin.fileno(), False)
                sel.register(proc.stdin.fileno(), selectors.EVENT_WRITE)
            else:
                proc.stdin.close()
        while sel.get_map():
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                so_far = b"".join(k.value()[-(1 << 16) :] for k in kept.values())
                raise subprocess.TimeoutExpired(list(argv), timeout or 0, so_far)
            for key, _ in sel.select(left):
                fd = key.fd
                if fd in kept:
                    chunk = os.read(fd, _CHUNK)
                    if chunk:
                        try:
                            kept[fd].write(chunk)
                        except capture.Overflow as full:
                            raise OutputLimit(argv, MAX_CAPTURE, full.held) from None
                        continue
                else:
                    try:
                        sent += os.write(fd, view[sent : sent + _CHUNK])
                    except BlockingIOError:
                        continue
                    except BrokenPipeError:
                        sent = len(view)
                    if sent < len(view):
                        continue
                    sel.unregister(fd)
                    assert proc.stdin is not None
                    proc.stdin.close()
                    continue
                sel.unregister(fd)
        proc.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
    finally:
        sel.close()
    out = kept[proc.stdout.fileno()].value() if proc.stdout is not None else None
    err = kept[proc.stderr.fileno()].value() if proc.stderr is not None else None
    return out, err


@dataclass(frozen=True)
class Output:
    """What :func:`run` does with a child's output: where stdout and stderr go (stderr into stdout
    unless told otherwise), whether it is decoded to text, ``log``: a file the command, its output
    and exit status are also appended to; ``keep`` (bytes): the output is cut in the middle past
    that instead of ending the child past :data:`MAX_CAPTURE`."""

    stdout: Any = PIPE
    stderr: Any = STDOUT
    text: bool = True
    log: str | os.PathLike[str] | None = None
    keep: int | None = None


SEPARATE = Output(stderr=PIPE)  # stdout and stderr captured apart
FOR_LOG = Output(keep=LOG_KEEP)  # what only goes to a log: its head and tail past LOG_KEEP bytes


def run(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | ChildEnv | None = None,
    cwd: str | os.PathLike[str] | None = None,
    input: str | bytes | None = None,
    timeout: float | None = None,
    out: Output | None = None,
) -> subprocess.CompletedProcess[Any]:
    """Run ``argv`` to completion (output captured as ``out`` says; default: stderr into stdout, as
    text); never raises for a non-zero exit. A timeout ends the whole group and raises
    ``TimeoutExpired``; so does any exception while waiting. A captured stream over
    :data:`MAX_CAPTURE` bytes ends the group too (:class:`OutputLimit`); with ``out.keep`` (bytes)
    the output is cut in the middle instead, the cut said where it was."""
    out = out or Output()
    data = input.encode() if isinstance(input, str) else input
    streams = Streams(PIPE if input is not None else DEVNULL, out.stdout, out.stderr, text=False)
    with started(argv, env=env, cwd=cwd, streams=streams) as proc:
        try:
            raw_out, raw_err = _communicate(proc, argv, data, timeout, out.keep)
        except subprocess.TimeoutExpired:
            end_group(proc, grace=1.0)
            raise
    stdout: Any = _decode(raw_out) if out.text else raw_out
    stderr: Any = _decode(raw_err) if out.text else raw_err
    result = subprocess.CompletedProcess(list(argv), proc.returncode, stdout, stderr)
    if out.log is not None:
        write_log(Path(out.log), argv, result)
    return result


def _decode(data: bytes | None) -> str | None:
    """As a text-mode pipe reads it: invalid bytes replaced, universal newlines."""
    if data is None:
        return None
    return data.decode(errors="replace").replace("\r\n", "\n").replace("\r", "\n")


def run_checked(
    argv: Sequence[str], *, hint: str | None = None, any_exit: bool = False, timeout: float | None = None, **kwargs: Any
) -> subprocess.CompletedProcess[Any]:
    """:func:`run` for a child that must work: one that cannot be started, runs past ``timeout``
    or (unless ``any_exit``) exits non-zero raises :class:`qola.core.errors.FailedProcessError` — the
    one error, and format, for a failed child (its command, why, the tail of its output, ``hint``)."""
    from qola.core.errors import FailedProcessError  # lazy: only when a child runs

    try:
        result = run(argv, timeout=timeout, **kwargs)
    except TimeoutExpired as exc:
        raise FailedProcessError(argv, 124, _as_text(exc.output), hint, reason=why_ended(exc)) from None
    except OSError as exc:
        raise FailedProcessError(
            argv, 127, "", hint, reason=f"cannot run {os.fspath(argv[0])}: {exc.strerror or exc}"
        ) from None
    if result.returncode != 0 and not any_exit:
        raise FailedProcessError(argv, result.returncode, _as_text(result.stdout) + _as_text(result.stderr), hint)
    return result


def _as_text(x: Any) -> str:
    return x.decode(errors="replace") if isinstance(x, bytes) else (x or "")


def write_log(path: Path, argv: Sequence[str], result: subprocess.CompletedProcess[Any]) -> None:
    from qola.core.fsutil import append_text  # lazy: not on the no-op path (which imports this module)

    as_text = _as_text
    append_text(
        path,
        f"$ {shlex.join(str(a) for a in argv)}\n{as_text(result.stdout)}{as_text(result.stderr)}"
        f"(exit code {result.returncode})\n",
    )


_HANDLED = ("SIGINT", "SIGTERM", "SIGHUP")


@contextmanager
def signals_end_children() -> Iterator[None]:
    """While active (main thread only), SIGINT/SIGTERM/SIGHUP end every child group started here and
    raise :class:`Interrupted` in the main thread (and from then on :func:`check_stop` in every
    thread, until :func:`reset_stop`); the previous handlers come back afterwards."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        _stop_signal[0] = signum
        _stop.set()  # worker threads: no new child, lock waits end (check_stop)
        terminate_all()
        raise Interrupted(signum)

    reset_stop()  # a new command in this process (tests run several)
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
        # the stop outlives the block: a worker thread the interrupted main thread could not join (a
        # signal inside ThreadPoolExecutor's thread start orphans the thread) must still stop


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
