"""ctypes mirror of ``qola_attn_fwd_params`` (qola/templates/wrappers/qola_attn_fwd.h), shared by the
tests that call the example attention library through its C ABI, in-process or in a child script."""

from __future__ import annotations

import ctypes
from pathlib import Path


class Params(ctypes.Structure):
    _fields_ = (
        [(n, ctypes.c_void_p) for n in ("q", "k", "v", "out", "lse", "cu_seqlens_q", "cu_seqlens_k")]
        + [(n, ctypes.c_int) for n in ("batch", "seqlen_q", "seqlen_k", "nhead_q", "nhead_k", "hdim")]
        + [("scale", ctypes.c_float), ("dtype", ctypes.c_char_p), ("causal", ctypes.c_int), ("stream", ctypes.c_void_p)]
    )


def child_preamble() -> str:
    """Lines that give a child script ``P`` (this struct)."""
    return f"import sys\nsys.path.insert(0, {str(Path(__file__).parent)!r})\nfrom attn_abi import Params as P\n"
