"""The runtime with the real device compilers as JIT compilers (no GPU needed: the jitted
function is host code in a .cu / HIP unit): nvcc for sm_90, hipcc for gfx90a."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.jit_lib import HIPCC, NVCC, TestLib, build_runtime, expected, make_lib


@pytest.fixture(scope="module")
def jit_runtime(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return build_runtime(tmp_path_factory.mktemp("jit-runtime-dev"))


def _first_compiles_then_cached(lib: TestLib) -> None:
    for n, x, compiles in ((1, 4, 1), (1, 9, 1), (2, 3, 2)):
        proc = lib.run(n, x)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.split()[1] == str(expected(n, x))
        assert lib.compiles() == compiles


@pytest.mark.skipif(NVCC is None, reason="needs nvcc")
def test_nvcc_as_jit_compiler(tmp_path: Path, jit_runtime: list[Path]) -> None:
    assert NVCC is not None
    lib = make_lib(tmp_path / "lib", jit_runtime, lang="cuda", real=NVCC, archs=("sm_90",))
    _first_compiles_then_cached(lib)


@pytest.mark.hip
def test_hipcc_as_jit_compiler(tmp_path: Path, jit_runtime: list[Path]) -> None:
    # hipcc needs HIP_PLATFORM=amd on this machine: in the children's environment only
    lib = make_lib(
        tmp_path / "lib",
        jit_runtime,
        lang="hip",
        real=HIPCC or "hipcc",
        archs=("gfx90a",),
        child_env={"HIP_PLATFORM": "amd"},
    )
    _first_compiles_then_cached(lib)
