"""Host side: finding programs, running them, the host C++ compiler, job count."""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from qola.core import deadlines, proc, rules, settings
from qola.core.errors import QolaError
from qola.toolchain.env import ToolchainEnv

Env = Mapping[str, str] | ToolchainEnv  # a test's mapping, or the build's resolved view

HOST_CXX_NAMES = ("c++", "g++", "clang++")
GB_PER_JOB = 0.5


def which(name: str, env: Env) -> str | None:
    """``name`` on the PATH of ``env`` (not of this process), as an absolute path."""
    found = shutil.which(name, path=ToolchainEnv.of(env).get("PATH", ""))
    return os.path.abspath(found) if found else None


def executable(path: str | os.PathLike[str] | None) -> str | None:
    """``path`` as an absolute path if it is an executable file, else None."""
    if not path:
        return None
    path = os.path.abspath(os.path.expanduser(str(path)))
    return path if os.path.isfile(path) and os.access(path, os.X_OK) else None


def first_executable(candidates: Iterable[str | None]) -> str | None:
    for candidate in candidates:
        found = executable(candidate)
        if found:
            return found
    return None


def run_capture(argv: Sequence[str], env: Env, timeout: float | None = None) -> proc.CompletedProcess[Any]:
    """Run ``argv`` with stdout and stderr captured together as text; never raises for a non-zero
    exit (the caller decides); FailedProcessError if it cannot start or hangs (:func:`qola.core.proc.run_checked`).
    ``timeout``: by default ``QOLA_PROBE_TIMEOUT`` in ``env`` (:mod:`qola.core.deadlines`)."""
    tenv = ToolchainEnv.of(env)
    return proc.run_checked(argv, env=tenv.child, timeout=probe_timeout(tenv, timeout), any_exit=True, hint=_hint(argv))


def run_checked(argv: Sequence[str], env: Env, timeout: float | None = None) -> str:
    """The output of ``argv``; FailedProcessError unless it starts, answers in time and exits 0."""
    tenv = ToolchainEnv.of(env)
    return proc.run_checked(argv, env=tenv.child, timeout=probe_timeout(tenv, timeout), hint=_hint(argv)).stdout or ""


def probe_timeout(env: Env, given: float | None = None) -> float | None:
    """How long a toolchain probe may run: ``given``, else ``QOLA_PROBE_TIMEOUT`` (default 120 s)."""
    return given if given is not None else ToolchainEnv.of(env).probe_timeout()


def _hint(argv: Sequence[str]) -> str:
    return (
        f"{os.path.basename(str(argv[0]))} is part of the toolchain qola probes; if it hangs or fails, fix or "
        f"replace it (a slow one: raise {deadlines.PROBE.variable})"
    )


def identity_of(compiler: str, version_output: str) -> str:
    return hashlib.sha256(f"{compiler}\n{version_output}".encode()).hexdigest()


def find_host_cxx(env: Env) -> str:
    """The host C++ compiler: ``$CXX`` when it names one program, else c++/g++/clang++."""
    env = ToolchainEnv.of(env)
    cxx = (env.get("CXX") or "").strip()
    if cxx:
        found = executable(cxx) or which(cxx, env)
        if not found:
            raise QolaError(
                f"CXX={cxx!r} is not an executable program",
                hint="set CXX to the path of one C++ compiler (a launcher such as ccache "
                "goes in the manifest or --launcher), or unset it",
            )
        return found
    found = first_executable(which(n, env) for n in HOST_CXX_NAMES) or first_executable(
        ["/usr/bin/c++", "/usr/bin/g++"]
    )
    if not found:
        raise QolaError(
            "no host C++ compiler found (looked for $CXX, c++, g++, clang++)",
            hint="install one: apt-get install g++ (Debian/Ubuntu) or dnf install gcc-c++",
        )
    return found


def _available_gb(meminfo: Path = Path("/proc/meminfo")) -> float | None:
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / (1024 * 1024)
    except (OSError, ValueError, IndexError):
        return None
    return None


def _cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def default_jobs(env: Env, cpus: int | None = None, free_gb: float | None = None) -> int:
    """Parallel compile jobs: ``MAX_JOBS`` when set, else AITER's rule
    ``max(1, min(int(0.8 * cpus), int(free_GB / 0.5)))``, with every CPU of a 2-CPU machine
    (AITER's 0.8 leaves one of two idle: a build twice as long)."""
    raw = ToolchainEnv.of(env).get("MAX_JOBS")
    given = None if raw is None else settings.JOBS.check(raw, "MAX_JOBS")  # -j's one check (qola.core.settings)
    if given is not None:
        return given
    cpus = cpus if cpus is not None else _cpu_count()
    by_cpu = max(int(0.8 * cpus), min(cpus, 2))
    if free_gb is None:
        free_gb = _available_gb()
    by_mem = int(free_gb / GB_PER_JOB) if free_gb is not None else by_cpu
    return rules.bounded_jobs(min(by_cpu, by_mem))
