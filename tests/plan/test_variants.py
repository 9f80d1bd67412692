"""Issue 4: variant matrices → generator filters (example tree, real AITER/CK tree, errors)."""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from support.common import EXAMPLES, KERNELS, run_qola
from support.example_variants import EXAMPLE_VARIANTS, expected_example, list_example
from support.te_example import NARROW, te_manifest

from qola.commands.common import prepare
from qola.core.errors import QolaError
from qola.plan import manifest as mf
from qola.plan import receipts
from qola.plan import variants as V
from qola.plan.cknames import parse_options
from qola.plan.listing import GeneratorEnv
from qola.plan.manifest import parse
from qola.plan.model import Generator


def example_manifest(
    path: Path, variants: str = EXAMPLE_VARIANTS, modules: tuple[str, ...] = ("module_attn_fwd",)
) -> Path:
    mods = "".join(f'\n[[modules]]\nname = "{m}"\n' for m in modules)
    path.write_text(
        f'[qola]\nnamespace = "qk"\n\n[build]\narchitectures = ["sm_90"]\nmode = "pybind"\n{mods}' + variants
    )
    return path


def test_expand_is_a_deduplicated_product() -> None:
    got = V.expand({"dtype": ["bf16", "fp16", "bf16"], "has_lse": True, "has_mask": None, "x": [1, True]})
    assert got == [
        {"dtype": "bf16", "has_lse": True, "x": 1},
        {"dtype": "bf16", "has_lse": True, "x": True},
        {"dtype": "fp16", "has_lse": True, "x": 1},
        {"dtype": "fp16", "has_lse": True, "x": True},
    ]
    assert V.expand({}) == [{}]


def test_example_filters_select_exactly_the_declared_set(tmp_path: Path) -> None:
    m = example_manifest(tmp_path / "q.toml")
    proc = run_qola("variants", "-m", str(m), "--aiter-root", str(KERNELS), "--json", check=True)
    data = json.loads(proc.stdout)
    rows = data["variants"]
    assert [r["options"] for r in rows] == [
        {"dtype": "fp16", "hdim": 128, "mask": True},
        {"dtype": "bf16", "lse": False},
    ]
    assert rows[0]["filter"] == "attn_fwd_d128_fp16_*_mask_*" and rows[1]["filter"] == "attn_fwd_d*_bf16_*_*_nlse"
    want = expected_example()
    assert len(want) == 12
    assert set(rows[0]["instances"]) | set(rows[1]["instances"]) == want
    tot = data["totals"]["module_attn_fwd"]["fwd"]
    assert tot["unfiltered"] == 48 and tot["selected"] == 12
    # the generator run with the combined filter (what qola build passes) writes exactly that set
    assert list_example(tot["filter"]) == want
    # and the library call the build uses gives the same argv
    prep = prepare(
        argparse.Namespace(manifest=str(m), aiter_root=str(KERNELS), archs=None, mode=None, allow_unpinned=False),
        dict(os.environ),
    )
    plan = V.apply(prep.plan, prep.manifest, dict(os.environ))
    (gen,) = plan.modules[0].generators
    assert gen.filter == tot["filter"] and gen.run_argv[-2:] == ["--filter", tot["filter"]]
    assert gen.wrapper is None  # the example generator takes ',' any-of itself: no wrapper
    assert gen.argv == prep.plan.modules[0].generators[0].argv  # the command itself is unchanged
    assert V.apply(plan, prep.manifest, dict(os.environ)) == plan  # applying again changes nothing
    assert mf.load(m).variants[0].options["hdim"] == 128


def test_table_output(tmp_path: Path) -> None:
    proc = run_qola(
        "variants",
        "-m",
        str(example_manifest(tmp_path / "q.toml")),
        "--aiter-root",
        str(KERNELS),
        check=True,
        env={"COLUMNS": "200"},
    )
    assert "module_attn_fwd" in proc.stdout and "48" in proc.stdout and "12" in proc.stdout


@pytest.mark.parametrize(
    "variants, message",
    [
        (
            '[[variants]]\nmodule = "module_attn_fwd"\npattern = "attn_fwd_*_{mask}_*"\noptions = {mask = "maybe"}\n'
            + 'tokens = {mask = {true = "mask", false = "nmask"}}\n',
            "'maybe' is not in its option space",
        ),
        (
            '[[variants]]\nmodule = "module_attn_fwd"\npattern = "attn_fwd_d{hdim}_*"\noptions = {hdim = [128, 96]}\n',
            "variants[0] {hdim=96}: pattern 'attn_fwd_d96_*' matches no instance",
        ),
        (
            '[[variants]]\nmodule = "module_softmax"\npattern = "*"\n',
            "module 'module_softmax' is not built by this manifest",
        ),
        ('[[mha_fwd_variants]]\nmodule = "nope"\ndtype = "fp16"\n', "module 'nope' is not built by this manifest"),
        ('[[mha_fwd_variants]]\ndtype = "fp16"\n', "runs CK's fMHA fwd generator"),
    ],
)
def test_user_errors_exit_2_without_traceback(tmp_path: Path, variants: str, message: str) -> None:
    proc = run_qola(
        "variants", "-m", str(example_manifest(tmp_path / "q.toml", variants)), "--aiter-root", str(KERNELS)
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert message in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.slow
@pytest.mark.skipif(not shutil.which("nvcc"), reason="needs nvcc")
def test_build_compiles_only_the_declared_instances(tmp_path: Path) -> None:
    tree = tmp_path / "kernels"
    shutil.copytree(KERNELS, tree, ignore=shutil.ignore_patterns("hsa"))
    # the same two variants for the pybind module and for the torch-free cpp_itfs library
    both = EXAMPLE_VARIANTS + EXAMPLE_VARIANTS.replace('module = "module_attn_fwd"', 'module = "libattn_fwd"')
    m = example_manifest(tmp_path / "q.toml", both, modules=("module_attn_fwd",))
    m.write_text(
        m.read_text().replace(
            'name = "module_attn_fwd"\n',
            'name = "module_attn_fwd"\n\n[[modules]]\nname = "libattn_fwd"\nmode = "cpp_itfs"\n',
            1,
        )
    )
    out = tmp_path / "out"
    proc = run_qola("build", "--manifest", str(m), "--aiter-root", str(tree), "-o", str(out), "-j", "2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads((out / "manifest.json").read_text())
    for name in ("module_attn_fwd", "libattn_fwd"):
        mod = next(x for x in data["modules"] if x["name"] == name)
        assert mod["status"] == "built"
        assert set(mod["instances"]["names"]) == expected_example() | {"attn_fwd_api"}
        objs = {p.name.rsplit("-", 1)[0] for p in (tmp_path / "out.build" / "obj" / name).glob("*.o")}
        assert {o for o in objs if o.startswith("attn_fwd_d")} == expected_example()  # compiled: exactly those


# ------------------------------------------------------------------------------------------- real AITER tree


def _declared(fam: str) -> list[dict[str, Any]]:
    man = parse(NARROW, "narrow.toml")
    secs = man.mha_fwd_variants if fam == "fwd" else man.mha_bwd_variants
    return [v for s in secs for v in V.expand(s.model_dump(exclude={"module"}))]


def _ok(name: str, fam: str, variants: list[dict[str, Any]]) -> bool:
    """Parse a kernel name back into the options it states; an option it does not state is 'absent'."""
    stated = parse_options(V.kernel_name(name, "ck"), fam)
    return any(all(stated.get(k, False if k != "dtype" else want) == want for k, want in v.items()) for v in variants)


def _in_700(name: str, fam: str) -> bool:
    """Receipt 700's selection, which qola applies on this CK (it lacks the receipt; issue 31)."""
    rule = receipts.RULES[fam]
    toks = V.kernel_name(name, "ck").split("_")
    return not set(rule.tokens) & set(toks) and _ok(name, fam, V.expand(dict(rule.options)))


@pytest.mark.aiter
def test_te_manifest_counts_and_exact_selection(aiter_root: Path, tmp_path: Path) -> None:
    m = te_manifest(tmp_path / "te.toml", NARROW)
    proc = run_qola("variants", "-m", str(m), "--aiter-root", str(aiter_root), "--allow-unpinned", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    te_report = json.loads(proc.stdout)
    tot = te_report["totals"]
    fwd, bwd = tot["libmha_fwd"]["fwd"], tot["libmha_bwd"]["bwd"]
    assert 0 < fwd["selected"] < fwd["unfiltered"] and 0 < bwd["selected"] < bwd["unfiltered"]
    full = {}
    # the listing under the plan's view (its archs' variables, the tree by place): the one `qola variants`
    # ran, taken from the listing cache (a plain environment would key, and run, a listing of its own)
    args = argparse.Namespace(manifest=str(m), aiter_root=str(aiter_root), archs=None, mode=None, allow_unpinned=True)
    genv = GeneratorEnv.of(dict(os.environ)).for_plan(prepare(args, dict(os.environ)).plan)
    for mod, fam in (("libmha_fwd", "fwd"), ("libmha_bwd", "bwd")):
        gen = Generator(tot[mod][fam]["command"], fam)
        full[fam] = [n for n in V.list_blobs(gen, genv) if not V.is_api(n)]
        rows = [r for r in te_report["variants"] if r["module"] == mod]
        selected = set(itertools.chain.from_iterable(r["instances"] for r in rows))
        declared = _declared(fam)
        assert all(_ok(n, fam, declared) and _in_700(n, fam) for n in selected)  # nothing undeclared
        assert {n for n in full[fam] if _ok(n, fam, declared) and _in_700(n, fam)} == selected  # no misses
        assert len(selected) == tot[mod][fam]["selected"]
        for r in rows:  # each variant on its own: its instances state its options
            assert r["instances"] and all(_ok(n, fam, [r["options"]]) for n in r["instances"])


@pytest.mark.aiter
@pytest.mark.parametrize(
    "section, message",
    [
        ('[[mha_fwd_variants]]\ndtype = "fp64"\n', "mha_fwd_variants[0].dtype: 'fp64' is not a value"),
        ("[[mha_bwd_variants]]\nhas_bias = true\nhas_alibi = true\n", "matches no instance"),
        ("[[mha_fwd_variants]]\nhas_sink = true\n", "matches no instance"),
        ('[[mha_bwd_variants]]\nmodule = "libmha_fwd"\n', "no module libmha_fwd in the plan runs CK's fMHA bwd"),
    ],
)
def test_ck_user_errors(tmp_path: Path, aiter_root: Path, section: str, message: str) -> None:
    m = te_manifest(tmp_path / "te.toml", section)
    proc = run_qola("variants", "-m", str(m), "--aiter-root", str(aiter_root), "--allow-unpinned")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert message in proc.stderr and "Traceback" not in proc.stderr


def test_no_variants_says_so_plainly() -> None:
    """Issue 32 item 7: a manifest without variants gets one plain sentence, not an empty table."""
    proc = run_qola("variants", "-m", str(EXAMPLES / "quickstart.toml"), "-a", str(KERNELS))
    assert proc.returncode == 0, proc.stderr
    assert "declares no variants" in proc.stdout and "━" not in proc.stdout and "─" not in proc.stdout


# ---- bounds on the variant matrices (issue 23 item 5, moved from test_hostile_inputs.py) ----


def test_mha_variant_and_total_bounds() -> None:
    hdims = ", ".join(str(h) for h in range(1, 41))
    dts = ", ".join(f'"t{i}"' for i in range(40))
    with pytest.raises(QolaError, match="expands to 1,600 variants"):
        parse(f"[[mha_fwd_variants]]\nhdim = [{hdims}]\ndtype = [{dts}]\n", "m.toml")
    many = "".join(f"[[mha_bwd_variants]]\nhdim = [{', '.join(str(h) for h in range(1, 1001))}]\n" for _ in range(5))
    with pytest.raises(QolaError, match="5,000 variants together; at most 4,096"):
        parse(many, "m.toml")
    ok = parse("[[mha_fwd_variants]]\nhas_lse = [true, false]\nname = [" + ", ".join(['"a*"'] * 2000) + "]\n", "m")
    assert ok.mha_fwd_variants[0].count() == 2  # name globs are any-of, not a product


def test_expand_computes_the_product_before_expanding() -> None:
    from qola.plan.variants import expand

    with pytest.raises(QolaError, match="3,125 variants"):
        expand({f"o{i}": list(range(5)) for i in range(5)})
    assert len(expand({"a": [1, 2], "b": [True, False, True]})) == 4
