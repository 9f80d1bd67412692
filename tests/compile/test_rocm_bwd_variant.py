"""A narrowed backward variant on two archs, planned and built on the amd-aiter sdist (issue 51, "Done
when"): ``[[mha_bwd_variants]] dtype = ["bf16"], hdim = [128]`` for gfx942 and gfx950, the documented way
to build less. Its CK filter names every d128 bf16 backward kernel of both archs: about 200 KB, past
Linux's one-argument limit, and ``qola plan`` failed listing under it with "Argument list too long"
(before :mod:`qola.core.argfile`). A ``[usage]`` set of one trait narrows the build to one dq_dk_dv
kernel (its ``_gfx9`` and ``_gfx950`` files) with the ``dot_do_o``/``convert_dq`` kernels CK pairs it with
(CK writes a backward kernel only with them): the plan still checks the set against the variant's
listing, under the long filter, and the build compiles six CK files.

The listing cache is the test's own (``XDG_CACHE_HOME``), so the listing under the long filter runs in
every run; compiles go through the run's compile cache (tests/conftest.py) as every build's.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from support.common import run_qola
from support.libdata import kernels_by_arch
from support.rocm_aiter import ARCHS, NS, manifest

from qola.compile.elf import demangle, exported_symbols, object_symbols
from qola.core import argfile

pytestmark = [pytest.mark.rocm, pytest.mark.aiter, pytest.mark.slow, pytest.mark.ck]

NARROWED = 'dtype = ["bf16"]\nhdim = [128]\n'  # the variant, as docs/manifest.md spells it

# one group-mode trait: a group kernel pairs with one dot_do_o and one convert_dq kernel (a batch-mode
# npad kernel with two of each: ten CK files for two archs, not six)
DQ_DK_DV = (
    "fmha_bwd_d128_bf16_group_b16x128x128x16x128x16x32x128x128_r1x4x1_r4x1x1_r1x4x1_w16x16x32_w16x16x16"
    "_o1_maxq0_npad_nbias_ndbias_nmask_ndropout_ndeterministic_ntrload"
)
TRAIT = (
    DQ_DK_DV,
    "fmha_bwd_dot_do_o_d128_bf16_b64_group_o2_ps",
    "fmha_bwd_convert_dq_d128_bf16_b64x0_group_o2_ps_ndeterministic",
)
KINDS = ("FmhaBwdDQDKDV", "FmhaBwdOGradDotO", "FmhaBwdConvertQGrad")  # a kernel's type, in its device symbol
SUFFIX = {"gfx942": "gfx9", "gfx950": "gfx950"}  # CK's file per arch family
USAGE = (
    "[usage]\nvariants = [\n"
    + "".join(f'  {{ module = "libmha_bwd", name = "{n}_gfx950" }},\n' for n in TRAIT)  # a twin selects both
    + "]\n"
)


def _ck_generator(m: Path, tree: Path, env: dict[str, str]) -> dict[str, Any]:
    """``qola plan --json``'s entry for the module's CK backward generator."""
    proc = run_qola("plan", "--manifest", m, "--aiter-root", tree, "--json", env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    (mod,) = json.loads(proc.stdout)["modules"]
    (gen,) = [g for g in mod["generators"] if g["direction"] == "bwd"]
    return dict(gen)


def _plans(tmp: Path, tree: Path, env: dict[str, str]) -> tuple[Path, dict[str, Any]]:
    """Plan the set (first: the cold listings run here) and the variant alone; the set's manifest and plan."""
    one = _ck_generator(
        manifest(tmp / "one.toml", NS, fwd=False, bwd=True, bwd_variant=NARROWED, extra=USAGE), tree, env
    )
    wide = _ck_generator(manifest(tmp / "wide.toml", NS, fwd=False, bwd=True, bwd_variant=NARROWED), tree, env)
    # the variant's filter: every d128 bf16 kernel of both archs, past the one-argument limit (on a command
    # line, E2BIG: 'Argument list too long'): the first plan listed the generator under it, by file (the
    # second takes that listing from the test's listing cache)
    dq = [n for n in wide["files"] if n.startswith("fmha_bwd_d")]
    assert len(dq) > 500 and all("_d128_bf16_" in n for n in dq), len(dq)
    filt = wide["filter"]
    assert len(filt.encode()) > argfile.ONE_ARG_MAX and not argfile.fits(["--filter", filt]), len(filt)
    return tmp / "one.toml", one


def test_narrowed_bwd_variant_on_two_archs_plans_and_builds_one_kernel(aiter_root: Path, tmp_path: Path) -> None:
    env = {"XDG_CACHE_HOME": str(tmp_path / "xdg")}  # the listings run here, not from an earlier run's cache
    m, gen = _plans(tmp_path, aiter_root, env)
    # the plan lists what it will build: one dq_dk_dv kernel per arch, its two companions, the dispatch
    want = {f"{n}_{SUFFIX[a]}": [a] for n in TRAIT for a in ARCHS}
    assert gen["files"] == {"fmha_bwd_api": list(ARCHS), **want}, sorted(gen["files"])
    assert gen["targets"] == list(ARCHS)
    # at this narrowing the build's filter is short (about 11 KB): its generator run takes it on the
    # command line; the listing under the variant's filter (_plans) is what went by file
    assert argfile.fits(gen["run_argv"]), len(" ".join(gen["run_argv"]))

    out = tmp_path / "out"
    proc = run_qola("build", "--manifest", m, "--aiter-root", aiter_root, "-o", out, "-j", "2", env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    (mod,) = json.loads((out / "manifest.json").read_text())["modules"]
    assert mod["status"] == "built" and set(mod["instances"]["names"]) == {*gen["files"], "mha_bwd"}, mod
    lib = out / mod["artifact"]
    assert lib == out / "lib" / f"{NS}_libmha_bwd.so" and lib.is_file()
    _one_kernel_per_arch(lib)


def _one_kernel_per_arch(lib: Path) -> None:
    """The library's device code: per arch the one dq_dk_dv kernel (its 16x128x128 tile) and its two
    companions, nothing else; its host side: the kernel's entry for each arch, and qola's mha_bwd."""
    found = kernels_by_arch(lib)
    assert set(found) == set(ARCHS), sorted(found)
    for arch in ARCHS:
        kinds = [kind for k in found[arch] for kind in KINDS if f"{kind}Kernel" in k]
        assert sorted(kinds) == sorted(KINDS) and len(found[arch]) == 3, sorted(found[arch])
        (dq,) = [k for k in found[arch] if "FmhaBwdDQDKDVKernel" in k]
        assert f"kentryINS_{len(SUFFIX[arch]) + 2}{SUFFIX[arch]}_t" in dq and "Li16ELi128ELi128ELi16ELi128E" in dq, dq
    syms = object_symbols(lib, [b"fmha_bwd_dq_dk_dv_oneshot_"])
    assert syms is not None
    entries = [d for d in demangle(sorted(syms.defined)) if d.startswith("void fmha_bwd_dq_dk_dv_oneshot_<")]
    assert len(entries) == 2 and all("fmha_bwd_dq_dk_dv_traits_<128, FmhaBwdBf16, true" in e for e in entries), entries
    assert {m[1] for e in entries if (m := re.search(r"ck_tile::(gfx\w+_t)>\(", e))} == {"gfx9_t", "gfx950_t"}, entries
    assert any(s.demangled.startswith(f"qola::{NS}::mha_bwd(") for s in exported_symbols(lib))
