"""GPU architecture names: which vendor, validation, normalisation.

HIP targets are AMD target IDs: ``gfx`` + digits + an optional letter, followed
by optional ``:feature+`` / ``:feature-`` settings (``gfx90a:xnack-``).
CUDA targets are ``sm_<digits>`` with an optional ``a`` (arch-specific, e.g.
``sm_90a``) or ``f`` (family-specific) suffix. The syntax and the list rules are
:mod:`qola.core.rules`' (shared with the manifest); this module adds the toolchain's messages and the
CUDA code names.
"""

from __future__ import annotations

from collections.abc import Sequence

from qola.core import rules, settings
from qola.core.errors import QolaError

HIP = "hip"
CUDA = "cuda"
arch_base = rules.processor  # "gfx90a:xnack-" -> "gfx90a"


def vendor_of(arch: str) -> str:
    """``"hip"`` for a gfx target ID, ``"cuda"`` for ``sm_XX`` (:func:`qola.core.rules.vendor`); QolaError otherwise."""
    found = rules.vendor(arch)
    if found:
        return found
    hint = "use AMD target IDs such as gfx90a, gfx942, gfx950, gfx90a:xnack- or CUDA ones such as sm_80, sm_90a"
    if arch == "native":
        hint = "name the architectures explicitly; an ahead-of-time build cannot ask the GPU (" + hint + ")"
    raise QolaError(f"unknown GPU architecture {arch!r}", hint=hint)


def validate_archs(archs: Sequence[str]) -> tuple[str, tuple[str, ...]]:
    """Check a list of architectures (:func:`qola.core.rules.archs_problem`); return (vendor,
    de-duplicated archs in order)."""
    if isinstance(archs, str):
        archs = [archs]
    cleaned = tuple(dict.fromkeys(a.strip() for a in archs))
    if not cleaned or cleaned == ("",):
        raise settings.ARCHS.absent()  # the one message (qola.core.settings)
    for arch in cleaned:
        vendor_of(arch)  # an unknown one: its own message and hint
    problem = rules.archs_problem(cleaned)
    if problem:
        hint = (
            (
                "one build targets one toolchain: keep only gfx* (HIP) or only sm_* (CUDA) architectures, "
                "and run a second build for the other vendor"
            )
            if "mix" in problem
            else "keep one target ID per processor"
        )
        raise QolaError(problem, hint=hint)
    return vendor_of(cleaned[0]), cleaned


def cuda_gencode(arch: str) -> list[str]:
    """``sm_90`` -> ``-gencode arch=compute_90,code=sm_90`` (``sm_90a`` keeps its suffix)."""
    match = rules.SM_RE.match(arch)
    if not match:
        raise QolaError(f"not a CUDA architecture: {arch!r}", hint="use sm_XX, e.g. sm_90")
    digits, suffix = match.groups()
    return ["-gencode", f"arch=compute_{digits}{suffix},code=sm_{digits}{suffix}"]


def cuda_base_code(arch: str) -> str:
    """``sm_90a`` -> ``sm_90``: the name nvcc lists in ``--list-gpu-code``."""
    match = rules.SM_RE.match(arch)
    return f"sm_{match.group(1)}" if match else arch
