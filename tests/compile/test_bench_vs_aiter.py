"""bench/vs_aiter.py's reference side: the command lines AITER's build_module writes, on fixtures (no compiler)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from pathlib import Path
from types import ModuleType

import pytest
import support.bench as bench_support


def bench() -> ModuleType:
    return bench_support.load("vs_aiter")


def test_hip_flags_follow_the_version_gates_and_name_every_arch() -> None:
    v = bench()
    assert v.hip_version("6.4.43484-9999\n") == (6, 4, 43484)
    new = v.aiter_hip_flags((6, 4, 43484), ("gfx942", "gfx950"), ["-DX=1", "-DX=1"])
    assert new == sorted(set(new)) and new.count("-DX=1") == 1  # sorted(set(...)), as build_module does
    assert {"--offload-arch=gfx942", "--offload-arch=gfx950", "-mllvm -amdgpu-coerce-illegal-types=1"} <= set(new)
    assert "-mllvm -amdgpu-early-inline-all=true" not in new  # dropped on both sides (clang 21)
    assert "-mllvm --amdgpu-enable-max-ilp-scheduling-strategy=1" not in new  # only up to 6.3.42132
    old = v.aiter_hip_flags((6, 2, 41132), ("gfx942",), [])
    assert "-mllvm --amdgpu-enable-max-ilp-scheduling-strategy=1" in old
    assert "-mllvm -amdgpu-function-calls=false" not in old and "--offload-arch=gfx950" not in old


def test_compile_line_has_aiters_order_and_each_flag_as_one_shell_word(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    v = bench()
    monkeypatch.delenv("AITER_SYMBOL_VISIBLE", raising=False)
    flags = v.aiter_hip_flags((6, 4, 43484), ("gfx942",), [])
    line = v.aiter_compile(tmp_path / "a b.cpp", tmp_path / "a.cuda.o", [tmp_path / "inc"], flags, Path("/opt/rocm"))
    words = shlex.split(line)
    assert words[:3] == ["/opt/rocm/bin/hipcc", "-DWITH_HIP", f"-I{tmp_path / 'inc'}"]
    assert words[3:7] == ["-fPIC", "-std=c++20", "-O3", "-std=c++20"]
    assert words[words.index("-fvisibility=hidden") - 1] == "-fdata-sections"  # COMMON_HIPCC_FLAGS' tail
    assert words[-5:] == ["-fno-gpu-rdc", "-c", str(tmp_path / "a b.cpp"), "-o", str(tmp_path / "a.cuda.o")]
    assert words[words.index("--amdgpu-kernarg-preload-count=16") - 1] == "-mllvm"


def test_module_config_evaluates_the_sdists_own_expressions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    v = bench()
    cfg = {
        "libmha_fwd": {
            "srcs": [],
            "flags_extra_hip": ["'-DA=1'", "f'-DB={os.environ.get(\"QOLA_TEST_B\", 2)}'"],
            "extra_include": ["f'{CK_DIR}/example/ck_tile/01_fmha'"],
        }
    }
    (tmp_path / "aiter" / "jit").mkdir(parents=True)
    (tmp_path / "aiter" / "jit" / "optCompilerConfig.json").write_text(json.dumps(cfg))
    monkeypatch.setenv("QOLA_TEST_B", "7")
    hip, inc = v.module_config(tmp_path, "libmha_fwd")
    assert hip == ["-DA=1", "-DB=7"]
    assert inc == [tmp_path / "aiter_meta" / "3rdparty" / "composable_kernel" / "example" / "ck_tile" / "01_fmha"]


def test_float4_define_follows_the_last_gpu_archs_entry_as_aiters_get_gfx() -> None:
    v = bench()
    version = (6, 4, 43484)
    assert "-D__Float4_e2m1fn_x2" in v.aiter_hip_flags(version, ("gfx942", "gfx950"), [])
    assert "-D__Float4_e2m1fn_x2" in v.aiter_hip_flags(version, ("gfx950",), [])
    assert "-D__Float4_e2m1fn_x2" not in v.aiter_hip_flags(version, ("gfx950", "gfx942"), [])  # last is gfx942
    assert "-D__Float4_e2m1fn_x2" not in v.aiter_hip_flags(version, ("gfx942",), [])
    assert "-D__Float4_e2m1fn_x2" not in v.aiter_hip_flags(version, ("gfx942", "gfx950"), [], fp4x2="0")


def _gen(command: str, wrapper: str | None = None) -> dict[str, object]:
    argv = shlex.split(command)
    return {"command": command, "argv": argv, "run_argv": ([wrapper] if wrapper else []) + argv}


def test_generators_are_aiters_one_asm_dir_and_no_targets_qola_adds() -> None:
    v = bench()
    ck = "/t/3rdparty/composable_kernel/example/ck_tile/01_fmha/generate.py"
    records = [
        _gen(f"{ck} --targets=gfx942,gfx950 -d fwd --receipt 700 --output_dir {{}}", "/q/filter_any.py"),
        _gen("/t/csrc/cpp_itfs/mha_fwd_generate.py --receipt 5 --output_dir {}"),
        _gen("/t/hsa/gfx942//fmha_v3_fwd/codegen.py --output_dir {}"),
        _gen("/t/hsa/gfx950//fmha_v3_fwd/codegen.py --output_dir {}"),
    ]
    two = v.aiter_generators(records, ("gfx942", "gfx950"))
    assert two == [
        ["/q/filter_any.py", ck, "-d", "fwd", "--receipt", "700", "--output_dir", "{}"],  # CK's default targets
        ["/t/csrc/cpp_itfs/mha_fwd_generate.py", "--receipt", "5", "--output_dir", "{}"],
        ["/t/hsa/gfx950//fmha_v3_fwd/codegen.py", "--output_dir", "{}"],  # get_asm_dir(): the last arch's only
    ]
    one = v.aiter_generators(records, ("gfx942",))
    assert [a[0] for a in one][-1] == "/t/hsa/gfx942//fmha_v3_fwd/codegen.py" and len(one) == 3
    named = [_gen(f"{ck} -d bwd --targets=gfx9 --output_dir {{}}")]  # a command's own --targets stays
    assert v.aiter_generators(named, ("gfx942",)) == [named[0]["run_argv"]]
    env = v.aiter_gen_env(("gfx942", "gfx950"), Path("/t"), {"PATH": "/bin"})
    assert env == {"PATH": "/bin", "GPU_ARCHS": "gfx942;gfx950", "AITER_ASM_DIR": "/t/hsa/gfx950/"}
    shimmed = v.aiter_gen_env(("gfx942",), Path("/t"), {"PATH": "/bin"}, Path("/w/tools"))
    assert shimmed["PATH"] == "/w/tools:/bin" and shimmed["AITER_ASM_DIR"] == "/t/hsa/gfx942/"


def test_runs_alternate_abab_so_each_side_goes_first_as_often() -> None:
    v = bench()
    assert v.schedule(2) == [(0, "qola"), (0, "aiter"), (1, "aiter"), (1, "qola")]
    assert v.schedule(3, first="aiter") == [
        (0, "aiter"), (0, "qola"), (1, "qola"), (1, "aiter"), (2, "aiter"), (2, "qola"),
    ]  # fmt: skip
    with pytest.raises(SystemExit, match="at least one pair"):
        v.schedule(0)


def test_table_shows_each_pair_and_the_mean_ratio() -> None:
    v = bench()

    def run(side: str, pair: int, cpu: float, gen: float = 0.0) -> dict[str, object]:
        return {"side": side, "pair": pair, "cpu": cpu, "wall": cpu, "load": [1.0, 2.0], "units": ["x"] * 3,
                "gen_cpu": gen, "gen_wall": gen, "all_cpu": cpu + gen, "all_wall": cpu + gen}  # fmt: skip

    runs = [run("qola", 0, 90), run("aiter", 0, 100, 10), run("aiter", 1, 90, 10), run("qola", 1, 110)]
    text = v.pair_rows("A", ("gfx942",), runs)
    rows = [r for r in text.splitlines() if r.startswith("| A ")]
    assert len(rows) == 3 and "qola, AITER" in rows[0] and "AITER, qola" in rows[1]
    assert "0.90×" in rows[0] and "0.82×" in rows[0]  # 90/100 of compile+link, 90/110 of all
    assert "1.22×" in rows[1] and "1.10×" in rows[1]
    assert rows[2].startswith("| A | mean") and "1.06×" in rows[2] and "0.96×" in rows[2]


KERNELS = """#include <hip/hip_runtime.h>
__global__ void k_same(float* x) { x[threadIdx.x] *= 2.0f; }
__global__ void k_other(float* x) { x[threadIdx.x] += ADD; }
"""


def run_record(side: str, pair: int, libs: dict[str, Path]) -> dict[str, object]:
    return {"side": side, "pair": pair, "cpu": 10.0, "wall": 10.0, "load": [1.0, 1.0], "units": ["u"],
            "gen_cpu": 0.0, "gen_wall": 0.0, "all_cpu": 10.0, "all_wall": 10.0, "libs": {m: str(p) for m, p in libs.items()}}  # fmt: skip


@pytest.mark.hip
def test_report_only_compares_each_kernels_machine_code_from_the_libraries_a_run_kept(tmp_path: Path) -> None:
    v = bench()
    (tmp_path / "k.hip").write_text(KERNELS)
    libs = {}
    for name, add in (("qola", "1.0f"), ("aiter0", "1.0f"), ("aiter1", "3.0f")):
        libs[name] = tmp_path / f"{name}.so"
        cmd = ["hipcc", "--offload-arch=gfx90a", "-fPIC", "-shared", "-O1", f"-DADD={add}", str(tmp_path / "k.hip")]
        done = subprocess.run([*cmd, "-o", str(libs[name])], capture_output=True, text=True,
                              env={**os.environ, "HIP_PLATFORM": "amd"})  # fmt: skip
        assert done.returncode == 0, done.stderr
    runs = [run_record("qola", 0, {"libmha_fwd": libs["qola"]}), run_record("aiter", 0, {"libmha_fwd": libs["aiter0"]}),
            run_record("aiter", 1, {"libmha_fwd": libs["aiter1"]}), run_record("qola", 1, {"libmha_fwd": libs["qola"]})]  # fmt: skip
    result = {"slice": "A", "archs": ["gfx90a"], "plan": {"cpu": 1.0, "wall": 1.0}, "runs": runs, "checks": []}
    (tmp_path / "results.json").write_text(json.dumps([result]))
    assert v.main(["--report-only", "--work-dir", str(tmp_path)]) == 0
    report = (tmp_path / "report.md").read_text()
    assert "same names on both sides in every pair" in report  # the names agree; pair 1's code does not
    assert "| A | libmha_fwd | gfx90a | pair 0: 2 of 2; pair 1: 1 of 2 | pair 1: _Z7k_otherPf |" in report
    assert "| A | mean of 2 (gfx90a) |" in report
    with pytest.raises(SystemExit, match=r"results\.json not found"):
        v.main(["--report-only", "--work-dir", str(tmp_path / "none")])


def test_text_table_says_one_count_when_every_pair_agrees() -> None:
    v = bench()
    row = {"library": "libmha_bwd", "arch": "gfx942", "identical": 5, "total": 5, "differ": []}
    checks = [{"pair": 0, "text": [row]}, {"pair": 1, "text": [row]}]
    text = v.text_table([{"slice": "B", "checks": checks}])
    assert text.splitlines()[-1] == "| B | libmha_bwd | gfx942 | 5 of 5 (pairs 0, 1) |  |"
