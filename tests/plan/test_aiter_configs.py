"""Tuned-config files (AITER's get_config_file / update_config_files), core.py read statically,
unknown table keys, and codegen writing merged configs into the build dir."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from qola.compile.codegen import GenJob, run_generators, stamp_of, write_configs
from qola.core.errors import QolaError
from qola.plan.manifest import parse
from qola.plan.planner import Plan, PlanInputs, make_plan
from qola.plan.tree.aiter import namespace, open_tree, resolve_entry
from qola.plan.tree.aiter_configs import CONFIGS_TOKEN, MergedConfig, config_file, merge, render, write_merged
from qola.plan.tree.aiter_core import read_core

HEAD = "cu_num,M,N,K,us,kernel"


def csv(path: Path, *lines: str) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def make_tree(root: Path, table: dict[str, Any], core: str = "") -> Path:
    (root / "aiter/jit").mkdir(parents=True)
    (root / "csrc").mkdir()
    (root / "aiter/jit/optCompilerConfig.json").write_text(json.dumps(table))
    (root / "aiter/jit/core.py").write_text(core)
    return root


# --- get_config_file --------------------------------------------------------------------------------


def merged(*args: Any, **kw: Any) -> MergedConfig:
    """``config_file`` where it names a merge of several files."""
    got = config_file(*args, **kw)
    assert isinstance(got, MergedConfig), got
    return got


def test_config_file_env_default_and_model_configs(tmp_path: Path) -> None:
    model = tmp_path / "aiter/configs/model_configs"
    assert config_file("E", "/d.csv", "x_tuned_gemm", env={}, root=tmp_path) == "/d.csv"
    assert config_file("E", "/d.csv", "x_tuned_gemm", env={"E": "/mine.csv"}, root=tmp_path) == "/mine.csv"
    both = config_file("E", "/d.csv", "x_tuned_gemm", env={"E": "/a.csv:/b.csv"}, root=tmp_path)
    assert both == MergedConfig(
        "x_tuned_gemm.csv", ("/a.csv", "/b.csv"), str(tmp_path / "aiter/configs/x_untuned_gemm.csv")
    )
    assert both.path == f"{CONFIGS_TOKEN}/x_tuned_gemm.csv" and "{}" not in both.path
    csv(model / "zz_x_tuned_gemm_m2.csv", HEAD)
    csv(model / "aa_x_tuned_gemm.csv", HEAD)
    csv(model / "aa_x_untuned_gemm.csv", "M,N,K")  # "untuned" in the path: never merged
    (model / "dir_x_tuned_gemm").mkdir()  # not a file
    got = merged("E", "/d.csv", "x_tuned_gemm", env={}, root=tmp_path)
    assert got.sources == ("/d.csv", str(model / "aa_x_tuned_gemm.csv"), str(model / "zz_x_tuned_gemm_m2.csv"))
    assert merged("E", "/d.csv", "x_tuned_gemm", env={"E": ""}, root=tmp_path).sources == got.sources


def test_merge_dedups_by_untuned_columns_cu_num_and_tag(tmp_path: Path) -> None:
    csv(tmp_path / "aiter/configs/x_untuned_gemm.csv", "M,N,K")
    a = csv(tmp_path / "a.csv", HEAD, "80,1,2,3,9.5,slow", "256,1,2,3,7,other_cu", "80,5,5,5,1e1,ten")
    b = csv(tmp_path / "b.csv", HEAD + ",_tag", "80,1,2,3,2.25,fast,", "80,1,2,3,3,tagged,t1", "80,9,9,9,,no_us,")
    empty = csv(tmp_path / "e.csv", "cu_num,M,N,K,us,kernel,_tag")
    cfg = merged("E", "", "x_tuned_gemm", env={"E": f"{a}:{empty}:{b}"}, root=tmp_path)
    assert render(merge(cfg)).splitlines() == [
        HEAD + ",_tag",
        "80,1,2,3,2.25,fast,",
        "80,1,2,3,3,tagged,t1",  # another _tag: another key
        "256,1,2,3,7,other_cu,",  # another cu_num: another key
        "80,5,5,5,1e1,ten,",  # values stay as written; compared as numbers (1e1 = 10)
        "80,9,9,9,,no_us,",  # a missing us sorts last
    ]


def test_merge_without_untuned_file_concatenates(tmp_path: Path) -> None:
    a = csv(tmp_path / "a.csv", HEAD, "80,1,2,3,9,x")
    b = csv(tmp_path / "b.csv", HEAD, "80,1,2,3,1,y")
    cfg = merged("E", "", "y_tuned_gemm", env={"E": f"{a}:{b}"}, root=tmp_path)
    assert render(merge(cfg)) == f"{HEAD}\n80,1,2,3,9,x\n80,1,2,3,1,y\n"


def test_merge_errors_name_the_files(tmp_path: Path) -> None:
    a = csv(tmp_path / "a.csv", HEAD, "80,1,2,3,9,x")
    b = csv(tmp_path / "b.csv", "cu_num,M,N,us,kernel", "80,1,2,1,y")
    with pytest.raises(QolaError, match="have different columns") as info:
        merge(merged("E", "", "y_tuned_gemm", env={"E": f"{a}:{b}"}, root=tmp_path))
    assert a in info.value.message and b in info.value.message
    with pytest.raises(QolaError, match="cannot read tuned config"):
        merge(merged("E", "", "y_tuned_gemm", env={"E": f"{tmp_path}/none.csv:{a}"}, root=tmp_path))
    missing = merge(merged("E", "", "y_tuned_gemm", env={"E": f"{a}:{tmp_path}/none.csv"}, root=tmp_path))
    assert missing.rows == (("80", "1", "2", "3", "9", "x"),) and "none.csv does not exist" in missing.notes[0]
    # AITER's untuned-name rule raises re.error for a stem ending in "tuned": an error when merged, not before
    odd = merged("E", "", "x_tuned", env={"E": f"{a}:{a}"}, root=tmp_path)
    with pytest.raises(QolaError, match="ends in 'tuned'"):
        merge(odd)


def test_write_merged_is_atomic_and_keeps_unchanged_files(tmp_path: Path) -> None:
    a = csv(tmp_path / "a.csv", HEAD, "80,1,2,3,9,x")
    b = csv(tmp_path / "b.csv", HEAD, "80,1,2,4,1,y")
    cfg = merged("E", "", "y_tuned_gemm", env={"E": f"{a}:{b}"}, root=tmp_path)
    out = tmp_path / "gen/configs"
    digest = write_merged(cfg, out)
    target = out / "y_tuned_gemm.csv"
    before = target.stat()
    assert write_merged(cfg, out) == digest and target.stat().st_ino == before.st_ino
    csv(tmp_path / "b.csv", HEAD, "80,1,2,4,0.5,z")
    assert write_merged(cfg, out) != digest and "z" in target.read_text()
    assert [p.name for p in out.iterdir()] == ["y_tuned_gemm.csv"]  # no temp file left


# --- core.py, read statically ---------------------------------------------------------------------

CORE = '''
import os
AITER_ROOT_DIR = os.path.abspath(".")
X_DEFAULT = os.getenv("X_ENV", f"{AITER_ROOT_DIR}/aiter/configs/x_tuned_gemm.csv")
BAD = os.getenv("BAD_ENV", some_function())
OLD_STYLE_FILE = get_config_file("OLD_ENV", X_DEFAULT, "old_tuned_gemm")

class Configs:
    @property
    def X_FILE(self):
        """doc"""
        return self.get_config_file("X_ENV", X_DEFAULT, "x_tuned_gemm")

    @property
    def NOT_A_CONFIG(self):
        return 42

    def get_config_file(self, env_name, default_file, tuned_file_name):
        raise SystemExit("never run")

CFG = Configs()
'''


def test_core_names_are_read_not_run(tmp_path: Path) -> None:
    root = make_tree(tmp_path, {}, CORE)
    core = read_core(root / "aiter/jit/core.py")
    assert [e.name for e in core.env_names] == ["X_DEFAULT", "BAD"]
    assert [(c.owner, c.name, c.env, c.stem) for c in core.configs] == [
        (None, "OLD_STYLE_FILE", "OLD_ENV", "old_tuned_gemm"),
        ("CFG", "X_FILE", "X_ENV", "x_tuned_gemm"),
    ]
    space = namespace(open_tree(root), archs=("gfx942",), env={}, hip_version="7.2.0")
    default = f"{root}/aiter/configs/x_tuned_gemm.csv"
    assert space.names["X_DEFAULT"] == default and "BAD" not in space.names
    assert space.names["CFG"].attrs == {"X_FILE": default}
    assert space.names["OLD_STYLE_FILE"] == default
    env_space = namespace(open_tree(root), archs=("gfx942",), env={"X_ENV": "/a.csv:/b.csv"}, hip_version=None)
    assert env_space.names["CFG"].attrs["X_FILE"] == f"{CONFIGS_TOKEN}/x_tuned_gemm.csv"
    assert env_space.merges[f"{CONFIGS_TOKEN}/x_tuned_gemm.csv"].sources == ("/a.csv", "/b.csv")


# --- table keys ----------------------------------------------------------------------------------------

TABLE: dict[str, Any] = {
    "module_new": {
        "srcs": ["f'{AITER_CSRC_DIR}/a.cu'"],
        "flags_extra_hip": ["'-DX'"],
        "flags_extra_hip_per_source": {"*.device.cu": ["-D__HIPCC_RTC__"]},  # plain flags: never evaluated
        "new_key": "-DFOO",  # not an expression: kept as text
        "new_list": ["-DBAR", "f'{AITER_CSRC_DIR}'"],
        "third_party": ["'HipKittens'"],
    },
    "module_exp": {"srcs": [], "is_experimental": "True"},
    "module_plain": {"srcs": []},
}


def test_unknown_keys_pass_through_with_warnings(tmp_path: Path) -> None:
    tree = open_tree(make_tree(tmp_path, TABLE))
    names = namespace(tree, archs=("gfx942",), env={}, hip_version="7.2.0").names
    notes: list[str] = []
    entry = resolve_entry("module_new", TABLE["module_new"], names, notes)
    assert entry["new_key"] == "-DFOO" and entry["new_list"] == ["-DBAR", f"{tree.csrc}"]
    assert entry["flags_extra_hip_per_source"] == {"*.device.cu": ["-D__HIPCC_RTC__"]}
    assert len(notes) == 2 and all("kept as plain text" in n for n in notes)
    plan = make_plan(
        parse('[[modules]]\nname = "module_new"\n', "m.toml"),
        tree,
        PlanInputs(archs=("gfx942",), env={}, hip_version="7.2.0"),
    )
    mod = plan.modules[0]
    assert mod.per_source_flags == (("*.device.cu", ("-D__HIPCC_RTC__",)),) and mod.flags_extra_hip == ("-DX",)
    text = "\n".join(plan.warnings)
    assert "key 'new_key'" in text and "key 'new_list'" in text and "third_party ['HipKittens']" in text
    with pytest.raises(QolaError, match="module 'module_bad', key 'flags_extra_hip'"):
        resolve_entry("module_bad", {"flags_extra_hip": ["-DFOO"]}, names)  # a known key stays strict


def test_per_source_flags_keep_the_tables_order_in_the_plan(tmp_path: Path) -> None:
    """AITER tries the patterns in the table's order (first match wins): the plan keeps that order
    (the old plan sorted the patterns, so "*.cu" came before "*norm.cu" and won), through JSON too."""
    from qola.plan.model import Plan

    table = {
        "module_new": {
            "srcs": ["f'{AITER_CSRC_DIR}/rmsnorm.cu'"],
            "flags_extra_hip_per_source": {"*norm.cu": ["-DA"], "*.cu": ["-DB"]},
        }
    }
    tree = open_tree(make_tree(tmp_path, table))
    plan = make_plan(
        parse('[[modules]]\nname = "module_new"\n', "m.toml"),
        tree,
        PlanInputs(archs=("gfx942",), env={}, hip_version="7.2.0"),
    )
    for mod in (plan.modules[0], Plan.from_json(plan.to_json()).modules[0]):
        assert [p for p, _ in mod.per_source_flags] == ["*norm.cu", "*.cu"]
        assert mod.flags_for(f"{tree.csrc}/rmsnorm.cu") == ("-DA",)
        assert mod.flags_for(f"{tree.csrc}/softmax.cu") == ("-DB",)


def test_all_modules_leave_out_experimental_ones(tmp_path: Path) -> None:
    tree = open_tree(make_tree(tmp_path, TABLE))
    kw: dict[str, Any] = {"archs": ("gfx942",), "hip_version": "7.2.0"}
    plan = make_plan(parse("", "m.toml"), tree, PlanInputs(env={}, **kw))
    assert [m.name for m in plan.modules] == ["module_new", "module_plain"]
    assert any("module_exp is experimental" in w for w in plan.warnings)
    plan = make_plan(parse("", "m.toml"), tree, PlanInputs(env={"AITER_ENABLE_EXPERIMENTAL": "1"}, **kw))
    assert [m.name for m in plan.modules] == ["module_new", "module_exp", "module_plain"]


# --- plan and codegen ----------------------------------------------------------------------------------

GEN_SCRIPT = """
import shutil, sys
tune = sys.argv[sys.argv.index("--tune_file") + 1]
out = sys.argv[sys.argv.index("--working_path") + 1]
shutil.copy(tune, out + "/seen.cu")
"""


def test_codegen_writes_merged_configs_into_the_build_dir(tmp_path: Path) -> None:
    root = tmp_path / "tree"
    table = {
        "module_g": {
            "srcs": [],
            "blob_gen_cmd": "f'{AITER_CSRC_DIR}/gen.py --tune_file {CFG.X_FILE} --working_path {{}}'",
        }
    }
    make_tree(root, table, CORE)
    (root / "csrc/gen.py").write_text(GEN_SCRIPT)
    a = csv(tmp_path / "a.csv", HEAD, "80,1,2,3,9,x")
    b = csv(tmp_path / "b.csv", HEAD, "80,1,2,4,1,y")
    env = {"X_ENV": f"{a}:{b}"}
    plan = make_plan(parse("", "m.toml"), open_tree(root), PlanInputs(archs=("gfx942",), env=env, hip_version="7.2.0"))
    mod = plan.modules[0]
    assert CONFIGS_TOKEN in mod.generators[0].command and len(mod.configs) == 1
    assert Plan.from_json(json.loads(json.dumps(plan.to_json()))) == plan
    assert not (tmp_path / "gen").exists()  # planning writes nothing
    gen_root = tmp_path / "build/gen"
    job = GenJob(mod.name, mod.generators, (), mod.configs)
    first = run_generators(job, gen_root, env={"PATH": "/usr/bin:/bin"}, python=sys.executable)
    merged = gen_root / "configs/x_tuned_gemm.csv"
    assert Path(first.sources[0]).read_text() == merged.read_text() == render(merge(mod.configs[0]))
    assert run_generators(job, gen_root, env={"PATH": "/usr/bin:/bin"}, python=sys.executable).skipped
    written = write_configs(job, gen_root)
    argv = written.argvs("OUT", "py")[0]
    assert argv[-4:] == ["--tune_file", str(merged), "--working_path", "OUT"]
    stamp = stamp_of(written, sys.executable)
    csv(tmp_path / "b.csv", HEAD, "80,1,2,4,0.5,z")  # a source changes: the merged file and the stamp follow
    assert stamp_of(write_configs(job, gen_root), sys.executable) != stamp
    again = run_generators(job, gen_root, env={"PATH": "/usr/bin:/bin"}, python=sys.executable)
    assert not again.skipped and "z" in Path(again.sources[0]).read_text()


def test_merge_keys_follow_the_trees_core_py(tmp_path: Path) -> None:
    """Issue 32 item 6 (found by the parity tests on the amd-aiter sdist): a core.py whose merge does not
    name cu_num (the 0.1.7 sdist) keeps one row per untuned key across cu_nums; AITER 33f2e6af's one row
    per cu_num."""
    core = tmp_path / "core.py"
    core.write_text("def update_config_files(file_path, merge_name):\n    keys = ['M']\n")
    assert read_core(core).merge_per_cu_num is False
    core.write_text("def update_config_files(file_path, merge_name):\n    keys = ['M', 'cu_num']\n")
    assert read_core(core).merge_per_cu_num is True
    (tmp_path / "u.csv").write_text("M\n")
    (tmp_path / "a.csv").write_text("cu_num,M,us\n80,1,5.0\n256,1,3.0\n")
    (tmp_path / "b.csv").write_text("cu_num,M,us\n80,1,4.0\n")
    files = (str(tmp_path / "a.csv"), str(tmp_path / "b.csv"))
    old = render(merge(MergedConfig("x_tuned.csv", files, str(tmp_path / "u.csv"), per_cu_num=False)))
    new = render(merge(MergedConfig("x_tuned.csv", files, str(tmp_path / "u.csv"))))
    assert old == "cu_num,M,us\n256,1,3.0\n"
    assert new == "cu_num,M,us\n256,1,3.0\n80,1,4.0\n"
