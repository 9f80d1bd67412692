"""GPU architecture names: which vendor, validation, normalisation.

HIP targets are AMD target IDs: ``gfx`` + digits + an optional letter, followed
by optional ``:feature+`` / ``:feature-`` settings (``gfx90a:xnack-``).
CUDA targets are ``sm_<digits>`` with an optional ``a`` (arch-specific, e.g.
``sm_90a``) or ``f`` (family-specific) suffix.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from qola.errors import QolaError

_GFX = re.compile(r"gfx[0-9]+[a-z]?(?::[a-z][a-z0-9_]*[+-])*")
_SM = re.compile(r"sm_([0-9]+)([af]?)")

HIP = "hip"
CUDA = "cuda"


def vendor_of(arch: str) -> str:
    """``"hip"`` for a gfx target ID, ``"cuda"`` for ``sm_XX``; QolaError otherwise."""
    if _GFX.fullmatch(arch):
        return HIP
    if _SM.fullmatch(arch):
        return CUDA
    hint = "use AMD target IDs such as gfx90a, gfx942, gfx950, gfx90a:xnack- or CUDA ones such as sm_80, sm_90a"
    if arch == "native":
        hint = "name the architectures explicitly; an ahead-of-time build cannot ask the GPU (" + hint + ")"
    raise QolaError(f"unknown GPU architecture {arch!r}", hint=hint)


def arch_base(arch: str) -> str:
    """The processor without target features: ``gfx90a:xnack-`` -> ``gfx90a``."""
    return arch.split(":", 1)[0]


def validate_archs(archs: Sequence[str]) -> tuple[str, tuple[str, ...]]:
    """Check a list of architectures; return (vendor, de-duplicated archs in order)."""
    if isinstance(archs, str):
        archs = [archs]
    cleaned = tuple(dict.fromkeys(a.strip() for a in archs))
    if not cleaned or cleaned == ("",):
        raise QolaError(
            "no GPU architectures given",
            hint='set [build] architectures, e.g. architectures = ["gfx942"] or ["sm_90"]',
        )
    by_vendor: dict[str, list[str]] = {}
    for arch in cleaned:
        by_vendor.setdefault(vendor_of(arch), []).append(arch)
    if len(by_vendor) > 1:
        parts = "; ".join(f"{v}: {', '.join(a)}" for v, a in by_vendor.items())
        raise QolaError(
            f"architectures mix GPU vendors ({parts})",
            hint="one build targets one toolchain: keep only gfx* (HIP) or only sm_* (CUDA) "
            "architectures, and run a second build for the other vendor",
        )
    bases: dict[str, str] = {}
    for arch in cleaned:
        other = bases.setdefault(arch_base(arch), arch)
        if other != arch:
            raise QolaError(
                f"architecture {arch_base(arch)} is listed twice with different features ({other}, {arch})",
                hint="keep one target ID per processor",
            )
    return next(iter(by_vendor)), cleaned


def cuda_gencode(arch: str) -> list[str]:
    """``sm_90`` -> ``-gencode arch=compute_90,code=sm_90`` (``sm_90a`` keeps its suffix)."""
    match = _SM.fullmatch(arch)
    if not match:
        raise QolaError(f"not a CUDA architecture: {arch!r}", hint="use sm_XX, e.g. sm_90")
    digits, suffix = match.groups()
    return ["-gencode", f"arch=compute_{digits}{suffix},code=sm_{digits}{suffix}"]


def cuda_base_code(arch: str) -> str:
    """``sm_90a`` -> ``sm_90``: the name nvcc lists in ``--list-gpu-code``."""
    match = _SM.fullmatch(arch)
    return f"sm_{match.group(1)}" if match else arch
