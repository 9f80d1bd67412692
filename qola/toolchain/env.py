"""What the toolchain reads from the build's environment, resolved once (:class:`ToolchainEnv`).

The toolchain's functions take this instead of the raw environment: the variables they read
(:data:`VARIABLES`, nothing else: reading another one is a bug and raises), and the environment the
compiler probes run under (:class:`qola.core.proc.ChildEnv`, opaque).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import overload

from qola.core import deadlines
from qola.core.proc import ChildEnv
from qola.toolchain.identity import COMPILER_ENV

# every variable the toolchain's search and probes read (qola.toolchain.cuda, hip, host)
VARIABLES = frozenset(
    {
        "PATH",
        "CXX",
        "MAX_JOBS",
        "CUDA_HOME",
        "CUDA_PATH",
        "CUDACXX",
        "CUDAHOSTCXX",
        "HIPCC",
        "ROCM_HOME",
        "ROCM_PATH",
        "HIP_PATH",
        "AITER_FP4x2",
        deadlines.PROBE.variable,
    }
)


@dataclass(frozen=True)
class ToolchainEnv:
    """The toolchain's view of the build's environment: :data:`VARIABLES` (those set) and the
    environment its children run under."""

    values: tuple[tuple[str, str], ...]
    child: ChildEnv

    @classmethod
    def of(cls, env: Mapping[str, str] | ToolchainEnv, child: ChildEnv | None = None) -> ToolchainEnv:
        """``env``'s view (``child``: its :class:`ChildEnv` when already built)."""
        if isinstance(env, ToolchainEnv):
            return env
        return cls(tuple(sorted((k, v) for k, v in env.items() if k in VARIABLES)), child or ChildEnv.of(env))

    @overload
    def get(self, key: str, default: str) -> str: ...
    @overload
    def get(self, key: str, default: None = None) -> str | None: ...
    def get(self, key: str, default: str | None = None) -> str | None:
        if key not in VARIABLES:
            raise KeyError(f"the toolchain reads {key}, which qola.toolchain.env.VARIABLES does not name")
        return dict(self.values).get(key, default)

    def __getitem__(self, key: str) -> str:
        value = self.get(key)
        if value is None:
            raise KeyError(key)
        return value

    def with_child(self, extra: Mapping[str, str]) -> ToolchainEnv:
        """The same variables; the children run with ``extra`` set over their environment."""
        return ToolchainEnv(self.values, self.child.plus(extra))

    def compiler_env(self) -> dict[str, str]:
        """The variables of :data:`qola.toolchain.identity.COMPILER_ENV` the children run with."""
        return {k: v for k, v in self.child.items if k in COMPILER_ENV}

    def probe_timeout(self) -> float | None:
        """``QOLA_PROBE_TIMEOUT`` (:mod:`qola.core.deadlines`), checked when a probe first needs it."""
        var = deadlines.PROBE.variable
        return deadlines.timeout(deadlines.PROBE, {var: self.get(var) or ""})
