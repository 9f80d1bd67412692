"""Helpers shared by test files (first written in test_rocm_aiter.py)."""

from __future__ import annotations

import json
from pathlib import Path
from subprocess import CompletedProcess

from support.common import run_qola

ARCHS = ("gfx942", "gfx950")


HIP_VERSION = "6.4"  # what Debian's hipcc 7.0.2 builds against (see test_rocm7_pin_is_explained)


# Debian's clang 21 is upstream LLVM, not AMD's fork: with AITER's early-inline-all a CK fMHA backward
# kernel compiles for tens of minutes instead of 38 s (docs/benchmarks.md). Everything else is AITER's.
DROP = ("-mllvm -amdgpu-early-inline-all=true",)


# one forward kernel: a generic gfx9 instance (real code for gfx942) and its gfx950 twin
FWD = (
    'dtype = "bf16"\nhdim = 32\nmode = "batch"\nhas_bias = false\nhas_alibi = false\nhas_logits = false\n'
    "has_lse = true\nhas_mask = false\nhas_dropout = false\nhas_skip = false\nhas_sink = false\n"
)


FWD_ONE = 'name = "*_b128x64x16x32x32x32_*_psddv_*"\n'


BWD = (
    'dtype = "bf16"\nhdim = 32\nmode = "batch"\nhas_bias = false\nhas_alibi = false\nhas_dbias = false\n'
    "has_mask = false\nhas_dropout = false\ndeterministic = false\n"
)


# one dq_dk_dv kernel (gfx9 and gfx950 files), with the dot_do_o / convert_dq kernels CK pairs with it
BWD_ONE = 'name = "*_b32x128x32x32x32x32x64x32x32_*_npad_*"\n'


def manifest(
    path: Path,
    ns: str,
    archs: tuple[str, ...] = ARCHS,
    *,
    fwd: bool = True,
    bwd: bool = False,
    link: str = "shared",
    extra: str = "",
    rocm: str = HIP_VERSION,
    fwd_variant: str = FWD + FWD_ONE,
    bwd_variant: str = BWD + BWD_ONE,
) -> Path:
    """Transformer Engine's manifest shape (QoLA's example/te-manifest.toml), narrowed by variants.

    libmha_bwd (``bwd``) gets AITER's CK API only (``mha_bwd_generate.py --receipt 1``; the table's
    receipt 3 adds the v3 asm dispatch): the v3 bwd API's host code calls 44 of AITER's pre/post
    kernels (dot_do_o/convert_dq, fp16/bf16, d64-d256, batch/group) whatever the variants, and their
    pad-d forms take up to 8 min each with clang 21 here (docs/benchmarks.md). The v3 bwd code objects
    are embedded all the same."""
    text = (
        f'[qola]\nnamespace = "{ns}"\nrocm_versions = ["{rocm}"]\n\n'
        f'[build]\narchitectures = {json.dumps(list(archs))}\nmode = "cpp_itfs"\nlink = "{link}"\n'
        f"drop_hip_flags = {json.dumps(list(DROP))}\n\n"
    )
    if fwd:
        text += (
            '[[modules]]\nname = "libmha_fwd"\nreceipt = 700\n'
            'drop_srcs = ["mha_fwd_split.cu", "mha_fwd_batch_prefill.cu"]\n'
            'drop_directions = ["fwd_splitkv", "batch_prefill"]\nembed = ["fmha_v3_fwd"]\n\n'
        )
    if bwd:
        text += (
            '[[modules]]\nname = "libmha_bwd"\nreceipt = 700\nembed = ["fmha_v3_bwd"]\nblob_gen_cmd = [\n'
            '  "3rdparty/composable_kernel/example/ck_tile/01_fmha/generate.py -d bwd --receipt 700 '
            '--output_dir {}",\n'
            '  "csrc/cpp_itfs/mha_bwd_generate.py --receipt 1 --output_dir {}",\n]\n\n'
        )
    if fwd:
        text += f"[[mha_fwd_variants]]\n{fwd_variant}\n"
    if bwd:
        text += f"[[mha_bwd_variants]]\n{bwd_variant}\n"
    path.write_text(text + extra)
    return path


NS = "te"


def build(tmp: Path, tree: Path, m: Path, name: str = "out", *more: str) -> tuple[CompletedProcess[str], Path]:
    out = tmp / name
    proc = run_qola("build", "--manifest", str(m), "--aiter-root", str(tree), "-o", str(out), "-j", "2", *more)
    return proc, out
