"""What a module needs to contain kernels (issue 22): registry switches and generators applied where
the tree's sources ask (``#if FAV3_ON``, ``#include "asm_…_configs.hpp"``), never duplicated when the
tree's table carries them; a build that leaves a switch off fails naming it, and ``qola audit``
rejects such a library from its own switch record; CK gets ``--targets`` from the plan's archs; the
generators get AITER's environment (``AITER_GPU_ARCHS``) and their stamp covers it.

The fixture trees are written here in AITER's layout (no AITER code): an ``mha_fwd.cu`` with
``#if FAV3_ON`` / ``#if FAV2_ON`` paths and an ``hsa/codegen.py``-shaped generator that reads
``os.environ["AITER_GPU_ARCHS"]`` as AITER's does.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, cast

import pytest
from support.common import run_qola

from qola.compile.codegen import GenJob, run_generators
from qola.output import kernels
from qola.plan import genrules, needs, registry
from qola.plan.planner import Generator
from qola.plan.registry import NeededGenerator, RegistryEntry

# hsa/codegen.py's shape: archs from AITER_GPU_ARCHS (a KeyError without it), one header per -m
CODEGEN = """\
import argparse, os
archs = [el for el in os.environ["AITER_GPU_ARCHS"].split(";")]
p = argparse.ArgumentParser()
p.add_argument("-m", "--module", required=True)
p.add_argument("-o", "--output_dir")
a = p.parse_args()
with open(f"{a.output_dir}/asm_{a.module}_configs.hpp", "w") as f:
    f.write("#pragma once\\n")
    f.write("static const char* const qola_test_archs = \\"" + ",".join(archs) + "\\";\\n")
    f.write("static inline int v3_kernels() { return %d; }\\n" % len(archs))
"""

# mha_fwd.cu's shape (AITER 2026): v3 under FAV3_ON, the CK path under FAV2_ON, else -1
MHA_FWD = """\
#include <hip/hip_runtime.h>
#if FAV3_ON
#include "asm_fmha_v3_fwd_configs.hpp"
#endif
__global__ void qola_test_kernel(float* out) { out[0] = 1.0f; }
#if FAV3_ON
static float fwd_v3() { return v3_kernels() > 0 ? 3.0f : -1.0f; }
#endif
#if FAV2_ON
static float fwd_ck() { return 2.0f; }
#endif
extern "C" __attribute__((visibility("default"))) float te_test_mha_fwd(int probe)
{
    float ret = -1;
#if FAV3_ON
    ret = fwd_v3();
#endif
#if FAV2_ON
    if(ret == -1 && !probe) ret = fwd_ck();
#endif
    return ret;
}
"""


def tree(tmp: Path, *, slim: bool = False, name: str = "libmha_fwd") -> Path:
    """An AITER-layout tree with one cpp_itfs module ``name``; ``slim``: its table carries the switches
    (in flags_extra_cc, as 33f2e6af does) and the v3 generator itself."""
    root = tmp / ("slim" if slim else "tree")
    (root / "aiter" / "jit").mkdir(parents=True)
    (root / "csrc" / "cpp_itfs").mkdir(parents=True)
    (root / "hsa").mkdir()
    (root / "csrc" / "cpp_itfs" / "mha_fwd.cu").write_text(MHA_FWD)
    (root / "hsa" / "codegen.py").write_text(CODEGEN)
    (root / "csrc" / "include").mkdir()  # the API qola wraps (qola.plan.itfs reads it from the tree)
    for api in ("mha_fwd", "mha_bwd"):
        (root / "csrc" / "include" / f"{api}.h").write_text(f"namespace aiter {{ float {api}(int probe); }}\n")
    gens = ["f'{AITER_META_DIR}/hsa/codegen.py -m fmha_v3_fwd --output_dir {{}}'"] if slim else []
    table = {
        name: {
            "srcs": ["f'{AITER_CSRC_DIR}/cpp_itfs/mha_fwd.cu'"],
            "flags_extra_cc": ["'-DFAV3_ON=1'", "'-DFAV2_ON=1'"] if slim else [],
            "flags_extra_hip": [],
            "extra_ldflags": "None",
            "extra_include": [],
            "is_python_module": "False",
            "is_standalone": "False",
            "torch_exclude": "True",
            "blob_gen_cmd": gens,
        }
    }
    (root / "aiter" / "jit" / "optCompilerConfig.json").write_text(json.dumps(table))
    return root


def manifest(tmp: Path, arch: str = "gfx942", name: str = "libmha_fwd", extra: str = "") -> Path:
    m = tmp / f"q_{arch}.toml"
    m.write_text(
        f'[qola]\nnamespace = "te"\n[build]\narchitectures = ["{arch}"]\nmode = "cpp_itfs"\n'
        f'[[modules]]\nname = "{name}"\n{extra}'
    )
    return m


def plan_json(tmp: Path, root: Path, *args: str) -> dict[str, Any]:
    proc = run_qola("plan", "--json", "-m", str(manifest(tmp)), "--aiter-root", str(root), *args)
    assert proc.returncode == 0, proc.stderr
    return cast("dict[str, Any]", json.loads(proc.stdout)["modules"][0])


# ---- the plan: the registry's switches and generators where the sources ask -------------------


def test_plan_adds_fav3_fav2_and_the_v3_generator_where_mha_fwd_gates_on_them(tmp_path: Path) -> None:
    mod = plan_json(tmp_path, tree(tmp_path))
    assert mod["flags_extra_hip"][-2:] == ["-DFAV3_ON=1", "-DFAV2_ON=1"]
    assert [Path(s).name for s, _ in mod["gates"]] == ["mha_fwd.cu"] and mod["gates"][0][1] == ["FAV3_ON", "FAV2_ON"]
    v3 = [g for g in mod["generators"] if g["argv"][0].endswith("hsa/codegen.py")]
    assert len(v3) == 1 and v3[0]["argv"][1:3] == ["-m", "fmha_v3_fwd"] and v3[0]["origin"] == "registry"
    assert v3[0]["targets"] == ["gfx942"]  # it reads AITER_GPU_ARCHS: it writes for the plan's archs


def test_the_text_plan_says_what_the_registry_added_and_each_generators_archs(tmp_path: Path) -> None:
    proc = run_qola("plan", "-m", str(manifest(tmp_path)), "--aiter-root", str(tree(tmp_path)))
    assert proc.returncode == 0, proc.stderr
    assert "hsa/codegen.py -m fmha_v3_fwd --output_dir {}  (qola's registry)" in proc.stdout
    assert "    archs     gfx942\n" in proc.stdout
    assert "  switches    mha_fwd.cu gates kernel code on FAV3_ON, FAV2_ON\n" in proc.stdout
    assert "-DFAV3_ON=1 -DFAV2_ON=1" in proc.stdout and "qola's registry adds -DFAV3_ON=1 -DFAV2_ON=1" in proc.stderr


def test_a_slim_tree_carrying_them_gets_nothing_twice(tmp_path: Path) -> None:
    mod = plan_json(tmp_path, tree(tmp_path, slim=True))
    assert not any("FAV" in f for f in mod["flags_extra_hip"])
    assert mod["flags_extra_cc"] == ["-DFAV3_ON=1", "-DFAV2_ON=1"]
    assert [g["origin"] for g in mod["generators"]] == [None]  # the table's own v3 generator, once
    assert mod["gates"]  # still checked at build time: cc flags reach HIP compiles, as in AITER


def test_a_tree_whose_sources_do_not_gate_gets_nothing(tmp_path: Path) -> None:
    root = tree(tmp_path)
    (root / "csrc" / "cpp_itfs" / "mha_fwd.cu").write_text('extern "C" float te_test_mha_fwd(int) { return 1; }\n')
    mod = plan_json(tmp_path, root)
    assert not any("FAV" in f for f in mod["flags_extra_hip"]) and not mod["gates"]
    assert not [g for g in mod["generators"] if g["origin"] == "registry"]


# AITER's core.py (2026) reads build-wide switches from the environment inside its build function and
# adds them to every module's flags_cc unless the module's flags_extra_cc name them
CORE_WITH_SWITCHES = """\
import os
def build_module(flags_extra_cc, flags_cc):
    enable_ck = int(os.environ.get("ENABLE_CK", "1"))
    if not any("ENABLE_CK" in f for f in flags_extra_cc):
        flags_cc.append(f"-DENABLE_CK={enable_ck}")
    rope = int(os.environ.get("ENABLE_ROPE_POSITIONS_INT32", "0"))
"""


def test_build_wide_switches_come_from_the_trees_core_py(tmp_path: Path) -> None:
    root = tree(tmp_path)
    assert not any("ENABLE_CK" in f for f in plan_json(tmp_path, root)["flags_extra_cc"])  # no core.py: none
    (root / "aiter" / "jit" / "core.py").write_text(CORE_WITH_SWITCHES)
    cc = plan_json(tmp_path, root)["flags_extra_cc"]
    assert cc[-2:] == ["-DENABLE_CK=1", "-DENABLE_ROPE_POSITIONS_INT32=0"]  # CK paths compiled in, as in AITER
    proc = run_qola(
        "plan",
        "--json",
        "-m",
        str(manifest(tmp_path)),
        "--aiter-root",
        str(root),
        env={"ENABLE_CK": "0", "ENABLE_ROPE_POSITIONS_INT32": "1"},
    )
    assert json.loads(proc.stdout)["modules"][0]["flags_extra_cc"][-2:] == [
        "-DENABLE_CK=0",
        "-DENABLE_ROPE_POSITIONS_INT32=1",
    ]
    own = manifest(tmp_path, extra="flags_extra_cc = [\"'-DENABLE_CK=0'\"]\n")
    proc = run_qola("plan", "--json", "-m", str(own), "--aiter-root", str(root))
    cc = json.loads(proc.stdout)["modules"][0]["flags_extra_cc"]
    assert [f for f in cc if "ENABLE_CK" in f] == ["-DENABLE_CK=0"]  # the module's own word wins, once
    bad = run_qola("plan", "-m", str(manifest(tmp_path)), "--aiter-root", str(root), env={"ENABLE_CK": "yes"})
    assert bad.returncode == 2 and "ENABLE_CK='yes'" in bad.stderr and "Traceback" not in bad.stderr


def test_conditionals_and_defines_are_read_as_the_preprocessor_would() -> None:
    text = b"#if 0\n#  ifdef FAV3_ON\n#endif\n# elif defined(FAV2_ON) && X\nint FAV9_ON;\n"
    assert needs.tested(text, ("FAV3_ON", "FAV2_ON", "FAV9_ON")) == ("FAV3_ON", "FAV2_ON")
    assert needs.defines(["-DA=0 -DB", "-D C=2", "-UB"]) == {"A": "0", "C": "2"}
    assert [needs.is_on(v) for v in (None, "0", "1", "0x0", "2u", "")] == [False, False, True, False, True, False]
    off = needs.off_switches([("x/mha_fwd.cu", ("FAV3_ON", "FAV2_ON"))], ["-DFAV3_ON=1", "-DFAV2_ON=0"])
    assert off == [("x/mha_fwd.cu", ["FAV2_ON"])]


# ---- the build and the audit --------------------------------------------------------------------

TEST_ENTRY = RegistryEntry(
    switches=("FAV3_ON", "FAV2_ON"),
    generators=(
        NeededGenerator(
            "asm_fmha_v3_fwd_configs.hpp", "f'{AITER_META_DIR}/hsa/codegen.py -m fmha_v3_fwd --output_dir {{}}'"
        ),
    ),
)


def qola_in_process(monkeypatch: pytest.MonkeyPatch, *argv: str) -> int:
    """qola's CLI in this process, with a registry entry for the fixture's torch-free module (the
    real libmha_fwd entry adds AITER's API wrapper, which needs AITER's headers)."""
    from qola import cli

    entries = {**registry.load(), "libtest_fwd": TEST_ENTRY}
    monkeypatch.setattr(registry, "load", lambda: entries)
    return cli.main(list(argv))


@pytest.mark.hip
@pytest.mark.slow
def test_build_records_the_switches_and_the_audit_rejects_a_library_without_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tree(tmp_path, name="libtest_fwd")
    out = tmp_path / "out"
    argv = ("build", "-m", str(manifest(tmp_path, "gfx90a", "libtest_fwd")), "--aiter-root", str(root), "-o")
    assert qola_in_process(monkeypatch, *argv, str(out)) == 0, capsys.readouterr().err
    lib = out / "lib" / "te_libtest_fwd.so"
    recs = kernels.switch_records(lib)
    assert [(r.source, r.values) for r in recs] == [("mha_fwd.cu", (("FAV3_ON", True), ("FAV2_ON", True)))]
    assert kernels.device_code_objects(lib) == {"gfx90a": ["_Z16qola_test_kernelPf"]}
    assert run_qola("audit", str(out)).returncode == 0

    # the manifest turns both off: the module fails before compiling, naming the switches
    off = manifest(tmp_path, "gfx90a", "libtest_fwd", 'flags_extra_hip = ["-DFAV3_ON=0", "-DFAV2_ON=0"]\n')
    bad = tmp_path / "bad"
    assert qola_in_process(monkeypatch, "build", "-m", str(off), "--aiter-root", str(root), "-o", str(bad)) == 1
    err = capsys.readouterr().err
    assert "FAV3_ON, FAV2_ON" in err and "return -1 for every call" in err
    assert not (bad / "lib" / "te_libtest_fwd.so").exists()

    # a qola without these checks would have published it: the audit reads the record in the binary
    monkeypatch.setattr(needs, "off_switches", lambda *a, **k: [])
    monkeypatch.setattr(kernels, "switch_problems", lambda *a, **k: [])
    assert qola_in_process(monkeypatch, "build", "-m", str(off), "--aiter-root", str(root), "-o", str(bad)) == 0
    proc = run_qola("audit", str(bad))
    assert proc.returncode == 1
    assert "mha_fwd.cu was compiled with FAV3_ON=0, FAV2_ON=0" in proc.stderr
    assert "returns -1 for every call" in proc.stderr


# ---- generator environment and its stamp --------------------------------------------------------


def test_generators_get_aiter_gpu_archs_and_an_arch_change_reruns_them(tmp_path: Path) -> None:
    root = tree(tmp_path)
    gen = Generator(f"{root}/hsa/codegen.py -m fmha_v3_fwd --output_dir {{}}")
    base = {"PATH": os.environ["PATH"]}

    def run(archs: tuple[str, ...]) -> Any:
        given = genrules.aiter_env(archs, root)
        job = GenJob("libmha_fwd", (gen,), env=tuple(sorted(given.items())))
        res = run_generators(job, tmp_path / "gen", env={**base, **given}, python=sys.executable)
        return res, (res.blob_dir / "asm_fmha_v3_fwd_configs.hpp").read_text()

    assert genrules.aiter_env(("gfx942", "gfx950"), root)["AITER_GPU_ARCHS"] == "gfx942;gfx950"
    assert genrules.aiter_env(("gfx942",), root)["AITER_ASM_DIR"] == f"{root}/hsa/"
    res, text = run(("gfx942",))
    assert not res.skipped and '"gfx942"' in text
    res, _ = run(("gfx942",))
    assert res.skipped  # same inputs: skipped
    res, text = run(("gfx950",))  # the same command for another arch: rerun, not the gfx942 code
    assert not res.skipped and '"gfx950"' in text and "gfx942" not in text


# ---- CK --targets --------------------------------------------------------------------------------


def test_targets_only_where_the_generator_declares_them(tmp_path: Path) -> None:
    ck = tmp_path / "ck" / "example" / "ck_tile" / "01_fmha"
    (ck / "codegen" / "ops").mkdir(parents=True)
    script = ck / "generate.py"
    script.write_text("import argparse\np = argparse.ArgumentParser()\np.add_argument('-d', '--direction')\n")
    cmd = f"{script} -d fwd --output_dir {{}}"
    assert genrules.with_targets(cmd, str(script), ("gfx942",)) == (cmd, ())  # an older CK: nothing added
    script.write_text(script.read_text() + 'p.add_argument(\n    "--targets",\n    default="gfx9,gfx950")\n')
    assert genrules.with_targets(cmd, str(script), ("gfx942:xnack-", "gfx950")) == (
        f"{script} --targets=gfx942,gfx950 -d fwd --output_dir {{}}",
        ("gfx942", "gfx950"),
    )
    chosen = f"{script} --targets gfx950 -d fwd --output_dir {{}}"  # the table's own choice stays
    assert genrules.with_targets(chosen, str(script), ("gfx942",)) == (chosen, ("gfx950",))
    stems = ["fmha_fwd_d128_bf16_gfx9", "fmha_fwd_d128_bf16_gfx950", "fmha_fwd_api"]
    assert genrules.file_archs(stems, ("gfx942", "gfx950")) == {
        "fmha_fwd_d128_bf16_gfx9": ("gfx942",),
        "fmha_fwd_d128_bf16_gfx950": ("gfx950",),
        "fmha_fwd_api": ("gfx942", "gfx950"),
    }


@pytest.mark.aiter
def test_ck_generate_lists_no_gfx950_file_for_a_gfx942_build(tmp_path: Path, aiter_root: Path) -> None:
    """The sdist's CK generate.py, through qola's plan: a gfx942-only build lists (and so writes and
    compiles) no ``_gfx950`` file; a two-arch build lists both twins."""
    root = aiter_root
    m = tmp_path / "q.toml"
    m.write_text('[qola]\nnamespace = "te"\n[build]\nmode = "cpp_itfs"\n[[modules]]\nname = "libmha_bwd"\n')
    proc = run_qola("plan", "--json", "-m", str(m), "--aiter-root", str(root), "--arch", "gfx942")
    assert proc.returncode == 0, proc.stderr
    mod = json.loads(proc.stdout)["modules"][0]
    ck = next(g for g in mod["generators"] if g["argv"][0].endswith("01_fmha/generate.py"))
    assert "--targets=gfx942" in ck["argv"] and ck["targets"] == ["gfx942"]
    names = list(ck["files"])
    assert len(names) > 100 and not [n for n in names if n.endswith("_gfx950")]
    assert all(archs == ["gfx942"] for archs in ck["files"].values())
    # the other sdist plans' arch order (TE's example: gfx950 first): this plan takes their listing
    proc = run_qola("plan", "--json", "-m", str(m), "--aiter-root", str(root), "--arch", "gfx950", "--arch", "gfx942")
    both = next(g for g in json.loads(proc.stdout)["modules"][0]["generators"] if g["argv"][0] == ck["argv"][0])
    assert both["targets"] == ["gfx950", "gfx942"]
    twins = {n[: -len("_gfx950")] for n in both["files"] if n.endswith("_gfx950")}
    assert twins and {n for n in names if n.endswith("_gfx9")} <= set(both["files"])
    assert all(both["files"][n + "_gfx950"] == ["gfx950"] for n in twins)


def test_every_code_object_a_v3_table_names_must_be_embedded() -> None:
    """The rows hsa/codegen.py writes (ADD_CFG(..., arch, path, knl_name, co_name)) against the embed
    keys; gfx942 keys carry AITER's MI300/MI308 subdir, which the runtime adds."""
    text = (
        "#define ADD_CFG(dtype, hdim, arch, path, knl_name, co_name) \\\n"
        "static CFG cfg_fmha_fwd = {\n"
        '    ADD_CFG("bf16",  128, "gfx942", "fmha_v3_fwd/", "_ZN5aiter1kE", "fwd_hd128_bf16.co"),\n'
        '    ADD_CFG("bf16",  128, "gfx950", "fmha_v3_fwd/", "_ZN5aiter1kE", "fwd_hd128_bf16.co"),\n};\n'
    )
    rows = kernels.config_rows(text)
    assert rows == [("gfx942", "fmha_v3_fwd/", "fwd_hd128_bf16.co"), ("gfx950", "fmha_v3_fwd/", "fwd_hd128_bf16.co")]
    keys = ["hsa/gfx942/fmha_v3_fwd/MI300/fwd_hd128_bf16.co", "hsa/gfx950/fmha_v3_fwd/fwd_hd128_bf16.co"]
    assert kernels.unembedded(rows, keys, ["fmha_v3_fwd"], ["gfx942", "gfx950"]) == []
    assert kernels.unembedded(rows, keys[:1], ["fmha_v3_fwd"], ["gfx942", "gfx950"]) == [
        "gfx950: fmha_v3_fwd/fwd_hd128_bf16.co"
    ]
    assert kernels.unembedded(rows, keys[:1], ["fmha_v3_fwd"], ["gfx942"]) == []  # not a target: not needed
