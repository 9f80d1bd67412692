"""The resolver on the real AITER tree (amd-aiter sdist): every module resolves, statically."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from support.common import REPO, run_qola

from qola.plan.manifest import parse
from qola.plan.planner import PlanInputs, make_plan
from qola.plan.tree.aiter import expression_names, load_table, open_tree, resolve_entry

pytestmark = pytest.mark.aiter


def test_installed_layout_detected(aiter_root: Path) -> None:
    tree = open_tree(aiter_root)
    assert tree.layout == "installed"
    assert tree.meta_dir == aiter_root / "aiter_meta"
    assert (tree.csrc / "include").is_dir()


def test_every_module_resolves_without_importing_aiter(aiter_root: Path) -> None:
    tree = open_tree(aiter_root)
    table = load_table(tree)
    names = expression_names(tree, archs=("gfx942", "gfx950"), env={}, hip_version="7.2.0")
    resolved = {key: resolve_entry(key, raw, names) for key, raw in table.items()}
    assert len(resolved) == len(table) >= 60
    assert "aiter" not in sys.modules and "torch" not in sys.modules
    for key, entry in resolved.items():
        for s in entry["srcs"]:
            assert isinstance(s, str) and not s.startswith("f'"), (key, s)
    # the config-file names core.py defines (module-level get_config_file calls here), read statically
    assert names["AITER_CONFIG_GEMM_A8W8_FILE"].endswith("/aiter/configs/a8w8_tuned_gemm.csv")


def test_libmha_fwd_matches_table(aiter_root: Path) -> None:
    tree = open_tree(aiter_root)
    raw = json.loads((aiter_root / "aiter/jit/optCompilerConfig.json").read_text())["libmha_fwd"]
    manifest = parse('[qola]\nnamespace = "te"\n[[modules]]\nname = "libmha_fwd"\n', "m.toml")
    plan = make_plan(manifest, tree, PlanInputs(archs=("gfx950",), env={}, hip_version="7.2.0"))
    mod = plan.modules[0]
    meta = str(tree.meta_dir)
    ck = f"{meta}/3rdparty/composable_kernel"
    assert mod.md_name == "te_libmha_fwd"
    # sources: the table's (empty for libmha_fwd: everything is generated)
    assert list(mod.sources) == [e.strip("f'").replace("{AITER_CSRC_DIR}", f"{meta}/csrc") for e in raw["srcs"]]
    assert f"{ck}/example/ck_tile/01_fmha" in mod.include_dirs
    assert mod.flags_extra_hip == (
        "-DCK_TILE_FMHA_FWD_FAST_EXP2=1",
        "-DCK_TILE_FLOAT_TO_BFLOAT16_DEFAULT=2",
        "-DCK_TILE_FMHA_FWD_SPLITKV_API=1",
    )
    assert [g.command.split()[0] for g in mod.generators] == [
        f"{ck}/example/ck_tile/01_fmha/generate.py",
        f"{ck}/example/ck_tile/01_fmha/generate.py",
        f"{ck}/example/ck_tile/01_fmha/generate.py",
        f"{meta}/csrc/cpp_itfs/mha_fwd_generate.py",
        f"{meta}/hsa/gfx950//fmha_v3_fwd/codegen.py",
    ]
    assert mod.torch_exclude is True and mod.is_python_module is False


def test_te_manifest_plan_receipt_and_directions(aiter_root: Path, tmp_path: Path) -> None:
    m = tmp_path / "te.toml"
    m.write_text(
        '[qola]\nnamespace = "te"\n[build]\narchitectures = ["gfx950"]\nmode = "cpp_itfs"\n'
        '[[modules]]\nname = "libmha_fwd"\nreceipt = 700\ndrop_directions = ["fwd_splitkv", "batch_prefill"]\n'
    )
    proc = run_qola("plan", "--manifest", str(m), "--aiter-root", str(aiter_root), "--json")
    assert proc.returncode == 0, proc.stderr
    assert "not a git checkout" in proc.stderr and proc.stderr.count("not a git checkout") == 1
    mod = json.loads(proc.stdout)["modules"][0]
    by_dir = {g["direction"]: g for g in mod["generators"]}
    # a dropped direction writes its dispatch alone (AITER's mha_fwd.cpp calls it): a filter no kernel matches
    assert by_dir["fwd_splitkv"]["dispatch_only"] and by_dir["batch_prefill"]["dispatch_only"]
    assert by_dir["fwd_splitkv"]["filter"] == "qola_no_kernel@qola_no_kernel"
    assert by_dir["batch_prefill"]["run_argv"][-2:] == ["--filter", "qola_no_kernel"]
    assert not by_dir["fwd"]["dispatch_only"]
    fwd = by_dir["fwd"]
    assert "--receipt 700" in fwd["command"] and fwd["receipt"] == "700"
    api = next(g for g in mod["generators"] if "mha_fwd_generate.py" in g["command"])
    assert "--receipt 5" in api["command"]  # only direction-taking (kernel) generators are rewritten


def test_dropped_direction_generates_a_dispatch_that_finds_no_kernel(aiter_root: Path, tmp_path: Path) -> None:
    """The dispatch-only run of a dropped direction: CK writes fmha_fwd_splitkv_api.cpp and no kernel file,
    and its fmha_fwd_splitkv() returns -1 ("no kernel"), so AITER's mha_fwd_splitkv links and says so."""
    from qola.compile.codegen import GenJob, run_generators

    m = tmp_path / "te.toml"
    m.write_text(
        '[qola]\nnamespace = "te"\n[build]\narchitectures = ["gfx942", "gfx950"]\nmode = "cpp_itfs"\n'
        '[[modules]]\nname = "libmha_fwd"\nreceipt = 700\ndrop_directions = ["fwd_splitkv", "batch_prefill"]\n'
    )
    plan = make_plan(
        parse(m.read_text(), str(m)),
        open_tree(aiter_root),
        PlanInputs(archs=("gfx942", "gfx950"), env={}, hip_version="6.4"),
    )
    gens = tuple(g for g in plan.modules[0].generators if g.dispatch_only)
    assert {g.direction for g in gens} == {"fwd_splitkv", "batch_prefill"}
    res = run_generators(
        GenJob("libmha_fwd", gens), tmp_path / "gen", env={"PATH": os.environ["PATH"], "GPU_ARCHS": "gfx942;gfx950"}
    )
    names = sorted(Path(p).name for p in res.sources)
    assert names == ["fmha_batch_prefill_api.cpp", "fmha_fwd_splitkv_api.cpp"], names
    text = (tmp_path / "gen" / "libmha_fwd" / "blob" / "fmha_fwd_splitkv_api.cpp").read_text()
    body = text[text.index("float fmha_fwd_splitkv(fmha_fwd_splitkv_traits") :]
    assert "float r = -1;" in body and "fmha_fwd_splitkv_<" not in body


def test_unknown_module_names_nearest(aiter_root: Path, tmp_path: Path) -> None:
    m = tmp_path / "m.toml"
    m.write_text('[build]\narchitectures = ["gfx950"]\n[[modules]]\nname = "libmha_fwdd"\n')
    proc = run_qola("plan", "--manifest", str(m), "--aiter-root", str(aiter_root))
    assert proc.returncode == 2
    assert "module 'libmha_fwdd' is not in the tree's module table" in proc.stderr
    assert "nearest table keys: libmha_fwd" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_dry_run_te_manifest_writes_graph_with_aiters_flags(aiter_root: Path, tmp_path: Path) -> None:
    """`qola build --dry-run` plans the TE build (TE's manifest, for gfx950; ROCm 7.2) even where that
    toolchain is absent."""
    repo = REPO
    out = tmp_path / "out"
    proc = run_qola(
        "build",
        "--manifest",
        str(repo / "examples/te-manifest.toml"),
        "--aiter-root",
        str(aiter_root),
        "-o",
        str(out),
        "--build-dir",
        str(tmp_path / "b"),
        "--dry-run",
        "--arch",  # TE's manifest says gfx950 and gfx942: one is enough for the flags and targets checked
        "gfx950",
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert not out.exists()
    graph = (tmp_path / "b" / "build.ninja").read_text().replace("$\n", "")
    for target in ("module_libmha_fwd", "module_libmha_bwd", "lib/te_libmha_fwd.so", "lib/te_libmha_bwd.so"):
        assert target in graph
    flat = " ".join(graph.split())
    for flag in (
        "--offload-arch=gfx950",
        "-DCK_TILE_FMHA_FWD_FAST_EXP2=1",
        "-D__HIP_PLATFORM_AMD__=1",
        "--amdgpu-kernarg-preload-count=16",
        "-fgpu-flush-denormals-to-zero",
        "-std=c++20",
        "-Wl,--version-script=",
    ):
        assert flag in flat, flag
    assert graph.count(" cc ") > 1000  # thousands of CK instances (variant-filtered), one graph
    assert "qola_embedded_libmha_fwd" in graph  # fmha_v3 code objects embedded


@pytest.mark.parametrize("name,kind", [("libmha_fwd", "fmha_v3_fwd"), ("libmha_bwd", "fmha_v3_bwd")])
def test_asm_generators_run_once_per_target_arch(aiter_root: Path, name: str, kind: str) -> None:
    """AITER's API generators dispatch to <gfx>::fmha_*_v3 for every arch of GPU_ARCHS, while its table
    names one arch's asm generator (get_asm_dir(): the last): a two-arch build needs both, or the
    library references gfx942::fmha_*_v3 and never defines it."""
    tree = open_tree(aiter_root)
    manifest = parse(f'[qola]\nnamespace = "te"\n[[modules]]\nname = "{name}"\n', "m.toml")

    def asm(archs: tuple[str, ...]) -> list[str]:
        gens = make_plan(manifest, tree, PlanInputs(archs=archs, env={}, hip_version="6.4")).modules[0].generators
        return [g.command.split()[0] for g in gens if "/hsa/" in g.command]

    meta = str(tree.meta_dir)
    assert asm(("gfx942", "gfx950")) == [
        f"{meta}/hsa/gfx942//{kind}/codegen.py",
        f"{meta}/hsa/gfx950//{kind}/codegen.py",
    ]
    assert asm(("gfx950",)) == [f"{meta}/hsa/gfx950//{kind}/codegen.py"]  # one arch: the table's command as is
