"""qola's static resolution of the real AITER tree equals AITER's own evaluation, module by module.

The tree is the ``amd-aiter`` sdist that the ``aiter`` marker fetches once into the test cache
(tests/support/aiter_sdist.py; CI has it), copied per test so that it can be changed. The oracle
(tests/support/aiter_oracle.py) imports the copy's ``aiter/jit/core.py`` in a subprocess and runs
``get_args_of_build`` for every module and reads every tuned-config path core.py computes (its
``AITER_CONFIGS`` properties, or in the sdist's older core.py its module-level
``AITER_CONFIG_*_FILE``); qola resolves the same copy without importing or evaluating anything.
AITER writes merged tuned configs under ``/tmp``; the test's copy of core.py writes them to a temp
dir instead, and qola's ``{qola_configs}/<stem>.csv`` maps to that dir. Merged files are compared
row by row as pandas parses them (AITER's own reader), as multisets: the order of rows with equal
``us`` differs (pandas' sort is not stable, and AITER merges model files in directory order).

Nothing here is counted by hand: every number is AITER's (the oracle's) or the table's.
"""

from __future__ import annotations

import ast
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, cast

import pytest
from support.common import run_qola

from qola.plan.manifest import parse
from qola.plan.planner import PlanInputs, make_plan
from qola.plan.tree.aiter import load_table, namespace, open_tree, resolve_entry
from qola.plan.tree.aiter_configs import CONFIGS_TOKEN, MergedConfig, merge, render

pytestmark = [pytest.mark.aiter, pytest.mark.slow]
pd = pytest.importorskip("pandas")  # AITER's merge is pandas: the oracle needs it

ORACLE = Path(__file__).resolve().parents[1] / "support" / "aiter_oracle.py"
ARCHS = ("gfx942", "gfx950")
HIP = "7.2.0"
# where core.py writes merged configs (AITER 33f2e6af and later; the sdist's older core.py)
AITER_TMP = ('"/tmp/aiter_configs/"', 'f"/tmp/{merge_name}.csv"')
LIST_KEYS = ("srcs", "flags_extra_cc", "flags_extra_hip", "extra_include", "blob_gen_cmd")
KEYS = (
    *LIST_KEYS,
    "md_name",
    "torch_exclude",
    "is_python_module",
    "is_standalone",
    "extra_ldflags",
    "hip_clang_path",
    "verbose",
)


def _copy(sdist: Path, dest: Path) -> Path:
    """A copy of the sdist's tree whose core.py writes merged configs into ``dest / "aiter_configs"``."""
    root = dest / "aiter"
    shutil.copytree(sdist, root, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"), symlinks=True)
    core = root / "aiter/jit/core.py"
    text = core.read_text()
    once: list[str | None] = [t for t in AITER_TMP if text.count(t) == 1]
    (found,) = once or [None]
    assert found, "core.py no longer writes merged configs where the test expects"
    configs = dest / "aiter_configs"
    target = repr(str(configs) + "/") if "aiter_configs" in found else 'f"' + str(configs) + '/{merge_name}.csv"'
    core.write_text(text.replace(found, target))
    return root


@pytest.fixture(scope="module")
def tree(aiter_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _copy(aiter_root, tmp_path_factory.mktemp("aiter"))


def config_value(space: Any, name: str) -> Any:
    """A config path as qola resolved it: ``AITER_CONFIGS.<prop>`` or a module-level name."""
    owner, _, prop = name.rpartition(".")
    if owner:
        return space.names[owner].attrs.get(prop) if owner in space.names else None
    return space.names.get(prop)


def merged_by_aiter(oracle: dict[str, Any], root: Path) -> set[str]:
    """The configs AITER merged (written into the test's configs dir), by property."""
    at = str(root.parent / "aiter_configs")
    return {k for k, v in oracle["configs"].items() if isinstance(v, str) and v.startswith(at)}


def run_oracle(root: Path, env_extra: dict[str, str] | None = None) -> dict[str, Any]:
    """AITER's evaluation of ``root`` (merged configs land in ``root.parent / "aiter_configs"``)."""
    shutil.rmtree(root.parent / "aiter_configs", ignore_errors=True)
    (root.parent / "aiter_configs").mkdir()
    out = root.parent / "oracle.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AITER_")}
    env.update({"GPU_ARCHS": ";".join(ARCHS), **(env_extra or {})})
    proc = subprocess.run(
        [sys.executable, str(ORACLE), str(root), str(out), HIP], capture_output=True, text=True, env=env, timeout=600
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return cast("dict[str, Any]", json.loads(out.read_text()))


def _aiter_form(field: str, value: Any, configs_dir: Path) -> Any:
    """qola's value as AITER writes it: its merged-config dir, and "" / a string for one-item lists."""
    if isinstance(value, str):
        return value.replace(CONFIGS_TOKEN, str(configs_dir))
    if isinstance(value, list):
        return [_aiter_form(field, v, configs_dir) for v in value]
    return value


def _as_list(value: Any) -> list[Any]:
    return [] if value in (None, "") else [value] if isinstance(value, str) else list(value)


def entry_diffs(root: Path, oracle: dict[str, Any], env: dict[str, str]) -> list[str]:
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


def _rows(text_or_path: str | Path) -> tuple[list[str], list[str]]:
    df = pd.read_csv(io.StringIO(text_or_path) if isinstance(text_or_path, str) else text_or_path)
    return list(df.columns), sorted(map(repr, df.astype(str).itertuples(index=False, name=None)))


def _same_but_ties(cfg: MergedConfig, cols: list[str], rows_a: list[str], rows_b: list[str]) -> bool:
    """The one documented difference (qola.plan.tree.aiter_configs._sorted_by_us): of two input rows
    with the same key and the same ``us``, pandas' unstable sort may keep either; qola keeps the
    earlier. Equal when each side keeps one row per (key, us) and every kept row is an input row."""
    keys = [*(pd.read_csv(cfg.untuned).columns if os.path.exists(cfg.untuned) else cols), "us"]
    keys += ["cu_num"] if cfg.per_cu_num and "cu_num" not in keys else []
    at = [cols.index(k) for k in dict.fromkeys(keys) if k in cols]

    def cell(v: str) -> object:  # "0" and "0.0" as pandas compares them (a file's column may be int)
        try:
            return float(v)
        except ValueError:
            return v

    def tuples(rows: list[str]) -> list[tuple[Any, ...]]:
        return [tuple(cell(v) for v in ast.literal_eval(r)) for r in rows]  # reprs of tuples of str (_rows)

    a, b = tuples(rows_a), tuples(rows_b)
    inputs: set[tuple[Any, ...]] = set()
    for src in cfg.sources:
        if os.path.exists(src):
            inputs |= set(tuples(_rows(Path(src))[1]))

    def project(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
        return sorted(tuple(r[i] for i in at) for r in rows)

    return project(a) == project(b) and set(a) <= inputs


def config_diffs(root: Path, oracle: dict[str, Any], env: dict[str, str]) -> tuple[list[str], int]:
    """Every AITER_CONFIGS property: the same path, and for merged files the same rows."""
    space = namespace(open_tree(root), archs=ARCHS, env=env, hip_version=HIP)
    configs_dir = root.parent / "aiter_configs"
    diffs, merged = [], 0
    assert oracle["configs"], "the oracle found no AITER_CONFIGS properties"
    for qualified, theirs in oracle["configs"].items():
        mine = config_value(space, qualified)
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
            elif rows_a != rows_b and not _same_but_ties(cfg, cols_a, rows_a, rows_b):
                only_a, only_b = set(rows_a) - set(rows_b), set(rows_b) - set(rows_a)
                diffs.append(
                    f"{qualified}: {len(rows_a)} rows vs AITER's {len(rows_b)}; only qola: "
                    f"{sorted(only_a)[:3]}, only AITER: {sorted(only_b)[:3]}"
                )
    return diffs, merged


def test_every_module_resolves_as_aiter_does(tree: Path) -> None:
    oracle = run_oracle(tree)
    assert len(oracle["modules"]) == len(load_table(open_tree(tree))) > 0
    assert entry_diffs(tree, oracle, {}) == []
    diffs, merged = config_diffs(tree, oracle, {})
    assert diffs == []
    assert merged == len(merged_by_aiter(oracle, tree)) > 0  # model_configs/ gives some configs per-model rows


def test_plan_of_every_module_matches_aiters_build_args(tree: Path) -> None:
    """The plan (what the build uses) of every module: sources as AITER expands them, flags,
    generator commands, md_name and the link kinds."""
    oracle = run_oracle(tree)
    table = load_table(open_tree(tree))
    manifest = parse('[qola]\nnamespace = "t"\n' + "".join(f'[[modules]]\nname = "{k}"\n' for k in table), "m.toml")
    plan = make_plan(manifest, open_tree(tree), PlanInputs(archs=ARCHS, env={}, hip_version=HIP))
    assert len(plan.modules) == len(table) == len(oracle["modules"])
    configs_dir = tree.parent / "aiter_configs"
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
            each for c in _as_list(theirs["blob_gen_cmd"]) if c.strip() for each in _per_arch(c)
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
    # the modules whose generators read a config AITER merged: exactly those qola merges for
    with_merges = {m.name for m in plan.modules if m.configs}
    theirs = {
        name
        for name, args in oracle["modules"].items()
        if any(str(configs_dir) in c for c in _as_list(args["blob_gen_cmd"]))
    }
    assert with_merges == theirs and with_merges, (with_merges, theirs)


def _per_arch(command: str) -> list[str]:
    """AITER's command for one arch's code objects (``hsa/<gfx>/``: its JIT runs on one GPU) as qola
    plans it: once per requested arch."""
    for arch in ARCHS:
        if f"/hsa/{arch}/" in command:
            return [command.replace(f"/hsa/{arch}/", f"/hsa/{a}/") for a in ARCHS]
    return [command]


def _write_csv(path: Path, rows: list[str]) -> str:
    path.write_text("\n".join(rows) + "\n")
    return str(path)


def test_env_override_merges_two_files(tree: Path, tmp_path: Path) -> None:
    """AITER_CONFIG_GEMM_A8W8=a.csv:b.csv merges the two (the fastest row of each shape wins) as AITER
    does; a path that does not exist is skipped (qola warns)."""
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
            head,
            "80,1,1280,8192,torch.int8,7,0,11.25,k2,2.0,600,0.0",
            "80,2,1280,8192,torch.int8,7,0,99.0,k2,2.0,600,0.0",
            "80,4,64,64,torch.int8,1,1,1.5,k4,0.1,1,0.0",
        ],
    )
    env = {"AITER_CONFIG_GEMM_A8W8": f"{a}:{b}:{tmp_path / 'absent.csv'}"}
    oracle = run_oracle(tree, env)
    assert entry_diffs(tree, oracle, env) == []
    diffs, merged = config_diffs(tree, oracle, env)
    assert diffs == [] and merged == len(merged_by_aiter(oracle, tree))
    assert merged == len(merged_by_aiter(run_oracle(tree), tree)) + 1  # this one merged too
    plan = make_plan(
        parse('[[modules]]\nname = "module_gemm_a8w8"\n', "m.toml"),
        open_tree(tree),
        PlanInputs(archs=ARCHS, env=env, hip_version=HIP),
    )
    (cfg,) = plan.modules[0].configs
    assert cfg.sources == (a, b, str(tmp_path / "absent.csv"))
    assert any("absent.csv does not exist" in w for w in plan.warnings)
    rows = render(merge(cfg)).splitlines()
    assert rows[0] == head and any(",30.0," in r for r in rows)  # a's row beats b's slower one (99.0)
    assert not any(",20.5," in r or ",99.0," in r for r in rows)  # the slower row of each shape is gone


def test_single_env_path_is_used_as_is(tree: Path) -> None:
    env = {"AITER_CONFIG_GEMM_A8W8_BLOCKSCALE": "/somewhere/mine.csv"}
    space = namespace(open_tree(tree), archs=ARCHS, env=env, hip_version=HIP)
    oracle = run_oracle(tree)
    (prop,) = [k for k in oracle["configs"] if k.endswith("AITER_CONFIG_GEMM_A8W8_BLOCKSCALE_FILE")]
    assert config_value(space, prop) == "/somewhere/mine.csv"
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
NEW_FILE = """
AITER_CONFIG_QOLA_PROBE_FILE = get_config_file(
    "AITER_CONFIG_QOLA_PROBE", AITER_CONFIG_QOLA_PROBE, "probe_tuned_gemm"
)
"""


def _add_probe_config(core: Path) -> str:
    """Add the probe config to core.py in the tree's own style; the name its path goes by."""
    text = core.read_text()
    cls = "class AITER_CONFIG(object):\n"
    if text.count(cls) == 1:  # AITER_CONFIGS.<property>
        core.write_text(text.replace(cls, NEW_ENV + "\n\n" + cls + NEW_PROP, 1))
        return "AITER_CONFIGS.AITER_CONFIG_QOLA_PROBE_FILE"
    first = "\nAITER_CONFIG_GEMM_A4W4_FILE = get_config_file("  # module-level names (the sdist)
    assert text.count(first) == 1, "core.py declares its configs in a way this test does not know"
    core.write_text(text.replace(first, "\n" + NEW_ENV + NEW_FILE + first, 1))
    return "AITER_CONFIG_QOLA_PROBE_FILE"


def test_a_new_config_name_needs_no_qola_change(aiter_root: Path, tmp_path: Path) -> None:
    """A config added to core.py (new env default + new config path + per-model file) resolves,
    merges and plans like AITER, with no name known to qola in advance."""
    root = _copy(aiter_root, tmp_path)
    name = _add_probe_config(root / "aiter/jit/core.py")
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
    some = next(v for v in table.values() if v.get("srcs"))
    table["module_probe"] = {
        "srcs": some["srcs"][:1],
        "blob_gen_cmd": [f"f'{{AITER_CSRC_DIR}}/probe/gen.py --tune_file {{{name}}} --working_path {{{{}}}}'"],
    }
    table_path.write_text(json.dumps(table, indent=4))
    before = run_oracle(_copy(aiter_root, tmp_path / "plain"))
    oracle = run_oracle(root)
    assert name in oracle["configs"]
    assert entry_diffs(root, oracle, {}) == []
    diffs, merged = config_diffs(root, oracle, {})
    assert diffs == [] and merged == len(merged_by_aiter(before, tmp_path / "plain" / "aiter")) + 1
    plan = make_plan(
        parse('[[modules]]\nname = "module_probe"\n', "m.toml"),
        open_tree(root),
        PlanInputs(archs=ARCHS, env={}, hip_version=HIP),
    )
    (cfg,) = plan.modules[0].configs
    assert cfg.name == "probe_tuned_gemm.csv" and len(cfg.sources) == 2
    assert "4.0,c" in render(merge(cfg))  # the per-model file's faster row


def test_cli_plans_the_whole_table(tree: Path, tmp_path: Path) -> None:
    """`qola plan --json` of every module (every key, and AITER's "all": no [[modules]]) exits 0;
    the sdist is no git checkout, so a pinned commit is a warning, not an error."""
    keys = list(load_table(open_tree(tree)))
    listed = tmp_path / "all.toml"
    # TE's example's arch order, as the run's other plans of the sdist: they share the CK listings
    listed.write_text(
        '[qola]\naiter_commit = "33f2e6af"\n[build]\narchitectures = ["gfx950", "gfx942"]\n'
        + "".join(f'[[modules]]\nname = "{k}"\n' for k in keys)
    )
    proc = run_qola("plan", "--manifest", str(listed), "--aiter-root", str(tree), "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "not a git checkout" in proc.stderr
    data = json.loads(proc.stdout)
    assert [m["name"] for m in data["modules"]] == keys
    merged = {c["name"] for m in data["modules"] for c in m["configs"]}
    oracle = run_oracle(tree)
    assert merged == {Path(oracle["configs"][k]).name for k in merged_by_aiter(oracle, tree)}
    everything = tmp_path / "every.toml"
    everything.write_text('[build]\narchitectures = ["gfx950"]\n')
    proc = run_qola("plan", "--manifest", str(everything), "--aiter-root", str(tree), "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(json.loads(proc.stdout)["modules"]) == len([k for k in keys if not k.endswith("tune")])
    assert "/tmp/aiter_configs" not in proc.stdout and CONFIGS_TOKEN + "/" in proc.stdout
