"""A filter qola writes for CK's backward generator selects exactly the instances it names, although
CK matches ``dot_do_o@convert_dq@dq_dk_dv`` per trait and some traits' companion kernel is matched but
never listed (AITER's CK: a deterministic ``maxq16`` tile's ``convert_dq``, ``b64x16``; TE's recorded
usage lost 16 gfx950 kernels that way). A CK-style bwd generator in a tree written here has the
same shape; ``qola plan --usage`` on it (qola.store.usage.apply) and on a variant narrowed by head size
(qola.plan.cknames.narrow) must list the named instances, and a set CK cannot write alone is refused."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from support.ck_tree import CK_DIR
from support.common import KERNELS, run_qola

from qola.plan import ckfilter
from qola.store.usage import fragment

# CK's bwd shape: per trait (tile, deterministic, 1d pad) one dq_dk_dv, dot_do_o and convert_dq
# kernel; the trait's three names must each pass their filter component; a maxq tile's convert_dq
# is disabled (matched, never listed nor written).
BWD = r"""
import argparse, fnmatch, itertools, pathlib, sys
p = argparse.ArgumentParser()
p.add_argument("-d", "--direction", default="bwd")
p.add_argument("-o", "--output_dir")
p.add_argument("-l", "--list_blobs")
p.add_argument("-f", "--filter", default="")
p.add_argument("--targets", default="gfx9")
a = p.parse_args()
comps = (a.filter or "*@*@*").split("@") + ["*"] * 3
files = {}
for h, (tile, bn0, maxq), det, pad in itertools.product(
    (64, 128), (("b64x128", 128, 0), ("b16x16", 16, 16)), "tf", ("npad", "ps")
):
    d = "deterministic" if det == "t" else "ndeterministic"
    dot = f"fmha_bwd_dot_do_o_d{h}_fp16_b64_batch_o2_{pad}"
    conv = f"fmha_bwd_convert_dq_d{h}_fp16_b64x{bn0 if det == 't' else 0}_batch_o2_{pad}_{d}"
    dq = f"fmha_bwd_d{h}_fp16_batch_{tile}_maxq{maxq}_nbias_nmask_ndropout_{d}"
    if not all(fnmatch.fnmatch(n, c) for n, c in zip((dot, conv, dq), comps)):
        continue
    for n in (dot, dq) + (() if maxq else (conv,)):
        files[n + "_gfx9.cpp"] = "// " + n + "\n"
files["fmha_bwd_api.cpp"] = "// api\n"
if a.list_blobs:
    pathlib.Path(a.list_blobs).write_text("".join(f"{a.output_dir or '.'}/{k}\n" for k in files))
    sys.exit(0)
out = pathlib.Path(a.output_dir)
out.mkdir(parents=True, exist_ok=True)
for k, v in files.items():
    (out / k).write_text(v)
"""


def tree(root: Path) -> Path:
    """The example tree with :data:`BWD` as CK's generator (beside ``codegen/ops``: CK's flavor)."""
    shutil.copytree(KERNELS, root, ignore=shutil.ignore_patterns("hsa", "__pycache__"))
    ck = root / CK_DIR
    (ck / "codegen" / "ops").mkdir(parents=True)
    (ck / "codegen" / "ops" / "__init__.py").write_text("")
    (ck / "generate.py").write_text(BWD)
    return root


def manifest(path: Path, extra: str = "") -> Path:
    path.write_text(
        '[qola]\nnamespace = "qk"\n[build]\narchitectures = ["gfx942"]\nmode = "cpp_itfs"\n'
        '\n[[modules]]\nname = "libck_bwd"\nsrcs = []\nis_python_module = false\n'
        f'blob_gen_cmd = ["{CK_DIR}/generate.py -d bwd --output_dir {{}}"]\n' + extra
    )
    return path


def files(proc_out: str) -> set[str]:
    """The kernel files the plan's generators write (their own listing under the plan's filter)."""
    gens = json.loads(proc_out)["modules"][0]["generators"]
    return {n for g in gens for n in g.get("files") or () if not n.endswith("_api")}


def plan(tmp: Path, *args: str, extra: str = "") -> tuple[int, str, str]:
    """``qola plan --json`` of module ``libck_bwd`` on the tree (``extra``: manifest text appended)."""
    root = tmp / "tree"
    if not root.exists():
        tree(root)
    m = manifest(tmp / "q.toml", extra)
    proc = run_qola("plan", "--json", "-m", str(m), "-a", str(root), *args, env={"XDG_CACHE_HOME": str(tmp / "c")})
    return proc.returncode, proc.stdout, proc.stderr


def test_the_example_generator_has_ck_s_shape(tmp_path: Path) -> None:
    rc, out, err = plan(tmp_path)
    assert rc == 0, err
    every = files(out)
    assert len(every) == 2 * (2 + 4 + 4)  # per head size: 2 dot_do_o, 2 tiles x 2 dq_dk_dv, 4 convert_dq
    assert "fmha_bwd_convert_dq_d128_fp16_b64x16_batch_o2_npad_deterministic_gfx9" not in every  # disabled


DET = [  # every kernel of the deterministic d128 traits: both tiles, both 1d pads
    "fmha_bwd_dot_do_o_d128_fp16_b64_batch_o2_npad_gfx9",
    "fmha_bwd_dot_do_o_d128_fp16_b64_batch_o2_ps_gfx9",
    "fmha_bwd_convert_dq_d128_fp16_b64x128_batch_o2_npad_deterministic_gfx9",
    "fmha_bwd_convert_dq_d128_fp16_b64x128_batch_o2_ps_deterministic_gfx9",
    "fmha_bwd_d128_fp16_batch_b64x128_maxq0_nbias_nmask_ndropout_deterministic_gfx9",
    "fmha_bwd_d128_fp16_batch_b16x16_maxq16_nbias_nmask_ndropout_deterministic_gfx9",
]


def test_usage_plans_exactly_the_named_traits_with_a_disabled_companion(tmp_path: Path) -> None:
    frag = tmp_path / "usage.toml"
    frag.write_text(fragment.render([("libck_bwd", n) for n in DET], None))
    rc, out, err = plan(tmp_path, "--usage", str(frag))
    assert rc == 0, err
    assert files(out) == set(DET)  # the maxq16 dq_dk_dv kernel too (its convert_dq is never listed)


def test_a_variant_narrowed_by_head_size_keeps_the_maxq_kernels(tmp_path: Path) -> None:
    rc, out, err = plan(tmp_path, extra="\n[[mha_bwd_variants]]\nhdim = 128\n")  # names kept exactly
    assert rc == 0, err
    d128 = files(out)
    assert set(DET) < d128 and len(d128) == 10 and all("_d128_" in n for n in d128)


def test_usage_naming_a_kernel_without_its_trait_is_refused(tmp_path: Path) -> None:
    frag = tmp_path / "usage.toml"  # the dq_dk_dv kernel alone: CK writes it only with its dot_do_o
    frag.write_text(fragment.render([("libck_bwd", DET[4])], None))
    rc, _, err = plan(tmp_path, "--usage", str(frag))
    assert rc == 2 and "Traceback" not in err
    assert "does not select what it names" in err and "1 named instance(s) not written" in err
    assert "name whole traits" in err


@pytest.mark.parametrize("name, comp, hit", [
    ("a_b", "a_*", True), ("a_b", "*|!a_b", False), ("a_c", "*|!a_b", True), ("a_b", "x|a_b", True),
    ("a_b", "!a_b", False),  # no "|": CK's own fnmatch, a literal "!"
])  # fmt: skip
def test_component_matching_is_the_shim_s(name: str, comp: str, hit: bool) -> None:
    assert ckfilter.matches(name, comp) is hit


def test_a_bwd_variant_on_an_option_the_companion_kernels_lack(tmp_path: Path) -> None:
    """``deterministic = true``: dot_do_o's names carry no deterministic token (CK writes it with the
    deterministic and the non-deterministic traits alike), so the option narrows dq_dk_dv and
    convert_dq only; it was refused as matching no instance (TE's deterministic backward on the sdist)."""
    rc, out, err = plan(tmp_path, extra="\n[[mha_bwd_variants]]\nhdim = 128\ndeterministic = true\n")
    assert rc == 0, err
    assert files(out) == set(DET)
    rc, out, err = plan(tmp_path, extra="\n[[mha_bwd_variants]]\nhdim = 128\ndeterministic = false\n")
    assert rc == 0, err
    got = files(out)
    assert got and not got & set(DET[2:]) and all("_deterministic" not in n for n in got), got
    assert {n for n in got if "dot_do_o" in n} == set(DET[:2])  # the same companions


def test_a_variant_naming_one_tile_gets_the_companions_ck_pairs_with_it(tmp_path: Path) -> None:
    """A ``name`` glob matching dq_dk_dv kernels only (TE's narrowed CI shape names one tile) leaves
    the companion kinds open: CK writes the ones the selected traits pair with, and the others the
    open filter passes are no loss (the maxq tile's convert_dq is never written at all). The check
    refused this as "named instance(s) not written" (bench/vs_aiter's slice A)."""
    rc, out, err = plan(tmp_path, extra='\n[[mha_bwd_variants]]\nhdim = 128\nname = "*_b16x16_*"\n')
    assert rc == 0, err
    assert files(out) == {
        "fmha_bwd_dot_do_o_d128_fp16_b64_batch_o2_npad_gfx9",
        "fmha_bwd_dot_do_o_d128_fp16_b64_batch_o2_ps_gfx9",
        "fmha_bwd_d128_fp16_batch_b16x16_maxq16_nbias_nmask_ndropout_deterministic_gfx9",
        "fmha_bwd_d128_fp16_batch_b16x16_maxq16_nbias_nmask_ndropout_ndeterministic_gfx9",
    }
