"""Whether a CUDA unit holds device code, read from what it and its headers hold (issue 50 item 2):
the example's pybind11 entry sources hold none (their header's device helpers are inline functions
under ``__CUDACC__``, its kernel macro only defined), its kernel sources do."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.common import KERNELS

from qola.compile.devicescan import DeviceScan
from qola.toolchain import cuda

CSRC = KERNELS / "csrc"
FLAGS = [f"-I{CSRC / 'include'}", f"-I{CSRC / 'attn'}"]


@pytest.mark.parametrize("unit", ["rmsnorm_pybind.cu", "softmax_pybind.cu", "attn_fwd_pybind.cu"])
def test_the_examples_entry_sources_hold_no_device_code(unit: str) -> None:
    assert DeviceScan().device_code(str(CSRC / "pybind" / unit), FLAGS) is None


def test_the_examples_kernel_sources_hold_device_code() -> None:
    scan = DeviceScan()
    for unit in ("rmsnorm.cu", "softmax.cu"):
        why = scan.device_code(str(CSRC / "kernels" / unit), FLAGS)
        assert why == f"{unit} holds QK_GLOBAL (a macro that spells device code)", why


def _why(tmp: Path, text: str, header: str = "", flags: tuple[str, ...] = ()) -> str | None:
    (tmp / "h.h").write_text(header)
    (tmp / "u.cu").write_text('#include "h.h"\n' + text)
    return DeviceScan().device_code(str(tmp / "u.cu"), [f"-I{tmp}", *flags])


def test_what_counts_as_device_code(tmp_path: Path) -> None:
    assert _why(tmp_path, "int f() { return 1; }\n") is None
    assert _why(tmp_path, '// __global__ void k();  k<<<1, 1>>>();\nconst char* s = "__shared__";\n') is None
    assert _why(tmp_path, "__device__ __forceinline__ float sq(float x) { return x * x; }\n") is None
    assert _why(tmp_path, "#define DEV __device__\nDEV inline int two() { return 2; }\n") is None
    assert _why(tmp_path, "#define KERNEL __global__\n") is None  # defined, never used
    assert _why(tmp_path, "__device__ int counter;\n") == "u.cu holds __device__"  # a device variable
    assert _why(tmp_path, "__constant__ float table[4];\n") == "u.cu holds __constant__"
    assert _why(tmp_path, "void go() { k<<<1, 1>>>(); }\n") == "u.cu holds <<<"
    # in a header, through two macros, under any #if
    header = "#define G __global__\n#define KERN G\n#ifdef __CUDACC__\nKERN void k(float*) {}\n#endif\n"
    assert _why(tmp_path, "int f();\n", header) == "h.h holds KERN (a macro that spells device code)"
    # a function-like macro spelling __device__: its use cannot be read as a function or a variable
    assert _why(tmp_path, "#define DEVVAR(n) __device__ int n\nDEVVAR(x);\n") is not None


def test_what_it_cannot_read_holds_device_code(tmp_path: Path) -> None:
    assert "named by a macro" in (_why(tmp_path, "#define H <h.h>\n#include H\n") or "")
    assert "relocatable device code" in (_why(tmp_path, "int f();\n", flags=("-rdc=true",)) or "")


def test_the_cuda_host_only_spelling_goes_to_the_host_compiler() -> None:
    """``-x c++`` (no cudafe++, no cicc, no ptxas), cuda_runtime.h first as nvcc includes it for a .cu,
    and what would declare a kernel or device data marked in the object."""
    assert cuda.HOST_ONLY[:4] == ("-x", "c++", "-include", "cuda_runtime.h")
    assert cuda.DEVICE_PASSES == ("-x", "cu")
    assert any(f.startswith("-D__global__=") and ".qola_cuda_global" in f for f in cuda.HOST_ONLY)
