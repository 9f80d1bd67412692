"""What a generator's absence or failure means, as AITER treats it, and what it is told to generate
(pure functions; no I/O but ``stat`` and size-limited reads of a generator script's source).

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
* :func:`file_archs` / :func:`source_archs`: the archs each generated file holds device code for (CK's
  ``…_gfx9`` / ``…_gfx950`` kernel files; a dispatch file serves all): the build compiles each file
  only for those.
* :func:`with_targets`: the archs a generator writes code for. CK's fMHA ``generate.py`` takes
  ``--targets=<arch,…>`` (newer CKs; without it, it writes every ``_gfx9``/``_gfx950`` twin);
  qola passes the plan's archs when the script's own argument list declares ``--targets`` (read
  from its source, never assumed). A generator reading ``AITER_GPU_ARCHS``/``GPU_ARCHS`` writes for
  the plan's archs; a per-arch asm generator for its one arch.
"""

from __future__ import annotations

import os
import platform
import re
import sys
from collections.abc import Mapping, Sequence
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
RECEIPT_ARG = re.compile(r"(?<!\S)(--receipt|-r)(=|\s+)(\S+)")  # a generator command's receipt: flag, separator, N
MAX_SCRIPT = 4 << 20  # a generator script read for its argument list
_TARGETS_ARG = re.compile(r"""add_argument\(\s*(?:["'][^"']*["']\s*,\s*)*["']--targets["']""")
_TARGETS_IN_CMD = re.compile(r"(?:^|\s)--targets(?:=|\s+)(\S+)")
_ARCHS_ENV = re.compile(r"""["'](?:AITER_GPU_ARCHS|GPU_ARCHS)["']""")


def flavor_of(script: str) -> str:
    """``"ck"`` for CK's fMHA ``generate.py`` (beside its ``codegen/ops`` package), else ``"plain"``."""
    p = Path(script)
    return "ck" if p.name == "generate.py" and (p.parent / "codegen" / "ops").is_dir() else "plain"


def dispatch_only_filter(direction: str | None) -> str | None:
    """The CK ``--filter`` that selects no kernel of ``direction`` (one pattern per kernel kind), so
    the generator writes the dispatch file alone; None for a direction CK does not have."""
    kinds = CK_KINDS.get(direction or "")
    return "@".join([NO_KERNEL] * len(kinds)) if kinds else None


def asm_arch(script: str, hsa_dir: str | os.PathLike[str] | None) -> str | None:
    """The arch (``gfx90a``) when ``script`` lies under ``<hsa_dir>/<gfx…>/``, else None."""
    if not hsa_dir or not script:
        return None
    try:
        rel = Path(os.path.normpath(script)).relative_to(os.path.normpath(hsa_dir))
    except ValueError:
        return None
    return rel.parts[0] if len(rel.parts) > 1 and rel.parts[0].startswith("gfx") else None


def per_arch(command: str, script: str, hsa_dir: str | os.PathLike[str] | None, archs: tuple[str, ...]) -> list[str]:
    """``command`` once per target arch when ``script`` is a per-arch asm generator, else ``[command]``.
    The arch dir segment ``/hsa/<gfx>/`` is replaced by each target's (its script may be absent there:
    skipped with a warning when it runs)."""
    arch = asm_arch(script, hsa_dir)
    if arch is None or not archs or hsa_dir is None:
        return [command]
    seg = f"{os.path.normpath(hsa_dir)}/{arch}/"
    if seg not in command:
        return [command]
    return list(dict.fromkeys(command.replace(seg, f"{os.path.normpath(hsa_dir)}/{a}/") for a in archs))


def skip_warning(module: str, script: str, arch: str) -> str:
    return (
        f"module {module}: skipped generator {os.path.normpath(script)}: the tree has no {arch} "
        f"assembly kernels of this kind (AITER builds the module without them)"
    )


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
    return (
        f"the generator ran under {python}{version}, which has no module {top!r}: "
        f"install it there with `{python} -m pip install {package}` "
        f"(AITER's generators need its build requirements: {AITER_REQUIREMENTS})"
    )


def _script_text(script: str) -> str:
    from qola.core.errors import QolaError  # lazy: paid only by the callers that need it
    from qola.plan.tree.files import read_small  # lazy: paid only by the callers that need it

    try:
        return read_small(script, limit=MAX_SCRIPT, what="generator script").decode("utf-8", "replace")
    except (OSError, QolaError):  # absent, a FIFO, huge: not read; running it says more
        return ""


def takes_targets(script: str) -> bool:
    """Whether ``script`` (CK's fMHA generate.py) declares a ``--targets`` argument."""
    return flavor_of(script) == "ck" and bool(_TARGETS_ARG.search(_script_text(script)))


def processors(archs: tuple[str, ...]) -> tuple[str, ...]:
    """``gfx942`` of ``gfx942:xnack-``; order kept, duplicates dropped."""
    return tuple(dict.fromkeys(a.split(":")[0] for a in archs))


def with_targets(
    command: str, script: str, archs: tuple[str, ...], hsa_dir: str | os.PathLike[str] | None = None
) -> tuple[str, tuple[str, ...]]:
    """(``command``, with ``--targets=<archs>`` when ``script`` takes it and the command names none;
    the archs the generator writes for, () when qola cannot tell)."""
    if not script:
        return command, ()
    if (one := asm_arch(script, hsa_dir)) is not None:
        return command, (one,)
    if takes_targets(script):
        if (m := _TARGETS_IN_CMD.search(command)) is not None:  # the table or manifest chose them
            return command, tuple(t for t in m.group(1).strip("'\"").split(",") if t)
        targets = processors(archs)
        if not targets:
            return command, ()
        stripped = command.lstrip()
        if not stripped.startswith(script):
            return command, ()
        return f"{script} --targets={','.join(targets)}{stripped[len(script) :]}", targets
    if _ARCHS_ENV.search(_script_text(script)):
        return command, processors(archs)
    return command, ()


def aiter_env(archs: tuple[str, ...], meta_dir: str | os.PathLike[str]) -> dict[str, str]:
    """The variables AITER's own build gives its generators (``aiter/jit/core.py`` at import):
    ``GPU_ARCHS`` (the targets, ``;``-separated: its ``chip_info`` reads them, else asks rocminfo,
    absent on build hosts), ``AITER_GPU_ARCHS`` (what ``chip_info.get_gfx_list`` exports: the same
    list, stripped, ``;``-joined; ``hsa/codegen.py`` reads it with ``os.environ[...]``) and
    ``AITER_ASM_DIR`` (``<meta>/hsa/``, with AITER's trailing slash). The generator stamp covers them.
    Also ``COLUMNS``/``LINES``, fixed: every generator's argparse looks them up (help text width), so
    a recorded generator reads them (qola.plan.genread); a terminal's size never changes what a
    generator writes, and taken from the caller's shell a resize would rerun generators and end
    no-op builds."""
    joined = ";".join(a.strip() for a in archs if a.strip())
    return {
        "GPU_ARCHS": joined,
        "AITER_GPU_ARCHS": joined,
        "AITER_ASM_DIR": f"{os.path.normpath(os.fspath(meta_dir))}/hsa/",
        "COLUMNS": "80",
        "LINES": "24",
    }


_FILE_ARCH = re.compile(r"_(gfx[0-9a-z]+)$")
_ARCHS = re.compile(r"_gfx[0-9a-z]+_gfx[0-9a-z]+$")  # a name naming several archs: serves each


def arch_suffix(stem: str) -> str | None:
    """The arch family a generated file is named for (``gfx9`` of ``fmha_fwd_d64_fp16_gfx9``), or None
    (no suffix, or several archs named: ``…_gfx90a_gfx942`` serves every arch)."""
    return None if _ARCHS.search(stem) else m.group(1) if (m := _FILE_ARCH.search(stem)) else None


def file_archs(stems: list[str], archs: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
    """Which of the plan's ``archs`` each generated file holds device code for. CK names a kernel
    file for its arch family (``…_gfx9``, ``…_gfx950``) and guards its body with that family's
    check, the more specific family excluded (``gfx9`` is ``__gfx9__ && !__gfx950__``): a file
    serves an arch its suffix prefixes unless a longer suffix of the same listing does too. A
    file without a suffix (the dispatch ``fmha_fwd_api``), or one naming several archs, serves every arch."""
    procs = processors(archs)
    suffixes = {x for s in stems if (x := arch_suffix(s))}
    best = {a: max((x for x in suffixes if a.startswith(x)), key=len, default=None) for a in procs}
    out = {}
    for stem in stems:
        x = arch_suffix(stem)
        out[stem] = procs if x is None else tuple(a for a in procs if best[a] == x)
    return out


def source_archs(sources: Sequence[str], archs: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
    """Each generated source -> the build ``archs`` (spelled as given, ``gfx942:xnack-`` kept) it is
    compiled for: those :func:`file_archs` finds it holds device code for (one ``--offload-arch`` pass
    each, the others' passes would compile a body preprocessed away). A file serving none of them (a
    ``_gfx950`` twin in a gfx942-only build) keeps every arch, as before: its host code (the launcher
    the dispatch calls) is still needed, and the passes cost what they did."""
    stems = [Path(s).stem for s in sources]
    served = file_archs(stems, archs)
    out: dict[str, tuple[str, ...]] = {}
    for src, stem in zip(sources, stems, strict=True):
        mine = tuple(a for a in archs if a.split(":")[0] in served[stem])
        out[src] = mine or tuple(archs)
    return out


def dispatch_stem(direction: str) -> str:
    """The stem of CK's dispatch file of ``direction`` (``fmha_fwd_splitkv_api``); it defines
    ``fmha_<direction>(traits, args, stream)``."""
    return f"fmha_{direction}_api"


def unused_dispatch(candidates: Mapping[str, str], texts: Mapping[str, str | None]) -> set[str]:
    """Which dispatch-only files of dropped directions (``candidates``: path -> direction) no code
    that stays calls. ``texts``: path -> text of every source the library would compile, the
    candidates' too (None: one that could not be read, taken to call every dispatch). A candidate
    that a kept one calls is kept. A name spelled as a call in a source counts (a declaration too):
    only a dispatch no source names is left out, so a miss can come only from a call hidden in a
    header or a macro (the link's ``--no-undefined`` then says so)."""
    if any(t is None for t in texts.values()):
        return set()
    calls = {p: re.compile(rf"\bfmha_{re.escape(d)}\s*(?:<[^<>;{{}}]*>\s*)?\(") for p, d in candidates.items()}
    unused = set(candidates)
    stays = [t for p, t in texts.items() if p not in unused and t is not None]
    while called := {p for p in unused if any(calls[p].search(t) for t in stays)}:
        unused -= called
        stays += [t for p in called if (t := texts.get(p))]
    return unused
