"""AITER's own evaluation of its module table: the oracle for qola's static resolution.

Run as ``python aiter_oracle.py TREE OUT.json HIP_VERSION`` with ``GPU_ARCHS`` set. It imports
the tree's ``aiter/jit/core.py`` (test code may; qola never does) with stand-ins for what it
imports but a build host lacks — torch (a ROCm torch's ``version.hip`` and fp8/fp4 dtypes),
``cpp_extension`` (the compiler driver, never called here) and ``torch_guard`` — and writes
``core.get_args_of_build(name)`` of every module, and the value of every property of the
objects core.py makes of its own classes (``AITER_CONFIGS.*_FILE``; in older trees, such as the
``amd-aiter`` sdist, the module-level ``AITER_CONFIG_*_FILE`` strings), as JSON.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import types
from typing import Any

TORCH_ATTRS = ("float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e4m3fn", "float8_e5m2", "float4_e2m1fn_x2")


def _stubs(hip_version: str) -> None:
    torch: Any = types.ModuleType("torch")
    torch.version = types.SimpleNamespace(hip=hip_version, cuda=None)
    for attr in TORCH_ATTRS:
        setattr(torch, attr, object())
    sys.modules["torch"] = torch

    def unavailable(*args: object, **kwargs: object) -> None:
        raise RuntimeError("the oracle resolves the table; it never compiles")

    cpp: Any = types.ModuleType("cpp_extension")
    cpp._jit_compile = cpp.get_hip_version = cpp.executable_path = unavailable
    sys.modules["cpp_extension"] = cpp
    guard: Any = types.ModuleType("torch_guard")
    guard.torch_compile_guard = lambda *a, **k: lambda fn: fn
    sys.modules["torch_guard"] = guard


def main(root: str, out: str, hip_version: str) -> None:
    _stubs(hip_version)
    sys.path.insert(0, root)  # core.py asks importlib.util.find_spec("aiter") where the meta dir is
    spec = importlib.util.spec_from_file_location("aiter_jit_core_oracle", f"{root}/aiter/jit/core.py")
    assert spec is not None and spec.loader is not None
    core = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(core)
    with open(f"{root}/aiter/jit/optCompilerConfig.json") as f:
        table = json.load(f)
    modules = {name: core.get_args_of_build(name) for name in table}
    # every AITER_CONFIGS property, used by the table or not (AITER merges a config when it is read)
    configs = {}
    for name, value in vars(core).items():  # older trees: module-level AITER_CONFIG_*_FILE, merged at import
        if name.startswith("AITER_CONFIG_") and name.endswith("_FILE") and isinstance(value, str):
            configs[name] = value
    for owner, obj in vars(core).items():
        if type(obj).__module__ == core.__name__ and not isinstance(obj, type):
            for name, attr in vars(type(obj)).items():
                if isinstance(attr, property):
                    configs[f"{owner}.{name}"] = getattr(obj, name)
    result = {"modules": modules, "configs": configs}
    with open(out, "w") as f:
        json.dump(result, f, indent=1, default=repr)


if __name__ == "__main__":
    main(*sys.argv[1:4])
