"""``qola doctor``: what this machine has for a build — compilers, tools and the JIT cache dir,
found the way a build finds them (same environment variables, same search order). The host C++
compiler must compile and link a one-line program (an empty PATH leaves it without its assembler
and linker); a tool that is found but fails or hangs (each probe ends at ``QOLA_PROBE_TIMEOUT``)
is reported broken, and doctor then exits 1."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from qola.commands.common import add_debug
from qola.compile.ninja import ninja_binary
from qola.compile.pyext import python_headers
from qola.core import deadlines, proc
from qola.core.errors import FailedProcessError, QolaError
from qola.core.fsutil import atomic_write
from qola.jit.cache import check_private_dir
from qola.jit.format import default_cache_dir
from qola.toolchain import cuda, hip
from qola.toolchain.host import find_host_cxx
from qola.toolchain.host import probe_timeout as limit


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    required: bool  # a build cannot run without it (else: some features need it)
    broken: bool = False  # found, but it failed or hung when run


def probe_timeout(env: Mapping[str, str]) -> float | None:

    return limit(env)


def _ninja(env: Mapping[str, str]) -> str:

    exe = ninja_binary()
    return f"{exe} ({proc.run_checked([exe, '--version'], env=env, timeout=probe_timeout(env)).stdout.strip()})"


def _host_cxx(env: Mapping[str, str]) -> str:
    """The host C++ compiler, once it compiled and linked a one-line program with ``env``."""

    cxx = find_host_cxx(env)
    with tempfile.TemporaryDirectory(prefix="qola-doctor-") as tmp:
        src = os.path.join(tmp, "t.cpp")
        atomic_write(src, b"int main() { return 0; }\n")
        proc.run_checked(
            [cxx, src, "-o", os.path.join(tmp, "t")],
            env=env,
            cwd=tmp,
            timeout=probe_timeout(env),
            hint="it cannot build a program with this environment (an empty or short PATH leaves a "
            "compiler driver without its assembler and linker)",
        )
    return f"{cxx} (compiles and links)"


def _hip(env: Mapping[str, str]) -> str:

    path, why = hip.locate_why(env)
    version = hip.read_version(path, hip.rocm_root(path, env), {**env, **hip.CHILD_ENV})[1]
    return f"{path} (HIP {version}; found by {why})"


def _cuda(env: Mapping[str, str]) -> str:

    path = cuda.locate(env)
    return f"{path} (CUDA {cuda.read_version(path, env)[1]})"


def _python_headers(env: Mapping[str, str]) -> str:

    return f"{python_headers()} (Python.h, for pybind modules)"


def _tool(name: str, why: str) -> Callable[[Mapping[str, str]], str]:
    def find(env: Mapping[str, str]) -> str:
        found = shutil.which(name, path=env.get("PATH", os.defpath))
        if not found:
            raise QolaError(f"{name} not found on PATH ({why})")
        return found

    return find


def _jit_cache(env: Mapping[str, str]) -> str:

    path = default_cache_dir(env)
    if not path.exists():
        return f"{path} (created on first use)"
    check_private_dir(path)
    return str(path)


# (name, probe, required); a GPU compiler is required as "HIP or CUDA" (see run)
CHECKS = (
    ("ninja", _ninja, True),
    ("host C++", _host_cxx, True),
    ("HIP compiler", _hip, False),
    ("CUDA compiler", _cuda, False),
    ("Python headers", _python_headers, False),
    ("ld", _tool("ld", "static archives"), False),
    ("objcopy", _tool("objcopy", "static archives"), False),
    ("ar", _tool("ar", "static archives"), False),
    ("c++filt", _tool("c++filt", "readable names in the export audit"), False),
    ("tar", _tool("tar", "the JIT runtime unpacks header bundles with it"), False),
    ("JIT cache", _jit_cache, False),
)
GPU = ("HIP compiler", "CUDA compiler")


def checks(env: Mapping[str, str]) -> list[Check]:
    found = []
    for name, probe, required in CHECKS:
        try:
            found.append(Check(name, True, probe(env), required))
        except (QolaError, OSError) as exc:
            detail = exc.render().replace("error: ", "", 1) if isinstance(exc, QolaError) else str(exc)
            found.append(
                Check(name, False, detail.replace("\n", "\n    "), required, broken=isinstance(exc, FailedProcessError))
            )
    return found


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "doctor",
        help="check the compilers and tools a build needs",
        description="Find the compilers and tools the way `qola build` does and report them.",
    )
    add_debug(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> int:
    """Exit 0 when a build can run (ninja, a host C++ compiler that builds a program and a HIP or
    CUDA compiler) and no tool found is broken, else 1."""
    env = dict(os.environ) if env is None else env

    deadlines.seconds(deadlines.PROBE, env)  # a bad QOLA_PROBE_TIMEOUT: exit 2 before any probe
    results = checks(env)
    print(f"qola doctor (Python {sys.version.split()[0]} at {sys.executable})")
    if not env.get("PATH", "").strip(os.pathsep):
        print(f"  note: PATH is {'empty' if 'PATH' in env else 'unset'}: compilers find no assembler or linker")
    for c in results:
        print(f"  {'ok' if c.ok else 'broken' if c.broken else 'missing':8} {c.name:14} {c.detail}")
    missing = [c.name for c in results if c.required and not c.ok and not c.broken]
    broken = [c.name for c in results if c.broken]
    if not any(c.ok for c in results if c.name in GPU):
        missing.append("a HIP or CUDA compiler")
    problems = [f"{', '.join(names)} {what}" for names, what in ((missing, "missing"), (broken, "broken")) if names]
    if problems:
        print(f"cannot build: {'; '.join(problems)}", file=sys.stderr)
        return 1
    return 0
