"""On a GPU: the example tree's pybind modules (examples/kernels), built with nvcc directly (not by
qola: the kernels themselves are checked), run on torch tensors and match a torch reference. Moved
from tests/plan/test_example_tree.py, which keeps the host-side checks of the tree."""

from __future__ import annotations

import importlib.util
import itertools
import os
import shutil
import subprocess
import sys
import sysconfig
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from support.common import KERNELS

CSRC = KERNELS / "csrc"


def _torch_cuda() -> Any:
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


@pytest.fixture(scope="module")
def built_modules(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, dict[str, ModuleType]]:
    torch = _torch_cuda()
    if torch is None or shutil.which("nvcc") is None:
        pytest.skip("needs torch with CUDA and nvcc")
    import pybind11

    major, minor = torch.cuda.get_device_capability()
    root = tmp_path_factory.mktemp("example_tree")
    gen_dir = root / "gen"
    generate = [sys.executable, str(CSRC / "attn" / "generate.py"), "-d", "fwd", "--receipt", "0"]
    r = subprocess.run([*generate, "--output_dir", str(gen_dir)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    includes = [
        f"-I{CSRC / 'include'}",
        f"-I{CSRC / 'attn'}",
        f"-I{pybind11.get_include()}",
        f"-I{sysconfig.get_paths()['include']}",
    ]
    base = ["nvcc", "-std=c++17", f"-arch=sm_{major}{minor}", "-O2", "-Xcompiler", "-fPIC", *includes]
    modules = {
        "module_rmsnorm": [CSRC / "kernels" / "rmsnorm.cu", CSRC / "pybind" / "rmsnorm_pybind.cu"],
        "module_softmax": [CSRC / "kernels" / "softmax.cu", CSRC / "pybind" / "softmax_pybind.cu"],
        "module_attn_fwd": [CSRC / "pybind" / "attn_fwd_pybind.cu", *sorted(gen_dir.glob("*.cu"))],
    }
    extra = {"module_rmsnorm": ['-DQK_RMSNORM_TUNED_CSV="/x/rmsnorm_tuned.csv"']}

    def compile_one(job: tuple[str, Path]) -> tuple[str, Path]:
        name, src = job
        obj = root / name / (src.stem + ".o")
        obj.parent.mkdir(exist_ok=True)
        cmd = [*base, f"-DTORCH_EXTENSION_NAME={name}", *extra.get(name, []), "-c", str(src), "-o", str(obj)]
        p = subprocess.run(cmd, capture_output=True, text=True)
        assert p.returncode == 0, " ".join(cmd) + "\n" + p.stdout + p.stderr
        return name, obj

    jobs = [(name, src) for name, srcs in modules.items() for src in srcs]
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        objs = list(pool.map(compile_one, jobs))
    loaded = {}
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    for name in modules:
        so = root / f"{name}{suffix}"
        cmd = ["nvcc", "-shared", "-o", str(so), *[str(o) for n, o in objs if n == name]]
        p = subprocess.run(cmd, capture_output=True, text=True)
        assert p.returncode == 0, p.stdout + p.stderr
        spec = importlib.util.spec_from_file_location(name, so)
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        loaded[name] = mod
    return torch, loaded


TOL = {"fp32": 2e-5, "fp16": 2e-3, "bf16": 2e-2}
TORCH_DTYPES = ("fp32", "fp16", "bf16")


def _dt(torch: Any, name: str) -> Any:
    return {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[name]


@pytest.mark.gpu
@pytest.mark.slow
def test_rmsnorm_and_softmax_on_gpu(built_modules: tuple[Any, dict[str, ModuleType]]) -> None:
    torch, mods = built_modules
    assert mods["module_rmsnorm"].tuned_config() == "/x/rmsnorm_tuned.csv"
    for dtype in TORCH_DTYPES:
        for rows, cols in ((7, 4096), (3, 1000), (1, 1)):
            x = torch.randn(rows, cols, device="cuda", dtype=_dt(torch, dtype))
            w = torch.randn(cols, device="cuda", dtype=_dt(torch, dtype))
            out = torch.empty_like(x)
            mods["module_rmsnorm"].rmsnorm(
                out.data_ptr(),
                x.data_ptr(),
                w.data_ptr(),
                rows,
                cols,
                1e-6,
                dtype,
                128,
                torch.cuda.current_stream().cuda_stream,
            )
            xf = x.float()
            ref = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()
            torch.testing.assert_close(out.float(), ref, atol=TOL[dtype] * 10, rtol=TOL[dtype])
            mods["module_softmax"].softmax(out.data_ptr(), x.data_ptr(), rows, cols, 0.5, dtype)
            torch.cuda.synchronize()
            torch.testing.assert_close(out.float(), torch.softmax(xf * 0.5, -1), atol=TOL[dtype], rtol=TOL[dtype])
    with pytest.raises(RuntimeError, match="dtype=fp8"):
        mods["module_softmax"].softmax(out.data_ptr(), x.data_ptr(), 1, 1, 1.0, "fp8")


def _ref_attn(torch: Any, q: Any, k: Any, v: Any, scale: float, causal: bool) -> tuple[Any, Any]:
    """q [sq, hq, d], k/v [sk, hk, d] -> out [sq, hq, d] fp32, lse [hq, sq]."""
    hq, hk = q.shape[1], k.shape[1]
    k = k.float().repeat_interleave(hq // hk, dim=1)
    v = v.float().repeat_interleave(hq // hk, dim=1)
    s = torch.einsum("qhd,khd->hqk", q.float(), k) * scale
    sq, sk = q.shape[0], k.shape[0]
    if causal:
        i = torch.arange(sq, device=q.device)[:, None]
        j = torch.arange(sk, device=q.device)[None, :]
        s = s.masked_fill(j > i + (sk - sq), float("-inf"))
    lse = torch.logsumexp(s, -1)
    p = torch.softmax(s, -1).nan_to_num(0.0)
    return torch.einsum("hqk,khd->qhd", p, v), lse


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.parametrize("dtype", TORCH_DTYPES)
@pytest.mark.parametrize("hdim", [64, 96, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_attn_fwd_batch_on_gpu(
    built_modules: tuple[Any, dict[str, ModuleType]], dtype: str, hdim: int, causal: bool
) -> None:
    torch, mods = built_modules
    b, sq, sk, hq, hk = 2, 77, 130, 4, 2
    t = _dt(torch, dtype)
    q = torch.randn(b, sq, hq, hdim, device="cuda", dtype=t)
    k = torch.randn(b, sk, hk, hdim, device="cuda", dtype=t)
    v = torch.randn(b, sk, hk, hdim, device="cuda", dtype=t)
    out = torch.empty_like(q)
    lse = torch.empty(b, hq, sq, device="cuda", dtype=torch.float32)
    scale = hdim**-0.5
    mods["module_attn_fwd"].attn_fwd(
        q.data_ptr(),
        k.data_ptr(),
        v.data_ptr(),
        out.data_ptr(),
        b,
        sq,
        sk,
        hq,
        hk,
        hdim,
        scale,
        dtype,
        causal,
        lse.data_ptr(),
    )
    torch.cuda.synchronize()
    for i in range(b):
        ro, rl = _ref_attn(torch, q[i], k[i], v[i], scale, causal)
        torch.testing.assert_close(out[i].float(), ro, atol=TOL[dtype] * 5, rtol=TOL[dtype])
        torch.testing.assert_close(lse[i], rl, atol=1e-3, rtol=1e-4)


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.parametrize("dtype", TORCH_DTYPES)
@pytest.mark.parametrize("causal", [False, True])
def test_attn_fwd_group_on_gpu(built_modules: tuple[Any, dict[str, ModuleType]], dtype: str, causal: bool) -> None:
    torch, mods = built_modules
    seqs_q, seqs_k = [5, 70, 1, 130, 40], [5, 100, 3, 130, 20]  # the last: sk < sq, rows see no key
    hq, hk, hdim = 3, 1, 128
    t = _dt(torch, dtype)
    cu_q = torch.tensor([0, *itertools.accumulate(seqs_q)], device="cuda", dtype=torch.int32)
    cu_k = torch.tensor([0, *itertools.accumulate(seqs_k)], device="cuda", dtype=torch.int32)
    q = torch.randn(sum(seqs_q), hq, hdim, device="cuda", dtype=t)
    k = torch.randn(sum(seqs_k), hk, hdim, device="cuda", dtype=t)
    v = torch.randn(sum(seqs_k), hk, hdim, device="cuda", dtype=t)
    out = torch.full_like(q, float("nan"))
    lse = torch.empty(hq, sum(seqs_q), device="cuda", dtype=torch.float32)
    scale = 0.1
    mods["module_attn_fwd"].attn_fwd(
        q.data_ptr(),
        k.data_ptr(),
        v.data_ptr(),
        out.data_ptr(),
        len(seqs_q),
        max(seqs_q),
        0,
        hq,
        hk,
        hdim,
        scale,
        dtype,
        causal,
        lse.data_ptr(),
        cu_q.data_ptr(),
        cu_k.data_ptr(),
    )
    torch.cuda.synchronize()
    for i in range(len(seqs_q)):
        qs, qe = int(cu_q[i]), int(cu_q[i + 1])
        ks, ke = int(cu_k[i]), int(cu_k[i + 1])
        ro, rl = _ref_attn(torch, q[qs:qe], k[ks:ke], v[ks:ke], scale, causal)
        torch.testing.assert_close(out[qs:qe].float(), ro, atol=TOL[dtype] * 5, rtol=TOL[dtype])
        torch.testing.assert_close(lse[:, qs:qe], rl, atol=1e-3, rtol=1e-4)


@pytest.mark.gpu
@pytest.mark.slow
def test_attn_fwd_errors_on_gpu(built_modules: tuple[Any, dict[str, ModuleType]]) -> None:
    torch, mods = built_modules
    x = torch.zeros(1, 1, 1, 256, device="cuda", dtype=torch.float16)
    with pytest.raises(RuntimeError, match="no instance built"):
        mods["module_attn_fwd"].attn_fwd(
            x.data_ptr(), x.data_ptr(), x.data_ptr(), x.data_ptr(), 1, 1, 1, 1, 1, 256, 1.0, "fp16"
        )
    with pytest.raises(ValueError, match="invalid arguments"):
        mods["module_attn_fwd"].attn_fwd(
            x.data_ptr(), x.data_ptr(), x.data_ptr(), x.data_ptr(), 1, 1, 1, 3, 2, 64, 1.0, "fp16"
        )
