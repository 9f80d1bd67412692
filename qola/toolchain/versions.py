"""Parse compiler versions and enforce the manifest's accepted versions."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from qola.core import inputs
from qola.core.errors import QolaError

_HIP = re.compile(r"HIP version:\s*([0-9]+(?:\.[0-9]+)*)(\S*)")
_NVCC = re.compile(r"release\s+([0-9]+\.[0-9]+)")
_HIPCONFIG = re.compile(r"^\s*([0-9]+\.[0-9]+(?:\.[0-9]+)?)(\S*)\s*$", re.M)


def parse_hip_version(text: str) -> tuple[str, str] | None:
    """``HIP version: 5.2.21153-0`` -> ``("5.2.21153", "-0")`` (dotted part, suffix).

    Also accepts the bare ``hipconfig --version`` form ``6.3.42131-fa1d09cfd``.
    """
    match = _HIP.search(text) or _HIPCONFIG.search(text)
    return (match.group(1), match.group(2)) if match else None


def parse_nvcc_version(text: str) -> str | None:
    """``Cuda compilation tools, release 13.0, V13.0.88`` -> ``"13.0"``."""
    match = _NVCC.search(text)
    return match.group(1) if match else None


def hip_version_key(dotted: str, suffix: str = "") -> tuple[int, int, int, int]:
    """Order HIP versions the way AITER does (packaging ``Version`` after it turns the
    ``-git`` suffix into a local version): a suffixed version sorts after the plain one."""
    parts = [int(p) for p in dotted.split(".")[:3]]
    parts += [0] * (3 - len(parts))
    return (parts[0], parts[1], parts[2], 1 if suffix.strip("-+") else 0)


def rocm_release(root: str | Path) -> str | None:
    """The ROCm release of an install (``<root>/.info/version``: ``6.3.0-39`` -> ``6.3.0``)."""
    try:
        text = inputs.read_record(Path(root) / ".info" / "version", limit=1 << 16, what="ROCm version file").strip()
    except OSError:
        return None
    match = re.match(r"[0-9]+(?:\.[0-9]+)*", text)
    return match.group(0) if match else None


def version_matches(version: str, accepted: str) -> bool:
    """Prefix match on dotted components: ``"7.2"`` accepts ``7.2`` and ``7.2.*``."""
    want = [p for p in str(accepted).strip().split(".") if p not in ("", "*", "x")]
    have = version.split(".")
    return bool(want) and have[: len(want)] == want


def check_accepted(
    kind: str,
    compiler: str,
    versions: Sequence[str],
    accepted: Sequence[str] | None,
    enforce: bool = True,
) -> str | None:
    """None when one of ``versions`` (the compiler's version and, for ROCm, the release number when
    known) matches one of ``accepted`` (or nothing is asked); otherwise a QolaError, or with
    ``enforce`` false the message as a warning (``rocm_versions``: QoLA records it and never
    enforces it, and TE's manifests say 7.2 while it builds with ROCm 7.0 and 7.1)."""
    if accepted is None:
        return None
    if isinstance(accepted, str):
        accepted = [accepted]
    if any(version_matches(v, a) for v in versions if v for a in accepted):
        return None
    key = "rocm_versions" if kind == "hip" else "cuda_versions"
    shown = " / ".join(v for v in versions if v)
    wanted = ", ".join(repr(str(a)) for a in accepted) or "(nothing)"
    if kind == "hip":
        # "ROCm N" here means the HIP headers and runtime the compiler builds against (HIP N.x): they
        # decide the ABI (libamdhip64.so.N) and AITER's version-gated flags. A hipcc driver packaged
        # with a newer ROCm number (Debian's hipcc 7.0.2 ships HIP 6.4) still builds HIP 6.4 binaries.
        how = (
            f"rocm_versions is matched against the HIP version (headers and runtime, which decide "
            f"the ABI: libamdhip64.so.{versions[0].split('.')[0]}) and the ROCm release in "
            "<ROCM_PATH>/.info/version, not the hipcc driver's package number; install a matching "
            "ROCm and point ROCM_PATH (or HIPCC) at it"
        )
    else:
        how = "install a matching CUDA toolkit and point CUDACXX (or CUDA_HOME, or PATH) at it"
    message = f"found {kind.upper()} {shown} at {compiler}, but the manifest accepts only [{wanted}] ([qola] {key})"
    if not enforce:
        abi = f"; the libraries link HIP's libamdhip64.so.{versions[0].split('.')[0]}" if kind == "hip" else ""
        return message + f" (built anyway{abi}: recorded in manifest.json, see docs/manifest.md)"
    raise QolaError(message, hint=f"{how}, or add {'.'.join(versions[0].split('.')[:2])!r} to {key}")
