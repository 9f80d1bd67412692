"""bench/vs_aiter.py's reference side: the command lines AITER's build_module writes, on fixtures (no compiler)."""

from __future__ import annotations

import importlib.util
import json
import shlex
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]


def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("vs_aiter", REPO / "bench" / "vs_aiter.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


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
