"""On a GPU: the example modules, built by qola for sm_90, run from Python on torch tensors
and match a torch reference."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from support.common import KERNELS, run_qola

pytestmark = [pytest.mark.gpu, pytest.mark.slow]


def _load(path: Path) -> ModuleType:
    name = path.name.split(".")[0]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    sys.modules[name] = mod
    return mod


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("gpu")
    m = tmp / "q.toml"
    m.write_text(
        '[qola]\nnamespace = "qk"\n[build]\narchitectures = ["sm_90"]\n'
        '[[modules]]\nname = "module_rmsnorm"\n[[modules]]\nname = "module_softmax"\n'
        '[[modules]]\nname = "module_attn_fwd"\n'
    )
    out = tmp / "out"
    proc = run_qola("build", "--manifest", str(m), "--aiter-root", str(KERNELS), "-o", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out


@pytest.fixture(scope="module")
def torch() -> Any:
    return pytest.importorskip("torch")


DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
TOL = {"fp32": 1e-4, "fp16": 2e-2, "bf16": 5e-2}


@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
def test_rmsnorm_matches_torch(built: Path, torch: Any, dtype: str) -> None:
    mod = _load(built / "lib" / "qk_module_rmsnorm.so")
    tdt = getattr(torch, DTYPES[dtype])
    x = torch.randn(257, 1000, device="cuda", dtype=tdt)
    w = torch.randn(1000, device="cuda", dtype=tdt)
    out = torch.empty_like(x)
    mod.rmsnorm(out.data_ptr(), x.data_ptr(), w.data_ptr(), 257, 1000, 1e-6, dtype)
    torch.cuda.synchronize()
    xf = x.float()
    ref = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()
    torch.testing.assert_close(out.float(), ref, atol=TOL[dtype], rtol=TOL[dtype])


@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
def test_softmax_matches_torch(built: Path, torch: Any, dtype: str) -> None:
    mod = _load(built / "lib" / "qk_module_softmax.so")
    tdt = getattr(torch, DTYPES[dtype])
    x = torch.randn(333, 777, device="cuda", dtype=tdt)
    out = torch.empty_like(x)
    mod.softmax(out.data_ptr(), x.data_ptr(), 333, 777, 0.5, dtype)
    torch.cuda.synchronize()
    ref = torch.softmax(x.float() * 0.5, -1)
    torch.testing.assert_close(out.float(), ref, atol=TOL[dtype], rtol=TOL[dtype])


@pytest.mark.parametrize(
    "dtype,hdim,causal,lse",
    [
        ("fp16", 64, False, False),
        ("bf16", 128, True, True),
        ("fp32", 64, True, False),
        ("fp16", 128, False, True),
    ],
)
def test_attention_matches_torch(built: Path, torch: Any, dtype: str, hdim: int, causal: bool, lse: bool) -> None:
    mod = _load(built / "lib" / "qk_module_attn_fwd.so")
    tdt = getattr(torch, DTYPES[dtype])
    b, sq, sk, h = 2, 77, 93, 4
    q = torch.randn(b, sq, h, hdim, device="cuda", dtype=tdt)
    k = torch.randn(b, sk, h, hdim, device="cuda", dtype=tdt)
    v = torch.randn(b, sk, h, hdim, device="cuda", dtype=tdt)
    out = torch.empty_like(q)
    lse_t = torch.empty(b, h, sq, device="cuda", dtype=torch.float32) if lse else None
    scale = 1.0 / math.sqrt(hdim)
    mod.attn_fwd(
        q.data_ptr(),
        k.data_ptr(),
        v.data_ptr(),
        out.data_ptr(),
        b,
        sq,
        sk,
        h,
        h,
        hdim,
        scale,
        dtype,
        causal,
        lse_t.data_ptr() if lse_t is not None else 0,
    )
    torch.cuda.synchronize()
    s = torch.einsum("bqhd,bkhd->bhqk", q.float(), k.float()) * scale
    if causal:  # bottom-right aligned as in CK when seqlen_k > seqlen_q
        mask = torch.ones(sq, sk, device="cuda", dtype=torch.bool).tril(diagonal=sk - sq)
        s = s.masked_fill(~mask, float("-inf"))
    ref = torch.einsum("bhqk,bkhd->bqhd", torch.softmax(s, -1), v.float())
    torch.testing.assert_close(out.float(), ref, atol=TOL[dtype] * 2, rtol=TOL[dtype] * 2)
    if lse:
        torch.testing.assert_close(lse_t, torch.logsumexp(s, -1), atol=1e-3, rtol=1e-3)
