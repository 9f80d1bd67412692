"""On a GPU: the torch-free cpp_itfs attention library, called through its C ABI with ctypes on
device memory, matches a torch reference."""

from __future__ import annotations

import ctypes
import math
from pathlib import Path

import pytest
from support.attn_abi import Params
from support.common import KERNELS, cmake_build, run_qola

pytestmark = [pytest.mark.gpu, pytest.mark.slow]


def test_ctypes_c_abi_matches_torch(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    m = tmp_path / "q.toml"
    m.write_text(
        '[qola]\nnamespace = "te"\n[build]\narchitectures = ["sm_90"]\n'
        '[[modules]]\nname = "libattn_fwd"\nmode = "cpp_itfs"\n'
    )
    out = tmp_path / "out"
    proc = run_qola("build", "--manifest", str(m), "--aiter-root", str(KERNELS), "-o", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lib = ctypes.CDLL(str(out / "lib" / "te_libattn_fwd.so"), mode=ctypes.RTLD_LOCAL)
    lib.te_libattn_fwd_attn_fwd.restype = ctypes.c_int
    lib.te_libattn_fwd_attn_fwd.argtypes = [ctypes.POINTER(Params)]
    lib.te_qola_version.restype = ctypes.c_char_p
    assert lib.te_qola_version().decode()
    b, sq, sk, h, d = 2, 64, 80, 4, 128
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for s in (sq, sk, sk))
    o = torch.empty_like(q)
    lse = torch.empty(b, h, sq, device="cuda", dtype=torch.float32)
    scale = 1 / math.sqrt(d)
    p = Params(
        q.data_ptr(),
        k.data_ptr(),
        v.data_ptr(),
        o.data_ptr(),
        lse.data_ptr(),
        None,
        None,
        b,
        sq,
        sk,
        h,
        h,
        d,
        scale,
        b"bf16",
        1,
        None,
    )
    assert lib.te_libattn_fwd_attn_fwd(ctypes.byref(p)) == 0
    torch.cuda.synchronize()
    s = torch.einsum("bqhd,bkhd->bhqk", q.float(), k.float()) * scale
    s = s.masked_fill(~torch.ones(sq, sk, device="cuda", dtype=torch.bool).tril(sk - sq), float("-inf"))
    ref = torch.einsum("bhqk,bkhd->bqhd", torch.softmax(s, -1), v.float())
    torch.testing.assert_close(o.float(), ref, atol=5e-2, rtol=5e-2)
    torch.testing.assert_close(lse, torch.logsumexp(s, -1), atol=1e-3, rtol=1e-3)
    p.dtype = b"fp8"  # no instance: an error status, never a crash
    assert lib.te_libattn_fwd_attn_fwd(ctypes.byref(p)) == -1


CONSUMER = r"""
#include <cmath>
#include <cstdio>
#include <vector>
#include <cuda_runtime.h>
#include "qola_attn_fwd.h"

int main() {
    const int b = 1, s = 33, h = 2, d = 64;
    const size_t n = size_t(b) * s * h * d;
    std::vector<float> q(n), k(n), v(n), o(n);
    for (size_t i = 0; i < n; ++i) { q[i] = std::sin(0.1f * i); k[i] = std::cos(0.07f * i); v[i] = std::sin(0.05f * i + 1); }
    float *dq, *dk, *dv, *dout;
    cudaMalloc(&dq, n * 4); cudaMalloc(&dk, n * 4); cudaMalloc(&dv, n * 4); cudaMalloc(&dout, n * 4);
    cudaMemcpy(dq, q.data(), n * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(dk, k.data(), n * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(dv, v.data(), n * 4, cudaMemcpyHostToDevice);
    attn_fwd_traits t{}; t.hdim = d; t.dtype = "fp32"; t.is_group_mode = false; t.has_mask = false; t.has_lse = false;
    attn_fwd_args a{}; a.q_ptr = dq; a.k_ptr = dk; a.v_ptr = dv; a.o_ptr = dout;
    a.batch = b; a.seqlen_q = s; a.seqlen_k = s; a.nhead_q = h; a.nhead_k = h; a.hdim = d; a.scale = 0.125f;
    float r = QOLA_NS(attn_fwd)(t, a, nullptr);   // the C++ API in qola::te::
    cudaDeviceSynchronize();
    cudaMemcpy(o.data(), dout, n * 4, cudaMemcpyDeviceToHost);
    double err = 0;
    for (int i = 0; i < s; ++i) for (int hh = 0; hh < h; ++hh) {
        std::vector<double> p(s); double mx = -1e30, sum = 0;
        for (int j = 0; j < s; ++j) { double acc = 0;
            for (int x = 0; x < d; ++x) acc += q[(i * h + hh) * d + x] * k[(j * h + hh) * d + x];
            p[j] = acc * 0.125; mx = std::fmax(mx, p[j]); }
        for (int j = 0; j < s; ++j) { p[j] = std::exp(p[j] - mx); sum += p[j]; }
        for (int x = 0; x < d; ++x) { double acc = 0;
            for (int j = 0; j < s; ++j) acc += p[j] / sum * v[(j * h + hh) * d + x];
            err = std::fmax(err, std::fabs(acc - o[(i * h + hh) * d + x])); }
    }
    std::printf("status %g max_err %g\n", r, err);
    return (r == 0 && err < 1e-3) ? 0 : 1;
}
"""


def test_cpp_api_from_cmake_consumer_on_gpu(tmp_path: Path) -> None:
    import shutil
    import subprocess

    if not shutil.which("cmake"):
        pytest.skip("cmake not installed")
    m = tmp_path / "q.toml"
    m.write_text(
        '[qola]\nnamespace = "te"\n[build]\narchitectures = ["sm_90"]\n'
        '[[modules]]\nname = "libattn_fwd"\nmode = "cpp_itfs"\n'
        'blob_gen_cmd = ["csrc/attn/generate.py -d fwd --filter attn_fwd_d64_fp32_batch* --output_dir {}"]\n'
    )
    out = tmp_path / "out"
    proc = run_qola("build", "--manifest", str(m), "--aiter-root", str(KERNELS), "-o", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "main.cpp").write_text(CONSUMER)
    (proj / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.18)\nproject(consumer CXX)\nset(CMAKE_CXX_STANDARD 17)\n"
        "find_package(CUDAToolkit REQUIRED)\nfind_package(qola-te REQUIRED)\n"
        "add_executable(consumer main.cpp)\n"
        "target_link_libraries(consumer PRIVATE qola::te::libattn_fwd CUDA::cudart)\n"
        f"set_target_properties(consumer PROPERTIES BUILD_RPATH {out / 'lib'})\n"
    )
    bld = tmp_path / "build"
    cmake_build(proj, bld, out)
    run = subprocess.run([str(bld / "consumer")], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.startswith("status 0 ")
