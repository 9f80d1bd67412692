"""examples/te-manifest.toml (Transformer Engine's manifest, TE 1f682cfd: no variant matrix, both
archs, every receipt-700 kernel) as tests on the amd-aiter sdist use it.

The sdist's module table lists no ``srcs`` for ``libmha_fwd``, so ``drop_srcs`` has nothing to drop
there (a plan error unrelated to what these tests check): it is left out. Tests that check how a variant
matrix selects kernels narrow TE's manifest with :data:`NARROW`, stated here rather than in the example,
as a user narrowing it would: bf16/fp16, no bias/alibi/dropout/skip/sink, lse; bwd not deterministic."""

from __future__ import annotations

from pathlib import Path

from support.common import EXAMPLES

NARROW = """
[[mha_fwd_variants]]
dtype = ["bf16", "fp16"]
has_bias = false
has_alibi = false
has_lse = true
has_dropout = false
has_skip = false
has_sink = false

[[mha_bwd_variants]]
dtype = ["bf16", "fp16"]
has_bias = false
has_alibi = false
has_dbias = false
deterministic = false
"""


def te_manifest(path: Path, sections: str = "") -> Path:
    """examples/te-manifest.toml less ``drop_srcs``, with ``sections`` (variant tables) appended."""
    text = "".join(
        ln for ln in (EXAMPLES / "te-manifest.toml").read_text().splitlines(True) if not ln.startswith("drop_srcs")
    )
    assert "\n[[mha_" not in text  # the example is TE's: no variant matrix of its own
    path.write_text(text + sections)
    return path
