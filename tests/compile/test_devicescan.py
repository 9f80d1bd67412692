"""Whether a CUDA unit holds device code, read from what it and its headers hold (issue 50 item 2):
an entry source that declares host functions holds none; a kernel source does; and a unit whose tree
headers test ``__CUDACC__`` keeps its device passes: the host compiler does not define it, so what the
conditional keeps or drops would change without a word. The example's entry sources read only
``qk_types.h`` (no such conditional; its kernels read ``qk_compat.h``): they hold none."""

from __future__ import annotations

import shutil
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


def test_a_tree_header_testing_cudacc_keeps_the_device_passes_of_the_entry_that_reads_it(tmp_path: Path) -> None:
    """The example's entry with its header reading qk_compat.h (the kernels' header, whose device helpers
    are under ``#if defined(__CUDACC__)``) instead of qk_types.h."""
    inc = tmp_path / "include"
    shutil.copytree(CSRC / "include", inc)
    (inc / "softmax.h").write_text((inc / "softmax.h").read_text().replace("qk_types.h", "qk_compat.h"))
    why = DeviceScan().device_code(str(CSRC / "pybind" / "softmax_pybind.cu"), [f"-I{inc}"])
    assert why == "qk_compat.h tests __CUDACC__, which a host-only compile would not define", why


def test_a_conditional_on_what_nvcc_defines_keeps_the_device_passes(tmp_path: Path) -> None:
    assert _why(tmp_path, "int f();\n", "#ifdef __CUDACC__\nint g();\n#endif\n") is not None
    assert _why(tmp_path, "#if defined(__CUDA_ARCH__) && 1\n#endif\nint f();\n") is not None
    assert _why(tmp_path, "#define X __CUDACC__\nint f();\n") is None  # a definition tests nothing
    assert _why(tmp_path, "#if defined(MY_FLAG)\nint f();\n#endif\n") is None


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
    header = "#define G __global__\n#define KERN G\n#ifdef WITH_KERNELS\nKERN void k(float*) {}\n#endif\n"
    assert _why(tmp_path, "int f();\n", header) == "h.h holds KERN (a macro that spells device code)"
    # a function-like macro spelling __device__: its use cannot be read as a function or a variable
    assert _why(tmp_path, "#define DEVVAR(n) __device__ int n\nDEVVAR(x);\n") is not None


def test_what_it_cannot_read_holds_device_code(tmp_path: Path) -> None:
    assert "named by a macro" in (_why(tmp_path, "#define H <h.h>\n#include H\n") or "")
    assert "relocatable device code" in (_why(tmp_path, "int f();\n", flags=("-rdc=true",)) or "")


def test_the_cuda_host_only_spelling_goes_to_the_host_compiler() -> None:
    """``-x c++`` (no cudafe++, no cicc, no ptxas), cuda_runtime.h first as nvcc includes it for a .cu,
    and what would declare a kernel or device data marked in the object."""
    passes = cuda.host_only("/opt/cuda/targets/x86_64-linux/include")
    assert passes[:4] == ("-x", "c++", "-include", "/opt/cuda/targets/x86_64-linux/include/cuda_runtime.h")
    assert cuda.DEVICE_PASSES == ("-x", "cu")
    assert any(f.startswith("-D__global__=") and ".qola_cuda_global" in f for f in passes)
