"""A loopback REAPI service for the ``remote`` tests: BuildGrid (pip ``buildgrid``, its scheduler on a
throw-away PostgreSQL) and buildbox workers (Debian's ``buildbox``: buildbox-casd + buildbox-worker
+ buildbox-run-hosttools), all on 127.0.0.1, all ended when the ``with`` block ends.

Installed in the ROCm 7 env by ``scripts/rocm7.sh setup`` (apt: buildbox, postgresql; the server in
its own venv, /opt/qola-bgd-venv). Start-up measured there: about 3 s.

The workers use buildbox-run-hosttools: inside the chroot the kernel refuses the new user namespace
buildbox-run-bubblewrap needs (a chrooted process may not create one); production workers should
use bubblewrap (docs/distributed.md).
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BGD = "/opt/qola-bgd-venv/bin/bgd"
CHROOT = Path(os.environ.get("QOLA_ROCM7_ROOT") or Path.home() / ".cache" / "qola-rocm7" / "sid")
REPO = Path(__file__).resolve().parents[2]
TOOLS = ("trexe", "buildbox-worker", "buildbox-casd", "buildbox-run-hosttools")


def missing_host() -> str | None:
    """Why the host-side stack (CUDA: nvcc lives on the host) cannot start (None: it can)."""
    if os.geteuid() != 0:
        return "needs root (the ROCm 7 chroot)"
    if not (CHROOT / ".qola-remote-recipe").exists():
        return f"the ROCm 7 chroot's remote-execution packages are missing under {CHROOT} (scripts/rocm7.sh setup)"
    return None


def host_tools(bindir: Path) -> Path:
    """buildbox's programs from the ROCm 7 chroot, runnable on the host: wrappers that start each
    with the chroot's dynamic loader and libraries (the host's Debian 12 has no buildbox package and
    an older glibc); what they run (bash, nvcc) is the host's own."""
    bindir.mkdir(parents=True, exist_ok=True)
    loader = CHROOT / "lib64" / "ld-linux-x86-64.so.2"
    libs = f"{CHROOT}/usr/lib/x86_64-linux-gnu:{CHROOT}/lib/x86_64-linux-gnu"
    for tool in TOOLS:
        w = bindir / tool
        w.write_text(f'#!/bin/sh\nexec {loader} --library-path {libs} {CHROOT}/usr/bin/{tool} "$@"\n')
        w.chmod(0o755)
    return bindir


def missing() -> str | None:
    """Why the stack cannot start here (None: it can)."""
    if not os.path.exists(BGD):
        return f"{BGD} (BuildGrid) missing: scripts/rocm7.sh setup installs it"
    gone = [t for t in TOOLS if not shutil.which(t)]
    if gone:
        return f"{', '.join(gone)} missing (apt-get install buildbox)"
    if not glob.glob("/usr/lib/postgresql/*/bin/initdb"):
        return "postgresql missing (apt-get install postgresql)"
    if os.geteuid() != 0:
        return "needs root (PostgreSQL runs as the postgres user)"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


CONFIG = """server:
  - !channel
    address: "127.0.0.1:{port}"
    insecure-mode: true
authorization:
{auth}
connections:
  - !sql-connection &sql
    connection-string: postgresql://bgd@/bgd?host={pg}
storages:
  - !disk-storage &store
    path: {cas}
caches:
  - !lru-action-cache &ac
    storage: *store
    max-cached-refs: 100000
    allow-updates: true
    cache-failed-actions: false
schedulers:
  - !sql-scheduler &sched
    sql: *sql
    action-cache: *ac
    storage: *store
    property-set: !dynamic-property-set
      match-property-keys: [qola-toolchain]
instances:
  - name: "{instance}"
    services:
      - !action-cache
        cache: *ac
      - !execution
        scheduler: *sched
      - !cas
        storage: *store
      - !bytestream
        storage: *store
"""


@dataclass
class Stack:
    root: Path
    port: int
    instance: str = ""
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    workers: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    pg: Path | None = None
    startup: float = 0.0

    @property
    def url(self) -> str:
        return f"grpc://127.0.0.1:{self.port}"

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        log = open(self.root / f"{name}.log", "wb")  # noqa: SIM115 (closed with the process)
        p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        self.procs.append(p)
        return p

    def worker(self, name: str, toolchain: str, jobs: int = 2, tools: Path | None = None) -> subprocess.Popen[bytes]:
        """A buildbox worker (with its own casd) offering ``qola-toolchain=<toolchain>`` (``tools``:
        where buildbox's programs are, else PATH)."""

        def tool(t: str) -> str:
            return str(tools / t) if tools else (shutil.which(t) or t)

        sock = self.root / f"{name}.casd.sock"
        self._spawn(
            f"{name}-casd",
            [
                tool("buildbox-casd"),
                f"--cas-remote=http://127.0.0.1:{self.port}",
                f"--cas-instance={self.instance}",
                f"--bind=unix:{sock}",
                str(self.root / f"{name}.casd"),
            ],
        )
        wait_for(lambda: sock.exists(), f"{name}'s casd socket", self.root)
        p = self._spawn(
            name,
            [
                tool("buildbox-worker"),
                f"--bots-remote=http://127.0.0.1:{self.port}",
                f"--instance={self.instance}",
                f"--cas-remote=unix:{sock}",
                f"--concurrent-jobs={jobs}",
                "--buildbox-run=" + tool("buildbox-run-hosttools"),
                "--runner-arg=--staging-mode=copy-or-link",
                f"--platform=qola-toolchain={toolchain}",
                "--max-wait-time=2",
                name,
            ],
        )
        self.workers[name] = p
        return p

    def stop_worker(self, name: str) -> None:
        _end(self.workers.pop(name))

    def log(self, name: str) -> str:
        return (self.root / f"{name}.log").read_text(errors="replace")


def wait_for(ready: Callable[[], bool], what: str, root: Path, timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > end:
            logs = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-2000:]}" for p in root.glob("*.log"))
            raise RuntimeError(f"{what} not ready after {timeout:.0f} s\n{logs}")
        time.sleep(0.1)


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), 0.2).close()
        return True
    except OSError:
        return False


def _end(p: subprocess.Popen[Any], grace: float = 5.0) -> None:
    if p.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, 15)
        try:
            p.wait(grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, 9)
            p.wait(10)


@contextlib.contextmanager
def running(root: Path, *, auth_secret: str | None = None, instance: str = "") -> Iterator[Stack]:
    """PostgreSQL + BuildGrid under ``root`` (add workers with :meth:`Stack.worker`)."""
    start = time.monotonic()
    root.mkdir(parents=True, exist_ok=True)
    os.chmod(root, 0o755)
    pgbin = max(glob.glob("/usr/lib/postgresql/*/bin"))
    pg = Path(tempfile.mkdtemp(prefix="qola-pg-"))  # the postgres user must reach it (pytest's dirs are 0700)
    os.chmod(pg, 0o755)
    shutil.chown(pg, "postgres")
    su = ["su", "postgres", "-s", "/bin/sh", "-c"]
    subprocess.run([*su, f"{pgbin}/initdb -D {pg}/data -A trust -U bgd >{pg}/initdb.log 2>&1"], check=True)
    subprocess.run(
        [*su, f"{pgbin}/pg_ctl -D {pg}/data -o '-k {pg} -c listen_addresses=' -l {pg}/pg.log -w start"],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    stack = Stack(root, free_port(), instance, pg=pg)
    try:
        subprocess.run([*su, f"{pgbin}/createdb -h {pg} -U bgd bgd"], check=True)
        subprocess.run(
            [BGD, "migrate", "apply", f"postgresql://bgd@/bgd?host={pg}"],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        auth = "  method: none"
        if auth_secret is not None:
            (root / "jwt.secret").write_text(auth_secret)
            auth = f"  method: jwt\n  secret: {root / 'jwt.secret'}\n  algorithm: hs256"
        (root / "bgd.yml").write_text(
            CONFIG.format(port=stack.port, pg=pg, cas=root / "cas", auth=auth, instance=instance)
        )
        stack._spawn("bgd", [BGD, "server", "start", str(root / "bgd.yml")])
        wait_for(lambda: _listening(stack.port), "BuildGrid", root)
        stack.startup = time.monotonic() - start
        yield stack
    finally:
        for p in reversed(stack.procs):
            _end(p)
        subprocess.run(
            [*su, f"{pgbin}/pg_ctl -D {pg}/data stop -m immediate"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=False,
        )
        shutil.rmtree(pg, ignore_errors=True)


@contextlib.contextmanager
def in_chroot(root: Path) -> Iterator[Stack]:
    """The service (PostgreSQL + BuildGrid) started inside the ROCm 7 chroot from the host (for the
    CUDA test: nvcc and the workers run on the host); ``root`` holds the host-side workers' files."""
    root.mkdir(parents=True, exist_ok=True)
    p = subprocess.Popen(
        ["bash", str(REPO / "scripts" / "rocm7.sh"), "run", "python", str(Path(__file__).resolve()), "serve"],
        stdout=subprocess.PIPE,
        stderr=open(root / "chroot.log", "wb"),  # noqa: SIM115
        text=True,
        start_new_session=True,
        cwd=REPO,
    )
    try:
        line = p.stdout.readline() if p.stdout else ""
        if not line.startswith("READY "):
            raise RuntimeError(f"the service did not start: {line!r}\n{(root / 'chroot.log').read_text()[-3000:]}")
        stack = Stack(root, int(line.split()[1]))
        stack.startup = float(line.split()[2])
        yield stack
        for w in list(stack.workers):
            stack.stop_worker(w)
        for q in stack.procs:
            _end(q)
    finally:
        _end(p, grace=60.0)  # it ends its service first (bounded: 5 s a process)


def _serve() -> None:
    """Inside the chroot: run the service until SIGTERM/SIGINT/SIGHUP, then end it cleanly."""
    import signal

    stop = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop)
    with tempfile.TemporaryDirectory(prefix="qola-svc-") as tmp, running(Path(tmp)) as svc:
        print(f"READY {svc.port} {svc.startup:.2f}", flush=True)
        signal.sigwait(stop)


if __name__ == "__main__":
    import sys

    if sys.argv[1:] == ["serve"]:
        _serve()
