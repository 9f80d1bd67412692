"""Compiler probes, cached per compiler identity.

Which optional flags a compiler accepts, and a few facts read from it (the GPU
codes nvcc knows, the toolkit root), only change when the compiler changes. They
are probed once per identity, in parallel on a cold cache, and stored in
``<cache_dir>/probes-<identity[:16]>.json`` (by :func:`qola.core.fsutil.atomic_write`, so readers
never see half a file).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from qola.core import inputs
from qola.core.fsutil import atomic_write
from qola.toolchain.env import ToolchainEnv
from qola.toolchain.host import run_capture

FORMAT = 1
MAX_PARALLEL = 8


def probe_key(identity: str, env: Mapping[str, str] | ToolchainEnv) -> str:
    """What a probe's answer depends on: the compiler's identity and the variables that change what
    it compiles (:data:`qola.toolchain.identity.COMPILER_ENV`, as its children get them).
    ``HIP_DEVICE_LIB_PATH`` decides whether hipcc can compile for a GPU at all under a ``ROCM_PATH``
    that is not its own (ck-jit's fake ROCm): an answer probed without it is not one for with it."""
    return hashlib.sha256(json.dumps([identity, ToolchainEnv.of(env).compiler_env()]).encode()).hexdigest()


def probe_path(cache_dir: str | os.PathLike[str], identity: str, env: Mapping[str, str] | ToolchainEnv) -> Path:
    return Path(cache_dir) / f"probes-{probe_key(identity, env)[:16]}.json"


class Probes:
    """Cached probe results for one compiler identity."""

    def __init__(self, cache_dir: str | os.PathLike[str], identity: str, env: Mapping[str, str] | ToolchainEnv):
        self.env = ToolchainEnv.of(env)
        self.path = probe_path(cache_dir, identity, self.env)
        self.identity = probe_key(identity, self.env)
        self.flags: dict[str, bool] = {}
        self.facts: dict[str, Any] = {}
        self.ran = 0  # child processes started by this object (for tests and logs)
        self._dirty = False
        self._load()

    def _load(self) -> None:
        try:
            data = json.loads(inputs.read_record(self.path))
        except (OSError, ValueError):
            return
        if not isinstance(data, dict) or data.get("format") != FORMAT or data.get("identity") != self.identity:
            return
        flags, facts = data.get("flags"), data.get("facts")
        if isinstance(flags, dict):
            self.flags = {str(k): bool(v) for k, v in flags.items()}
        if isinstance(facts, dict):
            self.facts = dict(facts)

    def supported(self, flags: Sequence[str], argv_for: Callable[[str], list[str]]) -> dict[str, bool]:
        """Whether the compiler accepts each flag: ``argv_for(flag)`` must exit 0.
        Unknown flags are probed in parallel; known ones come from the cache."""
        missing = [f for f in dict.fromkeys(flags) if f not in self.flags]
        if missing:
            workers = max(1, min(MAX_PARALLEL, len(missing)))
            with ThreadPoolExecutor(max_workers=workers) as pool:
                codes = list(pool.map(lambda f: run_capture(argv_for(f), self.env).returncode, missing))
            self.ran += len(missing)
            self.flags.update({f: code == 0 for f, code in zip(missing, codes)})
            self._dirty = True
        return {f: self.flags[f] for f in flags}

    def fact(self, key: str, compute: Callable[[], Any]) -> Any:
        """A JSON-able value derived from the compiler, computed once per identity."""
        if key not in self.facts:
            self.facts[key] = compute()
            self.ran += 1
            self._dirty = True
        return self.facts[key]

    def save(self) -> None:
        """Write the cache atomically if anything new was probed."""
        if not self._dirty:
            return
        data = {"format": FORMAT, "identity": self.identity, "flags": self.flags, "facts": self.facts}
        atomic_write(self.path, (json.dumps(data, indent=1, sort_keys=True) + "\n").encode())
        self._dirty = False
