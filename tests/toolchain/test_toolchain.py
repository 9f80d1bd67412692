"""qola.toolchain: finding compilers, versions, flag probes, real compile + link."""

from __future__ import annotations

import ctypes
import itertools
import os
import shutil
import subprocess
from pathlib import Path
from subprocess import CompletedProcess
from typing import Any

import pytest

from qola.core.errors import QolaError
from qola.toolchain import Toolchain, ToolchainChoice, default_jobs, find_toolchain, portable, validate_archs, vendor_of
from qola.toolchain import cuda as cuda_mod
from qola.toolchain import hip as hip_mod
from qola.toolchain.env import ToolchainEnv
from qola.toolchain.probe import probe_path
from qola.toolchain.versions import hip_version_key, parse_hip_version, parse_nvcc_version, version_matches

ENV = dict(os.environ)

HEADER = "#pragma once\n#define QOLA_TC_SCALE 2.0f\n"
SOURCE = r"""
#include "qola_tc.h"
#if defined(__HIP_PLATFORM_AMD__)
#include <hip/hip_runtime.h>
#define gpu(name) hip##name
#define gpuMemcpyHostToDevice hipMemcpyHostToDevice
#define gpuMemcpyDeviceToHost hipMemcpyDeviceToHost
#else
#include <cuda_runtime.h>
#define gpu(name) cuda##name
#define gpuMemcpyHostToDevice cudaMemcpyHostToDevice
#define gpuMemcpyDeviceToHost cudaMemcpyDeviceToHost
#endif
#define API extern "C" __attribute__((visibility("default")))

__global__ void qola_tc_scale(float* x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] *= QOLA_TC_SCALE;
}
static int helper_hidden(void) { return 41; }
API int qola_tc_probe(void) { return helper_hidden() + 1; }
API int qola_tc_selftest(void) {
  enum { N = 1000 };
  float host[N];
  for (int i = 0; i < N; ++i) host[i] = (float)i;
  float* dev = nullptr;
  if (gpu(Malloc)((void**)&dev, sizeof host) != gpu(Success)) return 1;
  if (gpu(Memcpy)(dev, host, sizeof host, gpuMemcpyHostToDevice) != gpu(Success)) return 2;
  qola_tc_scale<<<(N + 255) / 256, 256>>>(dev, N);
  if (gpu(GetLastError)() != gpu(Success)) return 3;
  if (gpu(Memcpy)(host, dev, sizeof host, gpuMemcpyDeviceToHost) != gpu(Success)) return 4;
  gpu(Free)(dev);
  for (int i = 0; i < N; ++i)
    if (host[i] != QOLA_TC_SCALE * i) return 5;
  return 0;
}
"""


def _nvcc() -> str | None:
    return shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if os.path.exists("/usr/local/cuda/bin/nvcc") else None)


needs_nvcc = pytest.mark.skipif(_nvcc() is None, reason="needs nvcc (the CUDA toolkit)")


def build_library(tc: Toolchain, tmp: Path, name: str = "qola_tc") -> Path:
    """Compile SOURCE and link it into a .so with exactly the argv the toolchain gives."""
    src_dir = tmp / "src"
    src_dir.mkdir(exist_ok=True)
    (src_dir / "qola_tc.h").write_text(HEADER)
    src = src_dir / f"{name}.cpp"  # .cpp on purpose: it must still compile as device code
    src.write_text(SOURCE)
    obj, rsp, out = tmp / f"{name}.o", tmp / f"{name}.rsp", tmp / f"lib{name}.so"
    dep = Path(portable.depfile_of(str(obj)))  # where the compiler writes it (-MD alone)
    child = {**ENV, **tc.child_env}
    for argv in (
        tc.compile_argv(src, obj, [*tc.device_flags(), f"-I{src_dir}"]),
        tc.shared_link_argv(rsp, out, []),
    ):
        rsp.write_text(f"{obj}\n")
        proc = subprocess.run(argv, env=child, capture_output=True, text=True)
        assert proc.returncode == 0, f"{argv}\n{proc.stdout}\n{proc.stderr}"
    deps = dep.read_text()
    assert "qola_tc.h" in deps, deps
    assert str(obj) in deps.split(":", 1)[0]
    return out


def forbid_probes(monkeypatch: pytest.MonkeyPatch) -> list[Any] | CompletedProcess[Any]:
    """Let only `--version` through qola's process runner (every child it starts); anything else fails."""
    from qola.core import proc

    real = proc.run
    seen = []

    def guarded(argv: Any, *args: Any, **kwargs: Any) -> CompletedProcess[Any]:
        if list(argv)[1:] != ["--version"]:
            raise AssertionError(f"unexpected child process on a warm probe cache: {argv}")
        seen.append(argv)
        return real(argv, *args, **kwargs)

    monkeypatch.setattr(proc, "run", guarded)
    return seen


# ---- pure: archs, versions, jobs ---------------------------------------------------


@pytest.mark.parametrize("arch", ["gfx90a", "gfx940", "gfx941", "gfx942", "gfx950", "gfx1100", "gfx90a:xnack-"])
def test_vendor_of_hip(arch: str) -> None:
    assert vendor_of(arch) == "hip"


@pytest.mark.parametrize("arch", ["sm_80", "sm_90", "sm_90a", "sm_100a", "sm_120"])
def test_vendor_of_cuda(arch: str) -> None:
    assert vendor_of(arch) == "cuda"


@pytest.mark.parametrize("arch", ["native", "sm90", "gfx", "compute_90", "gfx90a:xnack", "GFX90A", ""])
def test_vendor_of_rejects(arch: str) -> None:
    with pytest.raises(QolaError, match="unknown GPU architecture"):
        vendor_of(arch)


def test_vendor_mixing_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(QolaError) as info:
        find_toolchain(["gfx942", "sm_90"], env=ENV, accepted_versions=None, cache_dir=tmp_path)
    text = str(info.value)
    assert "mix HIP and CUDA" in text and "gfx942" in text and "sm_90" in text
    assert "hint:" in text


def test_validate_archs_dedups_and_keeps_order() -> None:
    assert validate_archs(["gfx942", "gfx90a", "gfx942"]) == ("hip", ("gfx942", "gfx90a"))
    with pytest.raises(QolaError, match="no GPU architectures"):
        validate_archs([])
    with pytest.raises(QolaError, match="different features"):
        validate_archs(["gfx90a:xnack-", "gfx90a:xnack+"])


def test_parse_versions() -> None:
    assert parse_hip_version("HIP version: 5.2.21153-0\nDebian clang version 15.0.6\n") == ("5.2.21153", "-0")
    assert parse_hip_version("6.3.42131-fa1d09cfd") == ("6.3.42131", "-fa1d09cfd")
    assert parse_nvcc_version("Cuda compilation tools, release 13.0, V13.0.88") == "13.0"
    assert parse_nvcc_version("nothing here") is None
    assert version_matches("7.2.0", "7.2") and version_matches("7.2.53211", "7.2") and version_matches("13.0", "13")
    assert not version_matches("7.20.0", "7.2") and not version_matches("6.4.1", "7.2")
    # AITER orders "6.3.42132-abc" after "6.3.42132"
    assert hip_version_key("6.3.42132", "-abc") > hip_version_key("6.3.42132") > hip_version_key("6.3.42131", "-x")


def test_aiter_version_dependent_flags() -> None:
    old = hip_mod.hip_flag_set(hip_version_key("5.2.21153", "-0"), ["gfx90a"], {})
    assert "-mllvm --amdgpu-enable-max-ilp-scheduling-strategy=1" in old
    assert "-mllvm --lsr-drop-solution=1" not in old and "-fno-offload-uniform-block" not in old
    new = hip_mod.hip_flag_set(hip_version_key("7.2.53211", "-e5be8a"), ["gfx942", "gfx950"], {})
    assert "-mllvm --amdgpu-enable-max-ilp-scheduling-strategy=1" not in new
    for flag in (
        "-mllvm --lsr-drop-solution=1",
        "-fno-offload-uniform-block",
        "-mllvm -enable-post-misched=0",
        "-mllvm -amdgpu-early-inline-all=true",
        "-mllvm -amdgpu-function-calls=false",
        "-mllvm -amdgpu-coerce-illegal-types=1",
        "-D__Float4_e2m1fn_x2",  # gfx950
        "--offload-arch=gfx942",
        "--offload-arch=gfx950",
    ):
        assert flag in new
    assert new == sorted(set(new))
    assert "-D__Float4_e2m1fn_x2" not in hip_mod.hip_flag_set((7, 2, 0, 0), ["gfx950"], {"AITER_FP4x2": "0"})
    # AITER reads the last GPU_ARCHS entry (chip_info.get_gfx_custom_op_core), not any of them
    assert "-D__Float4_e2m1fn_x2" not in hip_mod.hip_flag_set((7, 2, 0, 0), ["gfx950", "gfx942"], {})
    assert "-D__Float4_e2m1fn_x2" in hip_mod.hip_flag_set((7, 2, 0, 0), ["gfx942", "gfx950:xnack-"], {})


def test_drop_hip_flags_removes_named_entries_and_refuses_unknown_ones() -> None:
    new = hip_mod.hip_flag_set(hip_version_key("7.2.53211", "-e5be8a"), ["gfx942"], {})
    kept = hip_mod.without(new, ["-mllvm -amdgpu-early-inline-all=true"], "HIP 7.2")
    assert "-mllvm -amdgpu-early-inline-all=true" not in kept and "-mllvm -amdgpu-function-calls=false" in kept
    assert len(kept) == len(new) - 1
    for bad in ("-amdgpu-early-inline-all=true", "-mllvm --amdgpu-enable-max-ilp-scheduling-strategy=1"):
        with pytest.raises(QolaError) as info:  # half a flag; a flag this version does not pass
            hip_mod.without(new, [bad], "HIP 7.2")
        text = str(info.value)
        assert "drop_hip_flags" in text and repr(bad) in text and "'-mllvm -enable-post-misched=0'" in text


@pytest.mark.hip
def test_drop_hip_flags_reach_the_compile_flags(tmp_path: Path) -> None:
    tc = find_toolchain(
        ["gfx90a"],
        env=ENV,
        accepted_versions=None,
        cache_dir=tmp_path,
        choice=ToolchainChoice(drop_hip_flags=["-DUSE_PROF_API=1"]),
    )
    assert "-DUSE_PROF_API=1" not in tc.device_flags() and tc.removed_flags == ("-DUSE_PROF_API=1",)
    assert "-DLEGACY_HIPBLAS_DIRECT" in tc.device_flags()
    with pytest.raises(QolaError, match="drop_hip_flags"):
        find_toolchain(
            ["gfx90a"],
            env=ENV,
            accepted_versions=None,
            cache_dir=tmp_path,
            choice=ToolchainChoice(drop_hip_flags=["-O3"]),
        )


def test_default_jobs() -> None:
    assert default_jobs({"MAX_JOBS": "3"}, cpus=64, free_gb=1.0) == 3
    assert default_jobs({}, cpus=16, free_gb=100.0) == 12  # int(0.8 * 16)
    assert default_jobs({}, cpus=16, free_gb=2.2) == 4  # int(2.2 / 0.5)
    assert default_jobs({}, cpus=1, free_gb=0.1) == 1
    assert default_jobs({"MAX_JOBS": ""}, cpus=10, free_gb=100.0) == 8
    assert default_jobs({}) >= 1  # reads os.sched_getaffinity and /proc/meminfo
    assert default_jobs({}, cpus=10**6, free_gb=10.0**9) == 4096  # the one cap (qola.core.rules.MAX_JOBS)
    for bad in ("abc", "0", "-2"):
        with pytest.raises(QolaError, match="MAX_JOBS"):
            default_jobs({"MAX_JOBS": bad})


def test_toolchain_dict_round_trip() -> None:
    tc = Toolchain("cuda", "/x/nvcc", "13.0", "out", "ab" * 32, ("sm_90",), "/usr/bin/c++", {}, base_flags=("-O3",))
    assert Toolchain.from_dict(tc.to_dict()) == tc
    argv = tc.compile_argv("a.cu", "a.o", ["-O3"])
    assert argv[:2] == ["/x/nvcc", "-O3"] and "-MD" in argv and "-MF" not in argv and argv[-2:] == ["-o", "a.o"]
    assert tc.shared_link_argv("objs.rsp", "x.so", ["-Wl,-z,defs"])[:5] == [
        "/usr/bin/c++",
        "-shared",
        "@objs.rsp",
        "-o",
        "x.so",
    ]


def test_version_check_is_a_typed_value_recorded_as_before() -> None:
    """The rocm_versions check crosses from the toolchain to the pipeline (its warning) and the
    publish (manifest.json's ``version_check``) as a typed value; its JSON form stays the one
    manifest.json and the recipe always held (``message`` only on a mismatch)."""
    from qola.toolchain.base import VersionCheck

    found = {"hip": "6.4.43484", "rocm_release": None}
    bad = VersionCheck("rocm_versions", ("7.2",), found, "mismatch", "found HIP 6.4")
    assert bad.to_json() == {
        "key": "rocm_versions",
        "accepted": ["7.2"],
        "found": found,
        "status": "mismatch",
        "message": "found HIP 6.4",
    }
    good = VersionCheck("rocm_versions", ("6.4",), found, "match")
    assert "message" not in good.to_json() and VersionCheck.of(good.to_json()) == good
    tc = Toolchain("hip", "/x/hipcc", "6.4", "out", "ab" * 32, ("gfx942",), "/usr/bin/c++", {}, version_check=bad)
    data = tc.to_dict()
    assert data["version_check"] == bad.to_json()
    back = Toolchain.from_dict(data).version_check
    assert back == bad and back is not None and back.message == "found HIP 6.4"


# ---- missing compilers ----------------------------------------------------------------


def test_missing_compiler_path(tmp_path: Path) -> None:
    with pytest.raises(QolaError) as info:
        find_toolchain(
            ["sm_90"],
            env=ENV,
            accepted_versions=None,
            cache_dir=tmp_path,
            choice=ToolchainChoice(compiler="/nonexistent/nvcc"),
        )
    assert "/nonexistent/nvcc" in str(info.value) and "install the CUDA toolkit (nvcc)" in (info.value.hint or "")
    with pytest.raises(QolaError) as info:
        find_toolchain(
            ["gfx90a"],
            env=ENV,
            accepted_versions=None,
            cache_dir=tmp_path,
            choice=ToolchainChoice(compiler="/nonexistent/hipcc"),
        )
    assert "apt-get install hipcc" in (info.value.hint or "")


def test_missing_compiler_empty_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cuda_mod, "FALLBACKS", ())
    monkeypatch.setattr(hip_mod, "HIPCC_FALLBACKS", ())
    monkeypatch.setattr(hip_mod, "CLANG_FALLBACKS", ())
    with pytest.raises(QolaError, match="no CUDA compiler found") as info:
        find_toolchain(["sm_90"], env={"PATH": ""}, accepted_versions=None, cache_dir=tmp_path)
    assert "nvcc" in (info.value.hint or "")
    with pytest.raises(QolaError, match="no HIP compiler found") as info:
        find_toolchain(["gfx942"], env={"PATH": ""}, accepted_versions=None, cache_dir=tmp_path)
    assert "apt-get install hipcc" in (info.value.hint or "")


# ---- CUDA (nvcc) --------------------------------------------------------------------


@needs_nvcc
def test_cuda_found_and_flags(tmp_path: Path) -> None:
    tc = find_toolchain(["sm_90", "sm_90a"], env=ENV, accepted_versions=None, cache_dir=tmp_path)
    assert tc.kind == "cuda" and os.path.isabs(tc.compiler) and tc.archs == ("sm_90", "sm_90a")
    assert tc.version == parse_nvcc_version(tc.version_output) and tc.version.count(".") == 1
    assert len(tc.identity) == 64 and tc.child_env == {}
    flags = tc.device_flags()
    pairs = list(itertools.pairwise(flags))
    assert ("-gencode", "arch=compute_90,code=sm_90") in pairs
    assert ("-gencode", "arch=compute_90a,code=sm_90a") in pairs
    assert ("-Xcompiler", "-fPIC") in pairs and "--expt-relaxed-constexpr" in flags and "-std=c++17" in flags
    assert "-lcudart_static" in tc.shared_link_argv("o.rsp", "x.so", [])
    assert tc.runtime_link_libs() == ["cudart"]
    assert probe_path(tmp_path, tc.identity, ToolchainEnv.of(ENV).with_child(tc.child_env)).is_file()


@needs_nvcc
def test_cuda_version_mismatch(tmp_path: Path) -> None:
    with pytest.raises(QolaError) as info:
        find_toolchain(["sm_90"], env=ENV, accepted_versions=["12.4", "12.8"], cache_dir=tmp_path)
    text = str(info.value)
    assert "found CUDA" in text and "manifest accepts only ['12.4', '12.8']" in text and "cuda_versions" in text
    assert "CUDA_HOME" in (info.value.hint or "")


@needs_nvcc
def test_cuda_unknown_arch(tmp_path: Path) -> None:
    with pytest.raises(QolaError, match="cannot compile for sm_10"):
        find_toolchain(["sm_10"], env=ENV, accepted_versions=None, cache_dir=tmp_path)


@needs_nvcc
def test_cuda_probe_cache_hit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = find_toolchain(["sm_90"], env=ENV, accepted_versions=None, cache_dir=tmp_path)
    seen = forbid_probes(monkeypatch)
    second = find_toolchain(["sm_90"], env=ENV, accepted_versions=None, cache_dir=tmp_path)
    assert second == first
    assert seen  # the guard is on the path children take (the --version identity check went through it)


@needs_nvcc
@pytest.mark.slow
def test_cuda_compile_and_link(tmp_path: Path) -> None:
    tc = find_toolchain(["sm_90"], env=ENV, accepted_versions=["13", "12"], cache_dir=tmp_path)
    lib = build_library(tc, tmp_path)
    assert ctypes.CDLL(str(lib)).qola_tc_probe() == 42  # loads with no GPU and no libcudart.so


@needs_nvcc
@pytest.mark.gpu
def test_cuda_kernel_runs(tmp_path: Path) -> None:
    tc = find_toolchain(["sm_90"], env=ENV, accepted_versions=None, cache_dir=tmp_path)
    assert ctypes.CDLL(str(build_library(tc, tmp_path))).qola_tc_selftest() == 0


# ---- HIP (hipcc, ROCm) ----------------------------------------------------------------


@pytest.mark.hip
def test_hip_found_flags_and_probe_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tc = find_toolchain(["gfx90a"], env=ENV, accepted_versions=None, cache_dir=tmp_path)
    assert tc.kind == "hip" and tc.child_env == {"HIP_PLATFORM": "amd"}
    parsed = parse_hip_version(tc.version_output)
    assert parsed is not None and tc.version == parsed[0]
    flags = tc.device_flags()
    for flag in (
        "-fPIC",
        "-D__HIP_PLATFORM_AMD__=1",
        "-DUSE_ROCM=1",
        "-DHIPBLAS_V2",
        "--offload-arch=gfx90a",
        "-fno-gpu-rdc",
        "-fvisibility=hidden",
        "-fvisibility-inlines-hidden",
        "-std=c++20",
    ):
        assert flag in flags
    assert flags[-1] == "-fno-gpu-rdc"
    for dropped in tc.dropped_flags:  # whatever the probes refused stays out
        assert dropped.split()[-1] not in flags
    assert probe_path(tmp_path, tc.identity, ToolchainEnv.of(ENV).with_child(tc.child_env)).is_file()
    seen = forbid_probes(monkeypatch)
    assert find_toolchain(["gfx90a"], env=ENV, accepted_versions=None, cache_dir=tmp_path) == tc
    assert seen


@pytest.mark.hip
def test_hip_version_mismatch(tmp_path: Path) -> None:
    """rocm_versions is recorded, not enforced (issue 21: QoLA never enforces it; TE's manifests say 7.2
    and TE builds with ROCm 7.0 and 7.1)."""
    tc = find_toolchain(["gfx90a"], env=ENV, accepted_versions=["7.2"], cache_dir=tmp_path)
    check = tc.version_check
    assert check is not None
    text = check.message
    assert text is not None
    assert check.status == "mismatch" and check.accepted == ("7.2",)
    assert "found HIP" in text and "manifest accepts only ['7.2']" in text and "rocm_versions" in text


@pytest.mark.hip
def test_hip_unsupported_arch(tmp_path: Path) -> None:
    tc = find_toolchain(["gfx90a"], env=ENV, accepted_versions=None, cache_dir=tmp_path)
    if hip_version_key(tc.version) >= (6, 0, 0, 0):
        pytest.skip("this ROCm knows gfx942")
    with pytest.raises(QolaError, match="cannot compile for gfx942"):
        find_toolchain(["gfx90a", "gfx942"], env=ENV, accepted_versions=None, cache_dir=tmp_path)


@pytest.mark.hip
@pytest.mark.slow
def test_hip_compile_and_link(tmp_path: Path) -> None:
    tc = find_toolchain(["gfx90a"], env=ENV, accepted_versions=None, cache_dir=tmp_path)
    lib = build_library(tc, tmp_path)
    assert ctypes.CDLL(str(lib)).qola_tc_probe() == 42
    assert "amdhip64" in tc.runtime_link_libs()


def test_probe_cache_is_per_compiler_environment(tmp_path: Path) -> None:
    """A probe answered under one compiler environment is not reused under another: hipcc under
    ck-jit's fake ROCM_PATH fails every --offload-arch probe until HIP_DEVICE_LIB_PATH names the
    device libraries, and a cached 'no' from before must not outlive the fix (issue 31)."""
    from qola.toolchain.probe import Probes

    base = {"PATH": os.environ["PATH"]}
    first = Probes(tmp_path, "same-compiler", base)
    assert first.supported(["--offload-arch=gfx942"], lambda f: ["false"]) == {"--offload-arch=gfx942": False}
    first.save()
    again = Probes(tmp_path, "same-compiler", base)
    assert again.supported(["--offload-arch=gfx942"], lambda f: ["true"]) == {"--offload-arch=gfx942": False}
    assert again.ran == 0  # the cached answer, same environment
    fixed = Probes(tmp_path, "same-compiler", {**base, "HIP_DEVICE_LIB_PATH": "/usr/lib/bitcode"})
    assert fixed.supported(["--offload-arch=gfx942"], lambda f: ["true"]) == {"--offload-arch=gfx942": True}
    assert fixed.ran == 1
    unrelated = Probes(tmp_path, "same-compiler", {**base, "TERM": "xterm"})  # not a compiler variable
    assert unrelated.supported(["--offload-arch=gfx942"], lambda f: ["true"])["--offload-arch=gfx942"] is False


def test_default_jobs_uses_both_cpus_of_a_two_cpu_machine() -> None:
    """Issue 32 item 7: AITER's 0.8 x CPUs gives 1 job on 2 CPUs (half the machine idle)."""
    assert default_jobs({}, cpus=2, free_gb=100.0) == 2
    assert default_jobs({}, cpus=2, free_gb=0.6) == 1  # memory still bounds it
    assert default_jobs({}, cpus=3, free_gb=100.0) == 2


def test_dry_run_refuses_the_arch_the_build_refuses(tmp_path: Path) -> None:
    """Issue 32 item 7: one validator for the dry run (no compiler probed) and the build."""
    from support.common import KERNELS, run_qola

    m = tmp_path / "h.toml"
    m.write_text(
        '[qola]\nnamespace = "qk"\n[build]\narchitectures = ["gfx942"]\n[[modules]]\nname = "module_rmsnorm"\n'
    )
    for cmd in (["build", "--dry-run", "-o", str(tmp_path / "out")], ["plan"]):
        proc = run_qola(*cmd, "-m", str(m), "-a", str(KERNELS), "--arch", "gfx9420", cwd=tmp_path)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert "unknown AMD GPU processor 'gfx9420'" in proc.stderr
    assert not (tmp_path / "out.build").exists()
    m.write_text(m.read_text().replace("gfx942", "gfx9420"))  # the manifest's list too
    proc = run_qola("plan", "-m", str(m), "-a", str(KERNELS), cwd=tmp_path)
    assert proc.returncode == 2 and "gfx9420" in proc.stderr
