"""Exclusive locks for a build: one ``qola build`` at a time per build dir and per output dir.

Each lock is an ``flock`` on a small file that also says who holds it (pid, host, start time,
command, working dir). The kernel drops an ``flock`` when its holder dies, however it dies, so a
stale file never blocks anyone; what it says is only read when the lock is busy.

* the build dir's lock: ``<build dir>/.qola.lock``;
* the output dir's lock: ``<parent>/.<name>.qola.lock`` beside the output dir (its contents are
  published, audited and may be replaced as a whole, so the lock lives next to it, not in it);
  where that parent is not writable, the output dir itself (an ``flock`` on the directory: the
  holder is then named from ``/proc/locks``).

Every wait for a lock that another process holds goes through :func:`wait_flock`: it says once
that it waits and for whom, again every :data:`EVERY` seconds, ends at its deadline, and ends at
once (:class:`qola.core.proc.Interrupted`) when qola is told to stop (SIGTERM, SIGINT, SIGHUP), in
whichever thread it waits.

Standard library only (taken before the no-op fast path).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import json
import math
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qola.core import proc
from qola.core.errors import QolaError
from qola.core.secret import redact_argv

BUILD_LOCK = ".qola.lock"
POLL = 0.2
EVERY = 60.0  # seconds between "still waiting" messages


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def try_flock(fd: int, shared: bool = False) -> bool:
    """Take the flock on ``fd`` if it is free; False if another holds it."""
    try:
        fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        return True
    except OSError as exc:
        if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise
        return False


def wait_flock(
    fd: int,
    what: str,
    *,
    wait: float | None,
    holder: Callable[[], str] = lambda: "",
    shared: bool = False,
    say: Callable[[str], None] = _stderr,
) -> bool:
    """Take the flock on ``fd`` (``what`` it guards, for messages), waiting up to ``wait`` seconds
    (None or 0: not at all; ``inf``: as long as it takes) while another holds it. Says when it starts
    waiting (with ``holder()``, who holds it) and every :data:`EVERY` seconds; raises
    :class:`qola.core.proc.Interrupted` as soon as qola is told to stop. False when the deadline passed."""
    if try_flock(fd, shared):
        return True
    if not wait:
        return False
    start = time.monotonic()
    limit = "as long as it takes" if math.isinf(wait) else f"up to {wait:g} s"
    who = holder()
    say(f"waiting for {what}{f' (held by {who})' if who else ''}, {limit}; SIGTERM or Ctrl-C stops the wait")
    told = start
    while True:
        proc.check_stop()
        now = time.monotonic()
        if now - start >= wait:
            return False
        if now - told >= EVERY:
            told = now
            say(f"still waiting for {what} ({int(now - start)} s)")
        time.sleep(POLL)
        if try_flock(fd, shared):
            return True


def build_lock_path(build_dir: Path) -> Path:
    return build_dir / BUILD_LOCK


def output_lock_path(out: Path) -> Path:
    beside = out.with_name(f".{out.name}.qola.lock")
    parent = out.parent
    if out.is_dir() and not out.is_symlink() and parent.is_dir() and not os.access(parent, os.W_OK | os.X_OK):
        return out
    return beside


@dataclass
class Held:
    paths: list[Path]
    fds: list[int]
    created: list[Path] = field(default_factory=list)  # lock files and directories this acquire made

    def undo(self) -> None:
        """Remove what taking the locks created (the lock files, then the directories made for them,
        if empty), while still held: a command refused before any work leaves nothing behind. A
        waiter that opened a removed file notices when it gets the lock (:func:`acquire` retries)."""
        for path in reversed(self.created):
            try:
                if path.is_dir() and not path.is_symlink():
                    path.rmdir()
                else:
                    path.unlink()
            except OSError:
                pass  # not empty (something else was written there): kept
        self.created.clear()

    def release(self) -> None:
        while self.fds:
            fd = self.fds.pop()
            try:
                fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                os.close(fd)

    def __enter__(self) -> Held:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _from_proc_locks(fd: int) -> dict[str, Any]:
    """pid and command of the process holding an flock on ``fd``'s file, from /proc/locks."""
    try:
        st = os.fstat(fd)
        key = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
        with open("/proc/locks") as fh:
            for line in fh:
                parts = line.split()
                if len(parts) >= 6 and parts[1] == "FLOCK" and parts[5] == key:
                    pid = int(parts[4])
                    with open(f"/proc/{pid}/cmdline", "rb") as cf:
                        cmd = cf.read().replace(b"\0", b" ").decode(errors="replace").strip()
                    return {"pid": pid, "command": cmd or "?"}
    except (OSError, ValueError, IndexError):
        pass
    return {}


def holder_text(path: Path, fd: int | None = None) -> str:
    """Who holds the lock at ``path``, as one phrase (from the file the holder wrote, else from
    /proc/locks)."""
    data: object = {}
    if not path.is_dir():
        try:
            with open(path, "rb") as fh:
                data = json.loads(fh.read(64 * 1024) or b"{}")
        except (OSError, ValueError):
            data = {}
    if (not isinstance(data, dict) or "pid" not in data) and fd is not None:
        data = _from_proc_locks(fd)
    if not isinstance(data, dict) or "pid" not in data:
        return "its holder has not said who it is yet"
    started = data.get("started")
    when = ""
    if isinstance(started, (int, float)):
        ago = max(0, int(time.time() - started))
        when = f", started {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(started))} ({ago} s ago)"
    host = data.get("host")
    where = f" on {host}" if host and host != os.uname().nodename else ""
    cwd = f" (in {data['cwd']})" if data.get("cwd") else ""
    return f"pid {data.get('pid')}{where}{when}, command: {data.get('command', '?')}{cwd}"


def _same_file(fd: int, path: Path) -> bool:
    """Whether ``path`` still names the file open as ``fd``."""
    try:
        a, b = os.fstat(fd), os.stat(path, follow_symlinks=False)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


@contextlib.contextmanager
def holding(path: Path, what: str) -> Iterator[bool]:
    """Hold the flock on the lock file ``path`` (created; no link followed) for the block, waiting as
    long as it takes and saying so (:func:`wait_flock`); yields False, unlocked, where the file cannot
    be opened (a caller that only saves work then does it unlocked)."""
    try:
        fd = _open(path, [])
    except OSError:
        yield False
        return
    try:
        wait_flock(fd, what, wait=math.inf)
        yield True
    finally:
        os.close(fd)  # closing drops the flock


def _open(path: Path, created: list[Path]) -> int:
    """Open (create) the lock file ``path``; what is created for it (its missing parent directories,
    outermost first, then the file) is appended to ``created``."""
    if path.is_dir() and not path.is_symlink():
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    missing = [p for p in (path.parent, *path.parent.parents) if not p.exists()][::-1]
    path.parent.mkdir(parents=True, exist_ok=True)
    created += [p for p in missing if p.is_dir()]
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
    except FileExistsError:
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
    created.append(path)
    return fd


def _write_info(fd: int, command: Sequence[str]) -> None:
    info = {
        "pid": os.getpid(),
        "host": os.uname().nodename,
        "started": time.time(),
        "command": " ".join(redact_argv(command)),  # a URL's credentials never reach the file
        "cwd": os.getcwd(),
    }
    data = json.dumps(info).encode()
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)


def acquire(locks: Mapping[Path, str], command: Sequence[str], *, wait: float | None = None) -> Held:
    """Take every lock file in ``locks`` (lock file -> what it guards, for messages), in a fixed
    order so that waiters never deadlock.

    ``wait``: None fails at once when one is busy; a number waits up to that many seconds for each
    (``float('inf')``: as long as it takes), saying so (:func:`wait_flock`). Raises QolaError naming
    the holder; :class:`qola.core.proc.Interrupted` when qola is told to stop while it waits."""
    held = Held([], [])
    try:
        for path in sorted(Path(p) for p in locks):
            while True:
                try:
                    fd = _open(path, held.created)
                except OSError as exc:
                    raise QolaError(
                        f"cannot create the lock file {path}: {exc.strerror or exc}",
                        hint="check that its directory exists and is writable",
                    ) from None
                held.fds.append(fd)
                try:
                    got = wait_flock(fd, locks[path], wait=wait, holder=functools.partial(holder_text, path, fd))
                except OSError as exc:
                    raise QolaError(f"cannot lock {path}: {exc.strerror or exc}") from None
                if not got or _same_file(fd, path):
                    break
                held.fds.remove(fd)  # its holder removed the file (Held.undo) while we waited: take the new one
                os.close(fd)
            if not got:
                waited = "" if wait is None else f" (waited {wait:g} s)"
                raise QolaError(
                    f"another qola build is using {locks[path]}{waited}: {holder_text(path, fd)}",
                    hint="wait for it to finish, or pass --wait to queue behind it"
                    if wait is None
                    else "try again later, or raise --wait",
                )
            if not path.is_dir():
                _write_info(fd, command)
            held.paths.append(path)
    except BaseException:
        held.release()
        raise
    return held
