"""A module with torch_exclude = false is built as a torch extension and runs on torch tensors."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from support.common import KERNELS, run_qola

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

SRC = r"""
#include <torch/extension.h>

__global__ void axpy_kernel(float a, const float* x, float* y, int64_t n) {
    int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}

torch::Tensor axpy(double a, torch::Tensor x, torch::Tensor y) {
    TORCH_CHECK(x.is_cuda() && y.is_cuda() && x.scalar_type() == torch::kFloat32, "float32 CUDA tensors");
    auto out = y.clone();
    int64_t n = x.numel();
    axpy_kernel<<<(n + 255) / 256, 256>>>(float(a), x.data_ptr<float>(), out.data_ptr<float>(), n);
    return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("axpy", &axpy); }
"""


def test_torch_extension_module(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    src = tmp_path / "axpy.cu"
    src.write_text(SRC)
    m = tmp_path / "q.toml"
    m.write_text(
        f'[qola]\nnamespace = "tx"\n[build]\narchitectures = ["sm_90"]\n'
        f'[[modules]]\nname = "module_axpy"\nsrcs = ["{src}"]\ntorch_exclude = false\n'
        f"is_python_module = true\n"
    )
    out = tmp_path / "out"
    proc = run_qola("build", "--manifest", str(m), "--aiter-root", str(KERNELS), "-o", str(out))
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    path = out / "lib" / "tx_module_axpy.so"
    spec = importlib.util.spec_from_file_location("tx_module_axpy", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    x = torch.randn(10000, device="cuda")
    y = torch.randn(10000, device="cuda")
    torch.testing.assert_close(mod.axpy(2.5, x, y), 2.5 * x + y)
