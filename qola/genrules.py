"""What a generator's absence or failure means, as AITER treats it (pure functions, no I/O but ``stat``).

* :func:`asm_arch`: a script under the tree's ``hsa/<gfx…>/`` is a per-arch assembly-kernel generator
  (``hsa/gfx942/fmha_v3_fwd/codegen.py``). AITER ships those only for the archs it has hand-written
  kernels for and builds the module without them elsewhere (its ``os.system`` call fails and it goes
  on), so an absent one is skipped with a warning; any other absent or failing generator fails the
  module.
* :func:`per_arch`: AITER names one arch's asm dir in a command (``get_asm_dir()``: the GPU it runs
  on, the last of ``GPU_ARCHS``), while its API generators (``mha_fwd_generate.py``, …) dispatch to
  ``<gfx>::fmha_*_v3`` for every target; a multi-arch build runs the asm generator once per target arch,
  else the library references the other archs' v3 entry points and never defines them.
* :func:`flavor_of` / :func:`dispatch_only_filter`: CK's fMHA ``generate.py`` writes one file per
  kernel and a dispatch file (``fmha_<direction>_api.cpp``) that calls exactly the kernels written;
  run with a filter that matches no kernel, it writes the dispatch alone, which finds no kernel
  (returns -1). That is what a dropped direction (``drop_directions``) becomes: AITER's API sources
  call every direction's dispatch function, so it must exist for the library to link.
* :func:`missing_package_hint`: a generator that died on ``ModuleNotFoundError`` gets a hint naming
  the interpreter that ran it and the ``pip install`` that fixes it.
"""

from __future__ import annotations

import os
import platform
import re
import sys
from pathlib import Path

_NO_MODULE = re.compile(r"(?:ModuleNotFoundError|ImportError): No module named '([A-Za-z0-9_.]+)'")
# import name -> distribution name, where they differ (kept tiny: what generators import)
PACKAGES = {"yaml": "PyYAML", "PIL": "Pillow", "sklearn": "scikit-learn", "cv2": "opencv-python"}
AITER_REQUIREMENTS = "packaging, pandas, jinja2, setuptools …"


# CK kernel kinds per direction, in the order of the ``@``-separated filter; "" = every other name.
CK_KINDS: dict[str, tuple[tuple[str, str], ...]] = {
    "fwd": (("fwd", ""),),
    "batch_prefill": (("batch_prefill", ""),),
    "fwd_splitkv": (("combine", "fmha_fwd_splitkv_combine_"), ("splitkv", "")),
    "bwd": (("dot_do_o", "fmha_bwd_dot_do_o_"), ("convert_dq", "fmha_bwd_convert_dq_"), ("dq_dk_dv", "")),
}
NO_KERNEL = "qola_no_kernel"  # a filter pattern no CK kernel name matches


def flavor_of(script: str) -> str:
    """``"ck"`` for CK's fMHA ``generate.py`` (beside its ``codegen/ops`` package), else ``"plain"``."""
    p = Path(script)
    return "ck" if p.name == "generate.py" and (p.parent / "codegen" / "ops").is_dir() else "plain"


def dispatch_only_filter(direction: str | None) -> str | None:
    """The CK ``--filter`` that selects no kernel of ``direction`` (one pattern per kernel kind), so
    the generator writes the dispatch file alone; None for a direction CK does not have."""
    kinds = CK_KINDS.get(direction or "")
    return "@".join([NO_KERNEL] * len(kinds)) if kinds else None


def asm_arch(script: str, hsa_dir: str | os.PathLike | None) -> str | None:
    """The arch (``gfx90a``) when ``script`` lies under ``<hsa_dir>/<gfx…>/``, else None."""
    if not hsa_dir or not script:
        return None
    try:
        rel = Path(os.path.normpath(script)).relative_to(os.path.normpath(hsa_dir))
    except ValueError:
        return None
    return rel.parts[0] if len(rel.parts) > 1 and rel.parts[0].startswith("gfx") else None


def per_arch(command: str, script: str, hsa_dir: str | os.PathLike | None, archs: tuple[str, ...]) -> list[str]:
    """``command`` once per target arch when ``script`` is a per-arch asm generator, else ``[command]``.
    The arch dir segment ``/hsa/<gfx>/`` is replaced by each target's (its script may be absent there:
    skipped with a warning when it runs)."""
    arch = asm_arch(script, hsa_dir)
    if arch is None or not archs:
        return [command]
    seg = f"{os.path.normpath(hsa_dir)}/{arch}/"
    if seg not in command:
        return [command]
    return list(dict.fromkeys(command.replace(seg, f"{os.path.normpath(hsa_dir)}/{a}/") for a in archs))


def skip_warning(module: str, script: str, arch: str) -> str:
    return (f"module {module}: skipped generator {os.path.normpath(script)}: the tree has no {arch} "
            f"assembly kernels of this kind (AITER builds the module without them)")


def missing_module(output: str) -> str | None:
    """The module a Python traceback in ``output`` could not import (the last one named)."""
    found = _NO_MODULE.findall(output or "")
    return found[-1] if found else None


def missing_package_hint(output: str, python: str) -> str | None:
    """``None`` unless ``output`` shows a missing Python module."""
    name = missing_module(output)
    if name is None:
        return None
    top = name.split(".")[0]
    package = PACKAGES.get(top, top)
    version = f" (Python {platform.python_version()})" if os.path.realpath(python) == os.path.realpath(
        sys.executable) else ""  # fmt: skip
    return (f"the generator ran under {python}{version}, which has no module {top!r}: "
            f"install it there with `{python} -m pip install {package}` "
            f"(AITER's generators need its build requirements: {AITER_REQUIREMENTS})")
