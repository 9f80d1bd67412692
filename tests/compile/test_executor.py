"""Issue 43 item 3: where the compiles run is one value (:mod:`qola.compile.executor`), chosen once:
local, sccache-dist or an REAPI service, each saying its -j, launcher, header, progress line and the
notes after the run, so the pipeline never branches on the kind."""

from __future__ import annotations

from pathlib import Path

import pytest

from qola.compile import executor
from qola.compile.dist import Farm
from qola.core import rules
from qola.core.errors import QolaError
from qola.core.proc import ChildEnv
from qola.toolchain.base import Toolchain


def asked(
    *, dist: bool = False, launcher: str | None = None, service: executor.Service | None = None
) -> executor.Asked:
    return executor.Asked(dist, "cuda", launcher, 4, jobs_given=False, service=service)


def no_launcher(name: str, hint: str | None) -> str | None:
    raise QolaError(f"compiler launcher {name!r} not found on PATH", hint=hint)


def test_local_is_chosen_without_dist_or_remote_and_adds_nothing() -> None:
    ex = executor.choose(asked(), find=no_launcher, env={})
    assert isinstance(ex, executor.Local) and ex.jobs == 4 and ex.launcher is None and ex.farm is None
    assert ex.header() == "" and ex.notes == ()
    shown: list[str] = []
    ex.status(lambda d, t, text: shown.append(text))(1, 2, "CC a.o")
    assert shown == ["CC a.o"]
    assert ex.watch(ChildEnv.of({}), dry_run=False)() == ()  # no sccache: nothing to say after the run
    with pytest.raises(QolaError, match="'ccache' not found on PATH"):
        executor.choose(asked(launcher="ccache"), find=no_launcher, env={})


def test_a_farm_that_answered_is_dist_and_heads_the_build_line() -> None:
    ex = executor.Dist(64, "/usr/bin/sccache", Farm("http://s:10600", 2, 64))
    assert ex.header() == " (farm: 2 server(s), 64 CPUs at http://s:10600)"
    assert ex.watch(ChildEnv.of({}), dry_run=True)() == ()  # a dry run asks sccache nothing


def test_remote_refuses_dist_and_launchers_then_connects_once_ready(tmp_path: Path) -> None:
    calls: list[executor.Where] = []
    (tmp_path / "remote").mkdir()
    launcher = tmp_path / "remote" / "cc"

    def connect(where: executor.Where) -> executor.Connected:
        calls.append(where)
        return executor.Connected(str(launcher), "qola-toolchain=abc")

    service = executor.Service("http://h:1", 8, connect)
    for refused in (asked(dist=True, service=service), asked(launcher="ccache", service=service)):
        with pytest.raises(QolaError, match="takes no --dist or launcher"):
            executor.choose(refused, find=no_launcher, env={})
    ex = executor.choose(asked(service=service), find=no_launcher, env={})
    assert ex is service and ex.launcher is None and not calls  # nothing is asked of the service yet
    tc = Toolchain("cuda", "/usr/bin/nvcc", "13.0", "nvcc 13.0", "x", ("sm_90",), "c++", child_env={})
    where = executor.Where(tc, tmp_path, str(tmp_path), {})
    ready = ex.ready(where)
    assert calls == [where] and ready.launcher == str(launcher) and ready.jobs == 8
    assert ready.header() == " (remote: http://h:1, qola-toolchain=abc)"
    (tmp_path / "remote" / "tally").write_text("remote a.o\ncached b.o\nlocal c.o: unavailable\n")
    shown: list[str] = []
    ready.status(lambda d, t, text: shown.append(text))(3, 3, "CC c.o")
    assert shown == ["CC c.o [remote 1, cached 1, local 1]"]  # after the edge: the reporter reads a module's end there
    after = ready.watch(ChildEnv.of({}), dry_run=False)()
    assert after == (
        "--remote (http://h:1): 1 compile(s) ran on workers, 1 came from the action cache, 1 compiled locally "
        "(the service failed; --remote-fallback: c.o: unavailable)",
    )
    assert ready.watch(ChildEnv.of({}), dry_run=True)() == ()


def test_a_farm_reporting_a_billion_cpus_gets_the_job_cap_not_a_billion_jobs(tmp_path: Path) -> None:
    """Issue 51: ``-j`` for a farm is bounded like every other job count (:data:`qola.core.rules.MAX_JOBS`)."""
    fake = tmp_path / "sccache"
    status = '{"SchedulerStatus": ["http://s:1", {"num_servers": 1, "num_cpus": 1000000000}]}'
    fake.write_text(f"#!/bin/sh\necho '{status}'\n")
    fake.chmod(0o755)
    ex = executor.choose(asked(dist=True), find=lambda name, hint: str(fake), env={})
    assert isinstance(ex, executor.Dist) and ex.farm is not None and ex.farm.cpus == 10**9
    assert ex.jobs == rules.MAX_JOBS
