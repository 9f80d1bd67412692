"""On a GPU: the torch-free cpp_itfs attention library, called through its C ABI with ctypes on
device memory, matches a torch reference."""

from __future__ import annotations

import ctypes
import math

import pytest

from conftest import KERNELS, run_qola

pytestmark = [pytest.mark.gpu, pytest.mark.slow]


class Params(ctypes.Structure):  # mirrors qola_attn_fwd_params in qola_attn_fwd.h
    _fields_ = [("q", ctypes.c_void_p), ("k", ctypes.c_void_p), ("v", ctypes.c_void_p), ("out", ctypes.c_void_p),
                ("lse", ctypes.c_void_p), ("cu_seqlens_q", ctypes.c_void_p), ("cu_seqlens_k", ctypes.c_void_p),
                ("batch", ctypes.c_int), ("seqlen_q", ctypes.c_int), ("seqlen_k", ctypes.c_int),
                ("nhead_q", ctypes.c_int), ("nhead_k", ctypes.c_int), ("hdim", ctypes.c_int),
                ("scale", ctypes.c_float), ("dtype", ctypes.c_char_p), ("causal", ctypes.c_int),
                ("stream", ctypes.c_void_p)]


def test_ctypes_c_abi_matches_torch(tmp_path):
    torch = pytest.importorskip("torch")
    m = tmp_path / "q.toml"
    m.write_text('[qola]\nnamespace = "te"\n[build]\narchitectures = ["sm_90"]\n'
                 '[[modules]]\nname = "libattn_fwd"\nmode = "cpp_itfs"\n')
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
    p = Params(q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), lse.data_ptr(), None, None,
               b, sq, sk, h, h, d, scale, b"bf16", 1, None)
    assert lib.te_libattn_fwd_attn_fwd(ctypes.byref(p)) == 0
    torch.cuda.synchronize()
    s = torch.einsum("bqhd,bkhd->bhqk", q.float(), k.float()) * scale
    s = s.masked_fill(~torch.ones(sq, sk, device="cuda", dtype=torch.bool).tril(sk - sq), float("-inf"))
    ref = torch.einsum("bhqk,bkhd->bqhd", torch.softmax(s, -1), v.float())
    torch.testing.assert_close(o.float(), ref, atol=5e-2, rtol=5e-2)
    torch.testing.assert_close(lse, torch.logsumexp(s, -1), atol=1e-3, rtol=1e-3)
    p.dtype = b"fp8"  # no instance: an error status, never a crash
    assert lib.te_libattn_fwd_attn_fwd(ctypes.byref(p)) == -1
