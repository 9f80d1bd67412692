"""The slices of Transformer Engine's manifest shape the differential benches build (one home for them).

``tests/support/rocm_aiter.py`` ``manifest()`` is TE's shape (QoLA's ``example/te-manifest.toml``:
libmha_fwd + libmha_bwd, cpp_itfs, receipt 700, splitkv and batch_prefill dropped), narrowed by
variants to a few CK fMHA instances:

- ``A``: gfx942; forward d32 bf16 batch lse (two instances) and one backward dq_dk_dv tile with the
  dot_do_o / convert_dq kernels CK pairs with it (``bench/vs_aiter.py``'s slice A);
- ``B``: the same for gfx942 + gfx950 (TE's two-arch slice; ``bench/vs_aiter.py``'s slice B);
- ``tiny``: gfx942, libmha_fwd alone, one forward instance: minutes, for checking a bench end to end.
"""

from __future__ import annotations

import resource
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

SLICES: dict[str, tuple[str, ...]] = {"A": ("gfx942",), "B": ("gfx942", "gfx950"), "tiny": ("gfx942",)}
MODULES: dict[str, tuple[str, ...]] = {
    "A": ("libmha_fwd", "libmha_bwd"),
    "B": ("libmha_fwd", "libmha_bwd"),
    "tiny": ("libmha_fwd",),
}
NS = "te"


def slice_manifest(path: Path, name: str) -> Path:
    """Write slice ``name``'s qola manifest to ``path`` (tests/support's ``manifest()``, namespace te)."""
    if str(REPO / "tests") not in sys.path:
        sys.path.insert(0, str(REPO / "tests"))
    from support.rocm_aiter import FWD, FWD_ONE, manifest  # lazy: tests/ is on the path only for the benches

    if name == "tiny":
        written: Path = manifest(path, NS, SLICES[name], fwd_variant=FWD + FWD_ONE)
    else:
        written = manifest(path, NS, SLICES[name], bwd=True, fwd_variant=FWD)
    return written


def child_cpu() -> float:
    """User + system seconds of every waited-for child so far (``getrusage(RUSAGE_CHILDREN)``)."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime
