"""qola's static resolution of AITER 33f2e6af equals AITER's own evaluation, module by module.

The oracle (tests/support/aiter_oracle.py) imports the tree's ``aiter/jit/core.py`` in a subprocess and
runs ``get_args_of_build`` for every module and every ``AITER_CONFIGS`` property; qola resolves
the same tree copy without importing or evaluating anything. AITER writes merged tuned configs
to ``/tmp/aiter_configs/``; the test's copy of core.py writes them to a temp dir instead, and
qola's ``{qola_configs}/<stem>.csv`` maps to that dir. Merged files are compared row by row as
pandas parses them (AITER's own reader), as multisets: the order of rows with equal ``us``
differs (pandas' sort is not stable, and AITER merges model files in directory order).
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from support.common import REPO, run_qola

from qola.plan.manifest import parse
from qola.plan.planner import make_plan
from qola.plan.tree.aiter import load_table, namespace, open_tree, resolve_entry
from qola.plan.tree.aiter_configs import CONFIGS_TOKEN, MergedConfig, merge, render

pytestmark = pytest.mark.aiter
pd = pytest.importorskip("pandas")  # AITER's merge is pandas: the oracle needs it

TARBALL = REPO.parent / "shared/aiter-trees/aiter-33f2e6af-slim.tar.gz"
ORACLE = Path(__file__).resolve().parents[1] / "support" / "aiter_oracle.py"
ARCHS = ("gfx942", "gfx950")
HIP = "7.2.0"
AITER_TMP = '"/tmp/aiter_configs/"'  # the one place core.py writes merged configs
LIST_KEYS = ("srcs", "flags_extra_cc", "flags_extra_hip", "extra_include", "blob_gen_cmd")
KEYS = LIST_KEYS + (
    "md_name",
    "torch_exclude",
    "is_python_module",
    "is_standalone",
    "extra_ldflags",
    "hip_clang_path",
    "verbose",
)


def _unpack(dest: Path) -> Path:
    if not TARBALL.is_file():
        pytest.skip(f"{TARBALL} is absent (shared/ beside the checkout)")
    with tarfile.open(TARBALL) as tf:
        tf.extractall(dest, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    root = dest / "aiter-33f2e6af"
    core = root / "aiter/jit/core.py"
    text = core.read_text()
    assert text.count(AITER_TMP) == 1, "core.py no longer writes merged configs where the test expects"
    core.write_text(text.replace(AITER_TMP, repr(str(dest / "aiter_configs") + "/")))
    return root


@pytest.fixture(scope="module")
def tree33(tmp_path_factory) -> Path:
    return _unpack(tmp_path_factory.mktemp("aiter33"))


def run_oracle(root: Path, env_extra: dict[str, str] | None = None) -> dict:
    """AITER's evaluation of ``root`` (merged configs land in ``root.parent / "aiter_configs"``)."""
    shutil.rmtree(root.parent / "aiter_configs", ignore_errors=True)
    out = root.parent / "oracle.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AITER_")}
    env.update({"GPU_ARCHS": ";".join(ARCHS), **(env_extra or {})})
    proc = subprocess.run(
        [sys.executable, str(ORACLE), str(root), str(out), HIP], capture_output=True, text=True, env=env, timeout=600
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text())


def _aiter_form(field: str, value, configs_dir: Path):
    """qola's value as AITER writes it: its merged-config dir, and "" / a string for one-item lists."""
    if isinstance(value, str):
        return value.replace(CONFIGS_TOKEN, str(configs_dir))
    if isinstance(value, list):
        return [_aiter_form(field, v, configs_dir) for v in value]
    return value


def _as_list(value):
    return [] if value in (None, "") else [value] if isinstance(value, str) else list(value)


def entry_diffs(root: Path, oracle: dict, env: dict[str, str]) -> list[str]:
    tree = open_tree(root)
    names = namespace(tree, archs=ARCHS, env=env, hip_version=HIP).names
    diffs = []
    for name, raw in load_table(tree).items():
        mine, theirs = resolve_entry(name, raw, names), oracle["modules"][name]
        for key in KEYS:
            a, b = _aiter_form(key, mine[key], root.parent / "aiter_configs"), theirs[key]
            if key in LIST_KEYS:
                a, b = _as_list(a), _as_list(b)
            if a != b:
                diffs.append(f"{name}.{key}: qola {a!r} != AITER {b!r}")
    return diffs


def _rows(text_or_path) -> tuple[list[str], list[str]]:
    df = pd.read_csv(io.StringIO(text_or_path) if isinstance(text_or_path, str) else text_or_path)
    return list(df.columns), sorted(map(repr, df.astype(str).itertuples(index=False, name=None)))


def config_diffs(root: Path, oracle: dict, env: dict[str, str]) -> tuple[list[str], int]:
    """Every AITER_CONFIGS property: the same path, and for merged files the same rows."""
    space = namespace(open_tree(root), archs=ARCHS, env=env, hip_version=HIP)
    configs_dir = root.parent / "aiter_configs"
    diffs, merged = [], 0
    assert oracle["configs"], "the oracle found no AITER_CONFIGS properties"
    for qualified, theirs in oracle["configs"].items():
        owner, prop = qualified.split(".")
        mine = space.names[owner].attrs.get(prop)
        if mine is None:
            diffs.append(f"{qualified}: unknown to qola")
            continue
        if _aiter_form("", mine, configs_dir) != theirs:
            diffs.append(f"{qualified}: qola {mine!r} != AITER {theirs!r}")
            continue
        if mine.startswith(CONFIGS_TOKEN):
            merged += 1
            cfg: MergedConfig = space.merges[mine]
            (cols_a, rows_a), (cols_b, rows_b) = _rows(render(merge(cfg))), _rows(Path(theirs))
            assert rows_b, f"AITER's {theirs} has no rows: nothing compared"
            if cols_a != cols_b:
                diffs.append(f"{qualified}: columns {cols_a} != AITER's {cols_b}")
            elif rows_a != rows_b:
                only_a, only_b = set(rows_a) - set(rows_b), set(rows_b) - set(rows_a)
                diffs.append(
                    f"{qualified}: {len(rows_a)} rows vs AITER's {len(rows_b)}; only qola: "
                    f"{sorted(only_a)[:3]}, only AITER: {sorted(only_b)[:3]}"
                )
    return diffs, merged


def test_every_module_resolves_as_aiter_does(tree33):
    oracle = run_oracle(tree33)
    assert len(oracle["modules"]) == 82
    assert entry_diffs(tree33, oracle, {}) == []
    diffs, merged = config_diffs(tree33, oracle, {})
    assert diffs == []
    assert merged == 5  # model_configs/ gives five of the nine configs per-model rows


def test_plan_of_every_module_matches_aiters_build_args(tree33):
    """The plan (what the build uses) of all 82 modules: sources as AITER expands them, flags,
    generator commands, md_name and the link kinds."""
    oracle = run_oracle(tree33)
    table = load_table(open_tree(tree33))
    manifest = parse('[qola]\nnamespace = "t"\n' + "".join(f'[[modules]]\nname = "{k}"\n' for k in table), "m.toml")
    plan = make_plan(manifest, open_tree(tree33), archs=ARCHS, env={}, hip_version=HIP)
    assert len(plan.modules) == 82
    configs_dir = tree33.parent / "aiter_configs"
    for mod in plan.modules:
        theirs = oracle["modules"][mod.name]
        srcs = [s for s in theirs["srcs"] if os.path.exists(s)]  # AITER skips what does not exist
        expanded = {
            str(Path(d) / f)
            for d in srcs
            if os.path.isdir(d)
            for f in os.listdir(d)
            if f.endswith((".cpp", ".cu")) and not os.path.isdir(Path(d) / f)
        }
        expanded |= {s for s in srcs if not os.path.isdir(s) and s.endswith((".cpp", ".cu"))}
        assert set(mod.sources) == expanded, mod.name
        # qola's one addition: CK's --targets=<archs> (QoLA patches AITER to pass it too), where CK takes it
        ours = [g.command.replace(f" --targets={','.join(ARCHS)}", "") for g in mod.generators]
        assert all(g.targets == ARCHS for g in mod.generators if "--targets=" in g.command), mod.name
        assert [_aiter_form("", c, configs_dir) for c in ours] == [
            c for c in _as_list(theirs["blob_gen_cmd"]) if c.strip()
        ], mod.name
        assert list(mod.flags_extra_hip) == [f for f in theirs["flags_extra_hip"] if f.strip()], mod.name
        assert list(mod.flags_extra_cc) == [f for f in theirs["flags_extra_cc"] if f.strip()], mod.name
        assert mod.md_name == f"t_{theirs['md_name'] or mod.name}"
        assert (mod.torch_exclude, mod.is_python_module, mod.is_standalone) == (
            theirs["torch_exclude"],
            theirs["is_python_module"],
            theirs["is_standalone"],
        ), mod.name
        assert mod.hip_clang_path == (theirs["hip_clang_path"] or None)
        assert (
            list(mod.include_dirs[-len(theirs["extra_include"]) :] if theirs["extra_include"] else [])
            == theirs["extra_include"]
        ), mod.name
        assert {c.path for c in mod.configs} == {
            c for g in mod.generators for c in g.argv if c.startswith(CONFIGS_TOKEN)
        }, mod.name
    with_merges = [m.name for m in plan.modules if m.configs]
    assert len(with_merges) == 6, with_merges  # blockscale, bpreshuffle, blockscale_bpreshuffle (+ cktile)


def _write_csv(path: Path, rows: list[str]) -> str:
    path.write_text("\n".join(rows) + "\n")
    return str(path)


def test_env_override_merges_two_files(tree33, tmp_path):
    """AITER_CONFIG_GEMM_A8W8=a.csv:b.csv merges the two (b overrides a's slower rows; _tag kept)."""
    head = "cu_num,M,N,K,q_dtype_w,kernelId,splitK,us,kernelName,tflops,bw,errRatio"
    a = _write_csv(
        tmp_path / "a.csv",
        [
            head,
            "80,1,1280,8192,torch.int8,34,0,20.5,k1,1.0,510.5,0.0",
            "80,2,1280,8192,torch.int8,34,0,30.0,k1,1.0,510.5,0.0",
            "256,1,1280,8192,torch.int8,3,0,10.0,k9,1.0,5.5,0.0",
        ],
    )
    b = _write_csv(
        tmp_path / "b.csv",
        [
            head + ",_tag",
            "80,1,1280,8192,torch.int8,7,0,11.25,k2,2.0,600,0.0,",
            "80,2,1280,8192,torch.int8,7,0,99.0,k2,2.0,600,0.0,",
            "80,2,1280,8192,torch.int8,8,0,5.0,k3,2.0,600,0.0,ds",
            "80,4,64,64,torch.int8,1,1,1.5,k4,0.1,1,0.0,",
        ],
    )
    env = {"AITER_CONFIG_GEMM_A8W8": f"{a}:{b}:{tmp_path / 'absent.csv'}"}
    oracle = run_oracle(tree33, env)
    assert entry_diffs(tree33, oracle, env) == []
    diffs, merged = config_diffs(tree33, oracle, env)
    assert diffs == [] and merged == 6
    tree = open_tree(tree33)
    plan = make_plan(
        parse('[[modules]]\nname = "module_gemm_a8w8"\n', "m.toml"), tree, archs=ARCHS, env=env, hip_version=HIP
    )
    (cfg,) = plan.modules[0].configs
    assert cfg.sources == (a, b, str(tmp_path / "absent.csv"))
    assert any("absent.csv does not exist" in w for w in plan.warnings)
    # sorted by us; per (M, N, K, q_dtype_w, cu_num, _tag) the fastest; a's rows get _tag ""
    assert render(merge(cfg)).splitlines() == [
        head + ",_tag",
        "80,4,64,64,torch.int8,1,1,1.5,k4,0.1,1,0.0,",
        "80,2,1280,8192,torch.int8,8,0,5.0,k3,2.0,600,0.0,ds",
        "256,1,1280,8192,torch.int8,3,0,10.0,k9,1.0,5.5,0.0,",
        "80,1,1280,8192,torch.int8,7,0,11.25,k2,2.0,600,0.0,",
        "80,2,1280,8192,torch.int8,34,0,30.0,k1,1.0,510.5,0.0,",
    ]


def test_single_env_path_is_used_as_is(tree33):
    env = {"AITER_CONFIG_GEMM_A8W8_BLOCKSCALE": "/somewhere/mine.csv"}
    space = namespace(open_tree(tree33), archs=ARCHS, env=env, hip_version=HIP)
    assert space.names["AITER_CONFIGS"].attrs["AITER_CONFIG_GEMM_A8W8_BLOCKSCALE_FILE"] == "/somewhere/mine.csv"
    assert not any(c.name == "a8w8_blockscale_tuned_gemm.csv" for c in space.merges.values())


NEW_ENV = """
AITER_CONFIG_QOLA_PROBE = os.getenv(
    "AITER_CONFIG_QOLA_PROBE",
    f"{AITER_ROOT_DIR}/aiter/configs/probe_tuned_gemm.csv",
)
"""
NEW_PROP = '''
    @property
    def AITER_CONFIG_QOLA_PROBE_FILE(self):
        """Added by the test: a config no qola release has heard of."""
        return self.get_config_file(
            "AITER_CONFIG_QOLA_PROBE", AITER_CONFIG_QOLA_PROBE, "probe_tuned_gemm"
        )
'''


def test_a_new_config_name_needs_no_qola_change(tmp_path):
    """A config added to core.py (new env default + new AITER_CONFIGS property + per-model file)
    resolves, merges and plans like AITER, with no name known to qola in advance."""
    root = _unpack(tmp_path)
    core = root / "aiter/jit/core.py"
    text = core.read_text()
    cls = "class AITER_CONFIG(object):\n"
    assert text.count(cls) == 1
    core.write_text(text.replace(cls, NEW_ENV + "\n\n" + cls + NEW_PROP, 1))
    configs = root / "aiter/configs"
    _write_csv(configs / "probe_untuned_gemm.csv", ["M,N,K"])
    _write_csv(configs / "probe_tuned_gemm.csv", ["cu_num,M,N,K,us,kernel", "80,1,2,3,5.0,a", "80,1,2,4,6.0,b"])
    _write_csv(
        configs / "model_configs/big_probe_tuned_gemm.csv",
        ["cu_num,M,N,K,us,kernel", "80,1,2,3,4.0,c", "256,1,2,3,9.0,d"],
    )
    _write_csv(configs / "model_configs/big_probe_untuned_gemm.csv", ["M,N,K"])  # "untuned": not merged
    table_path = root / "aiter/jit/optCompilerConfig.json"
    table = json.loads(table_path.read_text())
    table["module_probe"] = {
        "srcs": ["f'{AITER_CSRC_DIR}/pybind/aiter_enum_pybind.cu'"],
        "blob_gen_cmd": [
            "f'{AITER_CSRC_DIR}/probe/gen.py --tune_file {AITER_CONFIGS.AITER_CONFIG_QOLA_PROBE_FILE} "
            "--working_path {{}}'"
        ],
    }
    table_path.write_text(json.dumps(table, indent=4))
    oracle = run_oracle(root)
    assert "AITER_CONFIGS.AITER_CONFIG_QOLA_PROBE_FILE" in oracle["configs"]
    assert entry_diffs(root, oracle, {}) == []
    diffs, merged = config_diffs(root, oracle, {})
    assert diffs == [] and merged == 6
    plan = make_plan(
        parse('[[modules]]\nname = "module_probe"\n', "m.toml"), open_tree(root), archs=ARCHS, env={}, hip_version=HIP
    )
    (cfg,) = plan.modules[0].configs
    assert cfg.name == "probe_tuned_gemm.csv" and len(cfg.sources) == 2
    assert render(merge(cfg)) == "cu_num,M,N,K,us,kernel\n80,1,2,3,4.0,c\n80,1,2,4,6.0,b\n256,1,2,3,9.0,d\n"


def test_cli_plans_the_whole_table(tree33, tmp_path):
    """`qola plan --json` of every module (the 82 keys, and AITER's "all": no [[modules]]) exits 0;
    the tarball is no git checkout, so a pinned commit is a warning, not an error."""
    keys = list(load_table(open_tree(tree33)))
    listed = tmp_path / "all82.toml"
    listed.write_text(
        '[qola]\naiter_commit = "33f2e6af"\n[build]\narchitectures = ["gfx942", "gfx950"]\n'
        + "".join(f'[[modules]]\nname = "{k}"\n' for k in keys)
    )
    proc = run_qola("plan", "--manifest", str(listed), "--aiter-root", str(tree33), "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "not a git checkout" in proc.stderr
    data = json.loads(proc.stdout)
    assert [m["name"] for m in data["modules"]] == keys
    merged = {c["name"] for m in data["modules"] for c in m["configs"]}
    assert merged == {
        "a8w8_blockscale_tuned_gemm.csv",
        "a8w8_bpreshuffle_tuned_gemm.csv",
        "a8w8_blockscale_bpreshuffle_tuned_gemm.csv",
    }
    everything = tmp_path / "all.toml"
    everything.write_text('[build]\narchitectures = ["gfx950"]\n')
    proc = run_qola("plan", "--manifest", str(everything), "--aiter-root", str(tree33), "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(json.loads(proc.stdout)["modules"]) == len([k for k in keys if not k.endswith("tune")]) == 72
    assert "/tmp/aiter_configs" not in proc.stdout and CONFIGS_TOKEN + "/" in proc.stdout
