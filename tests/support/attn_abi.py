"""ctypes mirror of ``qola_attn_fwd_params`` (qola/templates/wrappers/qola_attn_fwd.h), shared by the
tests that call the example attention library through its C ABI, in-process or in a child script."""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any

_FIELDS: list[tuple[str, Any]] = (
    [(n, ctypes.c_void_p) for n in ("q", "k", "v", "out", "lse", "cu_seqlens_q", "cu_seqlens_k")]
    + [(n, ctypes.c_int) for n in ("batch", "seqlen_q", "seqlen_k", "nhead_q", "nhead_k", "hdim")]
    + [("scale", ctypes.c_float), ("dtype", ctypes.c_char_p), ("causal", ctypes.c_int), ("stream", ctypes.c_void_p)]
)


class Params(ctypes.Structure):
    _fields_ = _FIELDS


def child_preamble() -> str:
    """Lines that give a child script ``P`` (this struct)."""
    return f"import sys\nsys.path.insert(0, {str(Path(__file__).parent)!r})\nfrom attn_abi import Params as P\n"


def attn_manifest(ns: str, jit: str = "") -> str:
    """The example's libattn_fwd (cpp_itfs, bf16 only) for sm_90 in namespace ``ns``; ``jit``: the
    manifest's ``[jit]`` text after the variants (empty: no JIT)."""
    return (
        f'[qola]\nnamespace = "{ns}"\n[build]\narchitectures = ["sm_90"]\n'
        '[[modules]]\nname = "libattn_fwd"\nmode = "cpp_itfs"\n'
        '[[variants]]\nmodule = "libattn_fwd"\npattern = "attn_fwd_d*_{dtype}_*"\noptions = {dtype = "bf16"}\n'
    ) + jit


def child_call(ns: str) -> str:
    """A child script (after :func:`child_preamble`) that calls ``<ns>_libattn_fwd_attn_fwd`` on the
    library ``argv[1]`` (``argv[2]``: causal 0/1) with bf16 inputs of head size 128 and leaves ``r``
    (its status), ``o``/``lse`` (its results), ``s`` (the scores) and ``ref`` (torch's attention),
    and ``lib`` with ``<ns>_qola_jit_last_error`` typed, for the test's own last lines."""
    return f"""
import ctypes, math, sys, torch
lib = ctypes.CDLL(sys.argv[1], mode=ctypes.RTLD_LOCAL)
f = lib.{ns}_libattn_fwd_attn_fwd
f.argtypes, f.restype = [ctypes.POINTER(P)], ctypes.c_int
lib.{ns}_qola_jit_last_error.restype = ctypes.c_char_p
causal = int(sys.argv[2])
torch.manual_seed(0)
b, sq, sk, h, d = 2, 64, 80, 4, 128
q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for s in (sq, sk, sk))
o = torch.zeros_like(q)
lse = torch.empty(b, h, sq, device="cuda", dtype=torch.float32)
scale = 1 / math.sqrt(d)
p = P(q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), lse.data_ptr(), None, None,
      b, sq, sk, h, h, d, scale, b"bf16", causal, None)
r = f(ctypes.byref(p))
torch.cuda.synchronize()
s = torch.einsum("bqhd,bkhd->bhqk", q.float(), k.float()) * scale
if causal:
    s = s.masked_fill(~torch.ones(sq, sk, device="cuda", dtype=torch.bool).tril(sk - sq), float("-inf"))
ref = torch.einsum("bhqk,bkhd->bqhd", torch.softmax(s, -1), v.float())
"""
