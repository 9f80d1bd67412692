"""Compiling through sccache: the build farm ``qola build --dist`` uses, and what sccache did.

sccache keeps its own configuration: the farm (``[dist] scheduler_url``, ``[dist.auth]`` token) and
the cache backend (disk, Redis, S3 …) live in its config file (``SCCACHE_CONF``, else
``~/.config/sccache/config``) and ``SCCACHE_*`` variables, read when its server starts. qola never
reads that file (it holds a secret); it asks sccache:

- :func:`farm`: ``sccache --dist-status`` -> the scheduler, its servers and their CPUs (``-j`` is
  sized for the farm), or a clear error when no farm is configured;
- :func:`stats` before and after ninja -> :class:`Stats` of this build: compiles, cache hits,
  compiles that ran on the farm (``dist_compiles``), failed farm attempts.

HIP is compiled locally under ``--dist`` (:data:`HIP_LOCAL`; docs/distributed.md, "HIP", has the
measurements): sccache packages only the ``hipcc`` binary, which then cannot find clang on the
build server; ``clang -x hip`` fails there without the ROCm device libraries and, given them in a
custom toolchain archive, produces objects whose compilation-unit id is empty (``__hip_cuid_``), so
they differ from local ones and collide when two are linked into one library.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from qola.core import proc, rules
from qola.core.errors import QolaError
from qola.core.proc import ChildEnv

TIMEOUT = 60.0  # seconds for one sccache query (the first one starts its server)
DOCS = "docs/distributed.md"
HIP_LOCAL = (
    "--dist: sccache-dist cannot distribute HIP compiles (hipcc is not a toolchain it can package, and "
    f"clang -x hip loses its compilation-unit id on a build server; {DOCS}): compiling locally"
)


@dataclass(frozen=True)
class Farm:
    """An sccache-dist scheduler that answered, and what it has."""

    scheduler: str
    servers: int
    cpus: int


def is_sccache(launcher: str | None) -> TypeGuard[str]:
    return launcher is not None and os.path.basename(launcher) in ("sccache", "sccache.exe")


def _query(sccache: str, args: list[str], env: Mapping[str, str] | ChildEnv) -> str:
    hint = f"check that {sccache} runs (sccache --show-stats); its log: SCCACHE_ERROR_LOG=FILE SCCACHE_LOG=info"
    return str(proc.run_checked([sccache, *args], env=env, timeout=TIMEOUT, out=proc.SEPARATE, hint=hint).stdout)


def _status(sccache: str, env: Mapping[str, str] | ChildEnv) -> tuple[object, str]:
    """``sccache --dist-status``: (its JSON, or None; the text)."""
    text = _query(sccache, ["--dist-status"], env)
    try:
        return json.loads(text), text
    except ValueError:
        return None, text


def _disabled(status: object) -> bool:
    return status in ({"Disabled": "disabled"}, "Disabled")


def farm(sccache: str, env: Mapping[str, str] | ChildEnv) -> tuple[Farm | None, str | None]:
    """The farm sccache is configured for: (Farm, None), or (None, why) when its scheduler does not
    answer (sccache then compiles locally, and so does the build). No farm configured at all is an
    error: ``--dist`` asked for one."""
    status, text = _status(sccache, env)
    if _disabled(status):
        raise QolaError(
            "--dist: sccache has no build farm configured (sccache --dist-status: disabled)",
            hint="give sccache a [dist] section (scheduler_url, [dist.auth]) in its config file (SCCACHE_CONF, "
            "else ~/.config/sccache/config) and restart its server (sccache --stop-server); "
            f"{DOCS} shows a farm setup",
        )
    if isinstance(status, dict) and isinstance(status.get("SchedulerStatus"), list):
        url, info = (status["SchedulerStatus"] + [{}, {}])[:2]
        info = info if isinstance(info, dict) else {}
        return Farm(str(url), _count(info.get("num_servers")), _count(info.get("num_cpus"))), None
    why = next(iter(status.values())) if isinstance(status, dict) and status else text.strip()
    return None, f"the sccache-dist scheduler does not answer ({str(why)[:200]})"


def hip_warning(sccache: str, env: Mapping[str, str] | ChildEnv) -> str | None:
    """For a HIP build whose launcher is sccache: a warning when sccache is configured for a farm
    (it would try to send the HIP compiles there, see the module's docstring)."""
    try:
        status, _ = _status(sccache, env)
    except QolaError:
        return None
    if status is None or _disabled(status):
        return None
    return (
        f"sccache is configured for an sccache-dist farm, which cannot compile HIP ({DOCS}): its attempts "
        "fail on the build servers (hipcc) and slow the build; give HIP builds an sccache config without [dist]"
    )


@dataclass(frozen=True)
class Choice:
    """How a build compiles, once ``--dist`` and the toolchain's vendor are known."""

    launcher: str | None
    jobs: int
    farm: Farm | None = None
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Asked:
    """What a build asks of its compiles: ``dist`` (``--dist``), the plan's ``vendor`` ("cuda" or
    "hip"), the ``launcher`` found, ``-j`` and whether it was given (``jobs_given``)."""

    dist: bool
    vendor: str | None
    launcher: str | None
    jobs: int
    jobs_given: bool


def choose(asked: Asked, *, find_sccache: Callable[[], str], env: Mapping[str, str] | ChildEnv) -> Choice:
    """The launcher, ``-j`` and farm of a build: ``dist`` (``--dist``) compiles CUDA through sccache on
    its farm (``-j``: the farm's CPUs unless ``jobs_given``), HIP locally with a note; a HIP build
    through an sccache configured for a farm is warned. ``find_sccache``: sccache's path, or a QolaError."""
    dist, vendor, launcher, jobs = asked.dist, asked.vendor, asked.launcher, asked.jobs
    notes: list[str] = []
    farm_ = None
    if dist and vendor == "hip":
        notes.append(HIP_LOCAL)
    elif dist:
        if launcher and not is_sccache(launcher):
            raise QolaError(
                f"--dist compiles through sccache, but the launcher is {launcher}",
                hint="drop --launcher (or [build].launcher) for a --dist build",
            )
        launcher = find_sccache()
        farm_, why = farm(launcher, env)
        if why:
            notes.append(f"--dist: {why}; sccache compiles locally")
        elif not asked.jobs_given:
            jobs = jobs_for(jobs, farm_)
    if vendor == "hip" and is_sccache(launcher):
        warning = hip_warning(launcher, env)
        notes += [warning] if warning else []
    return Choice(launcher, jobs, farm_, tuple(notes))


def jobs_for(local: int, f: Farm | None) -> int:
    """-j for a farm build: every CPU of the farm busy, never fewer than the local default, never more
    than any job count (a scheduler's report is not trusted past :data:`qola.core.rules.MAX_JOBS`)."""
    return rules.bounded_jobs(max(local, f.cpus if f else 0))


def _count(x: object) -> int:
    return x if isinstance(x, int) and x >= 0 else 0


def _total(counts: object) -> int:
    if not isinstance(counts, dict):
        return 0
    inner = counts.get("counts", counts)
    return sum(_count(v) for v in inner.values()) if isinstance(inner, dict) else 0


@dataclass(frozen=True)
class Stats:
    """sccache's counters (one server's since it started, or a difference of two snapshots)."""

    requests: int = 0
    hits: int = 0
    misses: int = 0
    remote: Mapping[str, int] = field(default_factory=dict)  # build server -> compiles it ran
    dist_errors: int = 0

    @classmethod
    def of(cls, data: Mapping[str, Any]) -> Stats:
        s = data.get("stats", {}) if isinstance(data, Mapping) else {}
        remote = s.get("dist_compiles") if isinstance(s.get("dist_compiles"), dict) else {}
        return cls(
            requests=_count(s.get("compile_requests")),
            hits=_total(s.get("cache_hits")),
            misses=_total(s.get("cache_misses")),
            remote={str(k): _count(v) for k, v in remote.items()},
            dist_errors=_count(s.get("dist_errors")),
        )

    def minus(self, before: Stats) -> Stats:
        remote = {k: v - before.remote.get(k, 0) for k, v in self.remote.items()}
        return Stats(
            self.requests - before.requests,
            self.hits - before.hits,
            self.misses - before.misses,
            {k: v for k, v in remote.items() if v > 0},
            self.dist_errors - before.dist_errors,
        )

    @property
    def remote_total(self) -> int:
        return sum(self.remote.values())

    def describe(self) -> str:
        looked = self.hits + self.misses
        rate = f" ({100.0 * self.hits / looked:.1f} %)" if looked else ""
        text = f"sccache: {self.requests} compile request(s), {self.hits} cache hit(s){rate}, {self.misses} miss(es)"
        if self.remote or self.dist_errors:
            servers = ", ".join(f"{k}: {v}" for k, v in sorted(self.remote.items()))
            text += f"; {self.remote_total} compile(s) ran on the farm" + (f" ({servers})" if servers else "")
            if self.dist_errors:
                text += f", {self.dist_errors} farm attempt(s) failed and ran locally"
        return text


def stats(sccache: str, env: Mapping[str, str] | ChildEnv) -> Stats | None:
    """sccache's counters now (None: it did not answer in JSON)."""
    try:
        return Stats.of(json.loads(_query(sccache, ["--show-stats", "--stats-format", "json"], env)))
    except (ValueError, QolaError):
        return None


@dataclass(frozen=True)
class Watch:
    """sccache's counters before a ninja run (:func:`watch`); :meth:`notes` says what it did since."""

    launcher: str
    env: Mapping[str, str] | ChildEnv
    before: Stats | None
    farm: Farm | None = None

    def notes(self) -> tuple[str, ...]:
        """One note with what sccache did since :func:`watch` (and, for a farm build, a warning-like
        note when nothing ran on the farm)."""
        after = stats(self.launcher, self.env)
        if self.before is None or after is None:
            return ("sccache: its statistics could not be read (sccache --show-stats --stats-format json)",)
        delta = after.minus(self.before)
        if self.farm is None or not delta.misses or delta.remote_total:
            return (delta.describe(),)
        return (
            delta.describe(),
            f"--dist: no compile ran on the farm at {self.farm.scheduler} (are its servers up and does "
            "sccache's [dist.auth] token match the scheduler's client_auth? its log: "
            "SCCACHE_ERROR_LOG=FILE SCCACHE_LOG=info)",
        )


def watch(
    launcher: str | None, env: Mapping[str, str] | ChildEnv, *, farm_: Farm | None = None, enabled: bool = True
) -> Watch | None:
    """Before a ninja run: sccache's counters when it is the launcher (None: it is not, or not ``enabled``)."""
    if not (enabled and is_sccache(launcher)):
        return None
    return Watch(launcher, env, stats(launcher, env), farm_)


def notes_of(watched: Watch | None) -> tuple[str, ...]:
    """After the ninja run: what sccache did (nothing when it was not watched)."""
    return () if watched is None else watched.notes()
