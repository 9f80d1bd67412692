"""Helpers shared by test files (first written in test_jit_build.py)."""

from __future__ import annotations

TOKENS = 'tokens = {mask = {true = "mask", false = "nmask"}, lse = {true = "lse", false = "nlse"}}'


AOT_TWO = f"""
[jit]
[[jit.aot.variants]]
module = "libattn_fwd"
pattern = "attn_fwd_d{{hdim}}_{{dtype}}_{{mode}}_*_{{mask}}_{{lse}}"
options = {{hdim = 64, dtype = "fp16", mode = "batch", mask = false, lse = [false, true]}}
{TOKENS}
"""


TWO = {"attn_fwd_d64_fp16_batch_b64x64_nmask_nlse", "attn_fwd_d64_fp16_batch_b64x64_nmask_lse"}
