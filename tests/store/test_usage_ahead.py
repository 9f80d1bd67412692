"""Recording variants built ahead ([usage] record_ahead, ``qola build --record-ahead``; docs/usage.md):
the rewrite of an instance file into its recorded copy (jit.stubs.record_ahead), the runtime's ahead
slow path on a host library (support/jit_lib.py's units, g++), and `qola build` of the example tree
with nvcc (host only: batch 0 / nhead 0 return from the real instance before any launch) and hipcc."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support.common import KERNELS, run_qola
from support.jit_lib import (
    API_H,
    CXXFLAGS,
    DATA,
    DISPATCH,
    HIPCC,
    NS,
    NVCC,
    UNIT,
    build_runtime,
    expected,
    fake_compiler,
    sh,
    write_config,
)

from qola.core.fsutil import replace_tree
from qola.jit import cxx, layout, stubs
from qola.jit import format as fmt
from qola.jit import key as jkey
from qola.jit.cxx import CxxError
from qola.jit.key import JitCompiler
from qola.store.usage import records

EXAMPLE = """// instance: attn_fwd_d128_bf16_batch_b64x32_mask_lse
#include "attn_fwd_kernel.h"

template <>
float attn_fwd_<attn_fwd_traits_<128, bf16_t, false, 64, 32, true, true>>(const attn_fwd_args& a, qkStream_t s)
{
    return attn_fwd_launch<attn_fwd_traits_<128, bf16_t, false, 64, 32, true, true>>(a, s);
}
"""

CK = """// ck-shaped: aliases, a std::string get_name_, a void oneshot_, a namespace, an unnamed parameter
#include <string>
#include "fmha_bwd.hpp"
using fmha_dtype_0 = ck_tile::bf16_t;
using trait_0 = fmha_bwd_dq_dk_dv_traits_<128, fmha_dtype_0, false>;

template <>
float fmha_bwd_dq_dk_dv_<trait_0, ck_tile::gfx9_t>(const ck_tile::stream_config& s, fmha_bwd_args a)
{
    if(s.log_level_ > 0) { /* { in a comment } */ }
    return ck_tile::launch_kernel(s, [=](const ck_tile::stream_config& s_) { run_(s_, a); });
}

namespace inner {
template <>
void fmha_bwd_dq_dk_dv_oneshot_<trait_0, ck_tile::gfx9_t>(const ck_tile::stream_config& s, fmha_bwd_args)
{
    run_(s, "}");
}
} // namespace inner

template <>
std::string fmha_bwd_dq_dk_dv_get_name_<trait_0, ck_tile::gfx9_t>()
{
    return "fmha_bwd_d128";
}
"""

CHILD = r"""
import ctypes, json, sys
so = ctypes.CDLL(sys.argv[1])
out = {}
for n in map(int, sys.argv[2:]):
    out[n] = [so.qt_call(n, 5), so.qt_call(n, 6), so.qt_store(n, 5)]
print(json.dumps(out))
"""


# --------------------------------------------------------------------------- the rewrite


def test_the_example_copy_keeps_the_body_static_and_forwards_the_specialisation() -> None:
    copy, n = stubs.record_ahead(EXAMPLE, module="qa_libattn_fwd", unit="attn_fwd_d128_bf16_batch_b64x32_mask_lse")
    assert n == 1
    assert copy.splitlines()[0].startswith(f"// {stubs.RECORDED_MARK} attn_fwd_d128_bf16_batch_b64x32_mask_lse")
    assert '#include "qola_jit.h"\nQOLA_JIT_DECLARE_MODULE(qa_libattn_fwd)' in copy
    assert (
        "static float qola_aot_0(const attn_fwd_args& a, qkStream_t s)\n{\n"
        "    return attn_fwd_launch<attn_fwd_traits_<128, bf16_t, false, 64, 32, true, true>>(a, s);\n}" in copy
    )
    assert 'QOLA_JIT_AHEAD(qa_libattn_fwd, "attn_fwd_d128_bf16_batch_b64x32_mask_lse", 0, &qola_slot' in copy
    assert "reinterpret_cast<void*>(&qola_aot_0)" in copy and "QOLA_JIT_GET" not in copy
    assert "if(!qola_f)" not in copy  # the ahead slow path never fails
    # the copy parses: the same specialisation, now with the forwarding body
    (spec,) = cxx.find_specializations(copy)
    (orig,) = cxx.find_specializations(EXAMPLE)
    assert (spec.name, spec.targs, spec.ret, spec.param_types) == (orig.name, orig.targs, orig.ret, orig.param_types)
    assert "attn_fwd_launch" not in copy[spec.body_start : spec.end]
    # deterministic (ninja sees an unchanged file), and a copy is never rewritten again
    assert (
        stubs.record_ahead(EXAMPLE, module="qa_libattn_fwd", unit="attn_fwd_d128_bf16_batch_b64x32_mask_lse")[0] == copy
    )
    with pytest.raises(CxxError, match="already a recorded copy"):
        stubs.record_ahead(copy, module="qa_libattn_fwd", unit="u")


def test_the_ck_copy_handles_strings_voids_namespaces_and_unnamed_parameters() -> None:
    copy, n = stubs.record_ahead(CK, module="m", unit="fmha_bwd_d128")
    assert n == 3
    assert "static float qola_aot_0(const ck_tile::stream_config& s, fmha_bwd_args a)" in copy
    assert "static void qola_aot_1(const ck_tile::stream_config& s, fmha_bwd_args)" in copy
    assert "static std::string qola_aot_2()" in copy
    assert 'return "fmha_bwd_d128";' in copy and 'run_(s, "}");' in copy  # bodies kept as written
    specs = cxx.find_specializations(copy)
    assert [s.name for s in specs] == [
        "fmha_bwd_dq_dk_dv_",
        "fmha_bwd_dq_dk_dv_oneshot_",
        "fmha_bwd_dq_dk_dv_get_name_",
    ]
    assert specs[1].namespace == ("inner",)  # the static function and its forwarder stay in the namespace
    assert copy.index("static void qola_aot_1") > copy.index("namespace inner {")
    assert [s.ret for s in specs] == ["float", "void", "std::string"]
    assert copy.count('QOLA_JIT_AHEAD(m, "fmha_bwd_d128", ') == 3
    assert "using trait_0 = fmha_bwd_dq_dk_dv_traits_<128, fmha_dtype_0, false>;" in copy  # the rest as it is


def test_files_without_a_function_specialisation_are_refused_or_left_alone(tmp_path: Path) -> None:
    with pytest.raises(CxxError, match="no `template <>` function specialisation"):
        stubs.record_ahead(
            "template<> struct FmhaFwdV3Name<sel<1>> { static constexpr int n = 1; };\n", module="m", unit="asm"
        )
    with pytest.raises(CxxError, match="device function"):
        stubs.record_ahead("template <>\n__global__ void k_<int>(int x) { }\n", module="m", unit="dev")
    asm = tmp_path / "asm_v3.cpp"
    asm.write_text("template<> struct FmhaFwdV3Name<sel<1>> { static constexpr int n = 1; };\n")
    spec = layout.JitModuleSpec(module="m", lang="cxx", arch="host", compiler=JitCompiler("g++", "", ""), flags=())
    files = layout.render_jit_module(
        spec, [], out_jit=tmp_path / "jit", stub_dir=tmp_path / "b", ahead=layout.Ahead([("asm_v3", asm)])
    )
    assert files.output.ahead == ()  # compiled as it is
    assert "k_ahead" not in dict(files.sources)[files.output.table_source]


# --------------------------------------------------------------------------- a host library


def _host_lib(
    root: Path, runtime: list[Path], *, deferred: tuple[int, ...] = (), ahead: tuple[int, ...] = (1, 2)
) -> tuple[Path, dict[str, Any]]:
    """lib/libqt.so of support/jit_lib.py's units: ``ahead`` ones compiled as recorded copies, ``deferred``
    ones to the JIT (a real g++ compiles them at run time); OUT/jit only when something is deferred."""
    src = root / "src"
    (src / "include").mkdir(parents=True)
    (src / "include" / "api.h").write_text(API_H)
    files = {}
    for n in (*deferred, *ahead):
        files[n] = src / f"unit_{n}.cpp"
        files[n].write_text(UNIT.format(n=n))
    env = {"PATH": "/usr/bin:/bin", "HOME": str(root / "home"), "QOLA_JIT_CACHE_DIR": str(root / "cache")}
    jc = jkey.probe_compiler(str(fake_compiler(root)), env) if deferred else JitCompiler("g++", "", "")
    spec = layout.JitModuleSpec(
        module="tm",
        lang="cxx",
        arch="host",
        compiler=jc,
        flags=(*layout.shared_object_flags("cxx", ()), "-O1"),
        include_dirs=(src / "include",),
        manifest_name="libtm",
        build_key="a" * 64,
    )
    got = layout.render_jit_module(
        spec,
        [(f"unit_{n}", files[n]) for n in deferred],
        out_jit=root / "out" / "jit",
        stub_dir=root / "build",
        ahead=layout.Ahead([(f"unit_{n}", files[n]) for n in ahead], root / "build" / "ahead"),
    )
    for path, text in got.sources:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    if deferred:
        replace_tree(got.output.jit_dir, got.tree)
    assert [orig for orig, _ in got.output.ahead] == [files[n] for n in ahead]
    write_config(root / "build" / "include")
    (root / "build" / "dispatch.cpp").write_text(DISPATCH)
    lib = root / "out" / "lib" / f"lib{NS}.so"
    lib.parent.mkdir(parents=True)
    incs = ["-I", root / "build" / "include", "-I", DATA, "-I", DATA / "jit", "-I", src / "include"]
    copies = [copy for _, copy in got.output.ahead]
    argv: list[object] = ["g++", *CXXFLAGS, "-Wall", "-Werror", "-shared", *incs, "-x", "c++", *got.output.stub_sources]
    argv += [*copies, got.output.table_source, root / "build" / "dispatch.cpp", "-x", "none", *runtime]
    sh([*argv, "-o", lib, "-ldl", "-pthread"])
    return lib, env


def _call(lib: Path, env: dict[str, str], *units: int, **extra: str) -> dict[int, Any]:
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(lib), *map(str, units)],
        capture_output=True,
        text=True,
        env={**env, **extra},
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return {int(k): v for k, v in json.loads(proc.stdout).items()}


@pytest.fixture(scope="module")
def runtime(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return build_runtime(tmp_path_factory.mktemp("ahead-runtime"))


def test_an_ahead_unit_runs_its_own_code_and_records_once_per_process(tmp_path: Path, runtime: list[Path]) -> None:
    lib, env = _host_lib(tmp_path, runtime)
    assert not (tmp_path / "out" / "jit").exists()
    rec = tmp_path / "rec"
    # the runtime never looks at OUT/jit for an ahead unit (a missing source dir is no error), strict passes
    extra = {fmt.ENV_USAGE_DIR: str(rec), fmt.ENV_COVERAGE: "strict", fmt.ENV_SOURCE_DIR: str(tmp_path / "none")}
    got = _call(lib, env, 2, **extra)
    assert got == {2: [expected(2, 5), expected(2, 6), 5 + 2000]}  # the real bodies ran
    res = records.read(records.record_files([rec]))
    assert res.files == 1 and res.bad_lines == 0
    # both functions of unit_2 were called (three calls): one record; unit_1, never called: none
    assert [(r.event, r.module, r.md_name, r.unit, r.arch, r.build_key) for r in res.records] == [
        ("ahead", "libtm", "tm", "unit_2", "host", "a" * 64)
    ]
    assert _call(lib, env, 1, 2, **extra) == {1: [expected(1, 5), expected(1, 6), 5 + 1000], 2: got[2]}
    res = records.read(records.record_files([rec]))  # a second process records both units, once each
    assert res.files == 2 and sorted(r.unit for r in res.records) == ["unit_1", "unit_2", "unit_2"]
    assert len({r.pid for r in res.records}) == 2
    # recording off: the same calls write nothing
    assert _call(lib, env, 1, 2)[1] == [expected(1, 5), expected(1, 6), 5 + 1000]
    assert len(list(rec.iterdir())) == 2 and len(list(tmp_path.rglob(f"{fmt.USAGE_PREFIX}*"))) == 2
    assert not (tmp_path / "cache").exists()  # nothing compiled, no cache made


def test_ahead_and_deferred_units_in_one_library(tmp_path: Path, runtime: list[Path]) -> None:
    lib, env = _host_lib(tmp_path, runtime, deferred=(1,), ahead=(2,))
    rec = tmp_path / "rec"
    got = _call(lib, env, 1, 2, **{fmt.ENV_USAGE_DIR: str(rec)})
    assert got == {1: [expected(1, 5), expected(1, 6), 5 + 1000], 2: [expected(2, 5), expected(2, 6), 5 + 2000]}
    events = sorted((r.unit, r.event) for r in records.read(records.record_files([rec])).records)
    assert events == [("unit_1", "compile"), ("unit_2", "ahead")]


# --------------------------------------------------------------------------- qola build of the example tree

MANIFEST = """[qola]
namespace = "{ns}"
[build]
architectures = ["{arch}"]
[[modules]]
name = "libattn_fwd"
mode = "cpp_itfs"
[[variants]]
module = "libattn_fwd"
pattern = "attn_fwd_d64_{{dtype}}_batch_*_nlse"
options = {{dtype = "fp16"}}
{usage}"""
TWO = {"attn_fwd_d64_fp16_batch_b64x64_nmask_nlse", "attn_fwd_d64_fp16_batch_b64x64_mask_nlse"}
CALL = r"""
import ctypes, sys
sys.path.insert(0, sys.argv[2])
from attn_abi import Params as P
lib = ctypes.CDLL(sys.argv[1], mode=ctypes.RTLD_LOCAL)
f = lib.qr_libattn_fwd_attn_fwd
f.argtypes, f.restype = [ctypes.POINTER(P)], ctypes.c_int
for causal in map(int, sys.argv[3:]):
    for _ in range(3):
        print(f(ctypes.byref(P(None, None, None, None, None, None, None, 0, 0, 0, 0, 1, 64, 0.125, b"fp16", causal,
                               None))))
"""


def _build(tmp: Path, usage: str, *flags: str, arch: str = "sm_90", out: str = "out") -> Path:
    m = tmp / "q.toml"
    m.write_text(MANIFEST.format(ns="qr", arch=arch, usage=usage))
    proc = run_qola(
        "build", "--manifest", str(m), "--aiter-root", str(KERNELS), "-o", str(tmp / out), "-j", "2", *flags
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return tmp / out


def _compiled(out: Path) -> set[str]:
    text = re.sub(r"\$\n\s*", "", (Path(str(out) + ".build") / "build.ninja").read_text())
    return set(re.findall(r"^build obj/libattn_fwd/\S+: cc(?:_host)? (\S+)", text, re.M))


def test_plan_json_and_the_key_carry_the_switch(tmp_path: Path) -> None:
    m = tmp_path / "q.toml"
    m.write_text(MANIFEST.format(ns="qr", arch="sm_90", usage=""))
    got = {}
    for name, flags in (("off", ()), ("flag", ("--record-ahead",))):
        proc = run_qola("plan", "--manifest", str(m), "--aiter-root", str(KERNELS), "--json", *flags)
        assert proc.returncode == 0, proc.stderr
        got[name] = json.loads(proc.stdout)
    assert got["off"]["settings"]["record_ahead"] is False and got["flag"]["settings"]["record_ahead"] is True
    assert [x["record_ahead"] for x in got["flag"]["modules"]] == [True]
    m.write_text(MANIFEST.format(ns="qr", arch="sm_90", usage="[usage]\nrecord_ahead = true\n"))
    proc = run_qola("plan", "--manifest", str(m), "--aiter-root", str(KERNELS), "--json")
    assert json.loads(proc.stdout)["settings"]["record_ahead"] is True
    frag = tmp_path / "frag.toml"
    frag.write_text("[usage]\nrecord_ahead = true\nvariants = []\n")
    proc = run_qola("plan", "--manifest", str(m), "--aiter-root", str(KERNELS), "--usage", str(frag))
    assert proc.returncode == 2 and "holds [usage] with commit and variants only" in proc.stderr


@pytest.mark.slow
@pytest.mark.skipif(NVCC is None, reason="needs nvcc")
def test_build_records_ahead_variants_without_jit(tmp_path: Path) -> None:
    plain = _build(tmp_path, "", out="plain")
    out = _build(tmp_path, "", "--record-ahead")
    data = json.loads((out / "manifest.json").read_text())
    assert data["build_key"] != json.loads((plain / "manifest.json").read_text())["build_key"]
    mod = data["modules"][0]
    assert "jit" not in mod and not (out / "jit" / "qr_libattn_fwd").exists()  # nothing deferred, nothing published
    compiled = _compiled(out)
    copies = {Path(c).stem for c in compiled if "/jit/qr_libattn_fwd/ahead/" in c}
    assert copies == TWO and not any(Path(c).stem in TWO and "/ahead/" not in c for c in compiled)
    assert "qr_qola_usage_configure" in mod["exports"]

    rec = tmp_path / "rec"
    script = tmp_path / "call.py"
    script.write_text(CALL)

    def call(lib: Path, *causal: int, **extra: str) -> list[str]:
        p = subprocess.run(
            [sys.executable, str(script), str(lib), str(Path(__file__).parents[1] / "support"), *map(str, causal)],
            capture_output=True,
            text=True,
            env={"PATH": "/usr/bin:/bin", **extra},
            timeout=300,
        )
        assert p.returncode == 0, p.stderr
        return p.stdout.split()

    # nhead 0: the real instance's checks return ATTN_FWD_BAD_ARGS (-2); a variant not built: NO_INSTANCE
    assert call(out / "lib/qr_libattn_fwd.so", 0, QOLA_USAGE_DIR=str(rec), QOLA_JIT_COVERAGE="strict") == ["-2"] * 3
    got = records.read(records.record_files([rec]))
    assert [(r.event, r.module, r.unit, r.build_key) for r in got.records] == [
        ("ahead", "libattn_fwd", "attn_fwd_d64_fp16_batch_b64x64_nmask_nlse", data["build_key"])
    ]
    assert call(plain / "lib/qr_libattn_fwd.so", 1, QOLA_USAGE_DIR=str(tmp_path / "plainrec")) == ["-2"] * 3
    assert not (tmp_path / "plainrec").exists()  # without the switch nothing records
    proc = run_qola("usage", "cover", str(rec), "--out", str(out), "--strict")
    assert proc.returncode == 0 and "1 built ahead" in proc.stdout, proc.stdout + proc.stderr


@pytest.mark.slow
@pytest.mark.hip
@pytest.mark.skipif(HIPCC is None, reason="needs hipcc")
def test_hip_build_records_ahead_variants(tmp_path: Path) -> None:
    out = _build(tmp_path, "[usage]\nrecord_ahead = true\n", arch="gfx90a")
    assert {Path(c).stem for c in _compiled(out) if "/ahead/" in c} == TWO
    lib = out / "lib/qr_libattn_fwd.so"
    nm = sh(["nm", "-D", "--defined-only", lib]).stdout
    syms = sh(["nm", "-C", "--defined-only", lib]).stdout.splitlines()
    # each specialisation is defined once (the forwarder), its code once more as a local qola_aot_0
    specs = [ln.split(" ", 2)[2] for ln in syms if re.match(r"^\S+ [TtWw] float attn_fwd_<attn_fwd_traits_<64,", ln)]
    assert len(specs) == 2 and len(set(specs)) == 2, specs
    assert len([ln for ln in syms if "qola_aot_0" in ln]) == 2
    exports = json.loads((out / "manifest.json").read_text())["modules"][0]["exports"]
    assert "qr_libattn_fwd_attn_fwd" in nm and "qr_qola_usage_configure" in exports
    assert all(n.startswith(("qr_", "_ZN4qola2qr")) for n in exports), exports
    assert run_qola("audit", str(out)).returncode == 0


PY_MANIFEST = MANIFEST.replace('"libattn_fwd"', '"module_attn_fwd"').replace('"cpp_itfs"', '"pybind"')
PY_CALL = r"""
import importlib, sys
sys.path.insert(0, sys.argv[1])
mod = importlib.import_module("qr_module_attn_fwd")
try:
    mod.attn_fwd(0, 0, 0, 0, 0, 0, 0, 0, 1, 64, 0.125, "fp16")
    print("ok")
except ValueError:
    print("bad_args")  # ATTN_FWD_BAD_ARGS: the real instance ran its checks
"""


@pytest.mark.slow
@pytest.mark.skipif(NVCC is None, reason="needs nvcc")
def test_a_pybind_module_records_its_ahead_variants(tmp_path: Path) -> None:
    m = tmp_path / "q.toml"
    m.write_text(PY_MANIFEST.format(ns="qr", arch="sm_90", usage="[usage]\nrecord_ahead = true\n"))
    out = tmp_path / "out"
    proc = run_qola("build", "--manifest", str(m), "--aiter-root", str(KERNELS), "-o", str(out), "-j", "2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads((out / "manifest.json").read_text())
    assert data["modules"][0]["exports"] == ["PyInit_qr_module_attn_fwd"]  # the runtime stays inside
    rec = tmp_path / "rec"
    p = subprocess.run(
        [sys.executable, "-c", PY_CALL, str(out / "lib")],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", fmt.ENV_USAGE_DIR: str(rec)},
        timeout=300,
    )
    assert p.returncode == 0 and p.stdout.strip() == "bad_args", p.stdout + p.stderr
    got = records.read(records.record_files([rec])).records
    assert [(r.event, r.module, r.unit, r.build_key) for r in got] == [
        ("ahead", "module_attn_fwd", "attn_fwd_d64_fp16_batch_b64x64_nmask_nlse", data["build_key"])
    ]


@pytest.mark.aiter
@pytest.mark.slow
def test_every_real_ck_fmha_instance_has_a_recorded_copy_that_parses(ck_fmha_600: Path) -> None:
    """Every fwd and bwd instance CK's generate.py writes for receipt 600 (conftest, once a session)."""
    files = [p for p in sorted(ck_fmha_600.rglob("*.cpp")) if not p.stem.endswith("_api")]
    assert len(files) > 20
    rets = set()
    for p in files:
        text = p.read_text()
        orig = cxx.find_specializations(text)
        if not orig:
            continue
        copy, n = stubs.record_ahead(text, module="m", unit=p.stem)
        got = cxx.find_specializations(copy)
        assert n == len(orig) == len(got) == len(re.findall(r"^static [^\n(]* qola_aot_\d+\(", copy, re.M))
        assert [(s.name, s.targs, s.ret, s.param_types, s.namespace) for s in got] == [
            (s.name, s.targs, s.ret, s.param_types, s.namespace) for s in orig
        ]
        rets |= {s.ret for s in orig}
    assert {"float", "void", "std::string"} <= rets  # fwd/bwd kernels, bwd oneshot_ and get_name_


@pytest.mark.rocm
@pytest.mark.aiter
@pytest.mark.ck
@pytest.mark.slow
def test_a_real_ck_forward_kernel_compiles_as_a_recorded_copy(aiter_root: Path, tmp_path: Path) -> None:
    """One CK fMHA forward kernel of TE's libmha_fwd for gfx942 (test_rocm_aiter's slice), without
    [jit], built with --record-ahead by hipcc: the copy compiles, the dispatch links against its
    forwarder (defined once), the asm v3 dispatch file (class specialisations) stays as it is."""
    from support.rocm_aiter import NS as TE_NS
    from support.rocm_aiter import build as te_build
    from support.rocm_aiter import manifest as te_manifest

    proc, out = te_build(
        tmp_path, aiter_root, te_manifest(tmp_path / "one.toml", TE_NS, ("gfx942",)), "out", "--record-ahead"
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-6000:]
    text = re.sub(r"\$\n\s*", "", (tmp_path / "out.build" / "build.ninja").read_text())
    compiled = re.findall(r"^build obj/libmha_fwd/\S+: cc(?:_host)? (\S+)", text, re.M)
    copies = [Path(c).stem for c in compiled if f"/jit/{TE_NS}_libmha_fwd/ahead/" in c]
    assert len(copies) == 1 and copies[0].startswith("fmha_fwd_d32_") and copies[0].endswith("_gfx9"), compiled
    assert any(Path(c).stem == "asm_fmha_fwd_v3_gfx942" and "/ahead/" not in c for c in compiled)
    syms = sh(["nm", "-C", "--defined-only", out / "lib" / f"{TE_NS}_libmha_fwd.so"]).stdout.splitlines()
    fwd = [ln for ln in syms if re.match(r"^\S+ [TtWw] float fmha_fwd_<", ln)]
    assert len(fwd) == 1, fwd
    assert any("qola_aot_0" in ln for ln in syms)
    assert run_qola("audit", str(out)).returncode == 0
