"""Device toolchains: find the compiler for a set of GPU architectures.

``find_toolchain`` validates the architectures (one vendor), finds hipcc or nvcc,
checks its version against the manifest, probes optional flags once per compiler
identity (cached under ``cache_dir``) and returns a :class:`Toolchain` that builds
compile and link argv. Configuration comes in as arguments; nothing here reads or
changes ``os.environ`` or does work at import time.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from qola.toolchain.archs import arch_base, validate_archs, vendor_of
    from qola.toolchain.base import Toolchain, ToolchainChoice
    from qola.toolchain.env import ToolchainEnv
    from qola.toolchain.host import default_jobs, find_host_cxx

# re-exported names -> their module, imported on first use (``qola.toolchain.identity`` stays cheap
# for the no-op fast path)
_LAZY = {
    "arch_base": "archs",
    "validate_archs": "archs",
    "vendor_of": "archs",
    "Toolchain": "base",
    "ToolchainChoice": "base",
    "default_jobs": "host",
    "find_host_cxx": "host",
}

__all__ = [
    "Toolchain",
    "ToolchainChoice",
    "arch_base",
    "default_jobs",
    "find_host_cxx",
    "find_toolchain",
    "validate_archs",
    "vendor_of",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f"qola.toolchain.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'qola.toolchain' has no attribute {name!r}")


def find_toolchain(
    archs: Sequence[str],
    *,
    env: Mapping[str, str] | ToolchainEnv,
    accepted_versions: Sequence[str] | None,
    cache_dir: str | os.PathLike[str],
    choice: ToolchainChoice | None = None,
) -> Toolchain:
    """The toolchain for ``archs`` (all gfx* -> HIP, all sm_* -> CUDA).

    ``env`` is the environment to search (PATH, HIPCC, ROCM_PATH, CUDA_HOME, ...)
    and to run the compiler under; ``accepted_versions`` are prefixes from the
    manifest (``["7.2"]`` accepts 7.2.*; None accepts any); ``choice``: the compiler, the
    planning version and the HIP flags left out (:class:`~qola.toolchain.base.ToolchainChoice`).
    Raises QolaError with a hint for every user-fixable problem.
    """
    from qola.toolchain.archs import validate_archs  # lazy: paid only by the callers that need it
    from qola.toolchain.base import ToolchainChoice  # lazy: paid only by the callers that need it
    from qola.toolchain.env import ToolchainEnv  # lazy: paid only by the callers that need it

    choice = choice or ToolchainChoice()
    kind, archs = validate_archs(archs)
    env = ToolchainEnv.of(env)  # resolved once: the variables the search reads, the probes' environment
    if kind == "hip":
        from qola.toolchain.hip import find_hip  # lazy: paid only by the callers that need it

        return find_hip(archs, env=env, accepted_versions=accepted_versions, cache_dir=cache_dir, choice=choice)
    from qola.toolchain.cuda import find_cuda  # lazy: paid only by the callers that need it

    return find_cuda(archs, env=env, accepted_versions=accepted_versions, cache_dir=cache_dir, compiler=choice.compiler)
