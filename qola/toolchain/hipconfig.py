"""A ``hipconfig`` AITER's generators can parse.

AITER reads the HIP version from ``hipconfig --version`` (``shutil.which("hipconfig")`` in
``aiter/jit/utils/cpp_extension.py``) and parses it as ``parse(out.split()[-1].rstrip("-")
.replace("-", "+"))`` or by ``int()`` of its dotted parts: it needs the bare form ROCm's hipconfig
prints, ``6.4.43484-9999`` with no newline. Some layouts (Debian's, where ``hipconfig`` may be
``hipcc``) print ``HIP version: 6.4.43484-9999`` instead, and the generator dies.

:func:`generator_env` checks what the generators' PATH gives; when it is absent or not bare, it
writes a shim into ``tools_dir`` that prints the HIP version the toolchain probed (so AITER computes
what it would with a working hipconfig) and hands every other argument to the real one, and puts
that dir first on the generators' PATH only — never the compilers'.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path

from qola.core import deadlines, proc
from qola.core.fsutil import write_if_changed
from qola.toolchain.base import Toolchain
from qola.toolchain.env import ToolchainEnv
from qola.toolchain.versions import parse_hip_version

NAME = "hipconfig"
_BARE = re.compile(r"\A[0-9]+\.[0-9]+\.[0-9]+(?:-[0-9A-Za-z.]*)?\Z")


def parses(output: str) -> bool:
    """Whether AITER's parses accept ``output`` (one bare ``X.Y.Z[-suffix]`` token)."""
    return bool(_BARE.match(output.strip())) and len(output.split()) == 1


def probed_version(tc: Toolchain) -> str | None:
    """``6.4.43484-9999``: the toolchain's probed HIP version with its suffix, as hipconfig prints it."""
    found = parse_hip_version(tc.version_output)
    return found[0] + found[1] if found else None


def shim_text(version: str, real: str | None) -> str:
    fallback = (
        f'exec {shlex.quote(real)} "$@"'
        if real
        else f'echo "qola\'s {NAME} shim answers --version only (no {NAME} on PATH)" >&2; exit 1'
    )
    return (
        "#!/bin/sh\n"
        "# Written by qola for AITER's generators: the bare version its parse needs, from the toolchain's\n"
        "# probe; any other argument goes to the real hipconfig.\n"
        f"case \"$1\" in --version|-v) printf '%s' {shlex.quote(version)}; exit 0 ;; esac\n"
        f"{fallback}\n"
    )


def _version_output(path: str, env: Mapping[str, str] | proc.ChildEnv, timeout: float | None) -> str | None:
    try:
        done = proc.run([path, "--version"], env=env, timeout=timeout, out=proc.SEPARATE)
    except (OSError, proc.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def _shim_path(
    tc: Toolchain, path: str | None, version_of: Callable[[str], str | None], tools_dir: Path
) -> tuple[str | None, str | None]:
    """(the PATH the generators run with, None: ``path`` as it is; a one-line note or None)."""
    version = probed_version(tc) if tc.kind == "hip" else None
    if version is None:
        return None, None
    real = shutil.which(NAME, path=path if path is not None else os.defpath)
    # AITER runs os.path.realpath(shutil.which("hipconfig")) (cpp_extension.executable_path): on Debian
    # that is hipcc itself, which prints "HIP version: ..." although /usr/bin/hipconfig answers bare
    out = version_of(os.path.realpath(real)) if real else None
    if out is not None and parses(out):
        return None, None
    shim = tools_dir / NAME
    text = shim_text(version, real)
    write_if_changed(shim, text, mode=0o755)
    said = (
        "is not on PATH"
        if real is None
        else ("failed" if out is None else f"prints {(out.strip().splitlines() or [''])[0][:60]!r}")
    )
    note = (
        f"{real or NAME} {said}, which AITER's generators cannot parse; they run with {shim} "
        f"(--version: {version}, the probed HIP version)"
    )
    return f"{tools_dir}{os.pathsep}{path if path is not None else os.defpath}", note


def generator_env(tc: Toolchain, env: Mapping[str, str], tools_dir: Path) -> tuple[dict[str, str], str | None]:
    """(the generators' environment, a one-line note or None). Unchanged for CUDA, when the
    hipconfig on ``env``'s PATH already prints a bare version, or when the probe gave no version."""
    path, note = _shim_path(
        tc, env.get("PATH"), lambda real: _version_output(real, env, deadlines.timeout(deadlines.PROBE, env)), tools_dir
    )
    return (dict(env) if path is None else {**env, "PATH": path}), note


def generator_child(
    tc: Toolchain, env: ToolchainEnv, given: Mapping[str, str], tools_dir: Path
) -> tuple[proc.ChildEnv, str | None]:
    """:func:`generator_env` from the toolchain's view: the environment the generators run under
    (its children's, with ``given`` set over it), PATH read from the view."""
    child = env.child.plus(given)
    path = given.get("PATH", env.get("PATH"))
    shim, note = _shim_path(tc, path, lambda real: _version_output(real, child, env.probe_timeout()), tools_dir)
    return (child if shim is None else child.plus({"PATH": shim})), note
