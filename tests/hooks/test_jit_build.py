"""Issue 6 in `qola build`: [jit] builds the [jit.aot] variants ahead and defers every other
instance (stubs + runtime in the library, sources in OUT/jit/<md_name>); calls of a deferred
variant compile it once, later processes hit the cache. CPU only: batch = 0 returns before any
launch, nhead_q = 0 returns ATTN_FWD_BAD_ARGS (-2) from the real instance; a stub that cannot get
its function returns -1."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support.attn_abi import child_preamble
from support.common import KERNELS, run_qola
from support.jit_lib import HIPCC, NVCC
from support.jit_manifests import AOT_TWO, TWO

from qola.commands.common import prepare
from qola.core.errors import QolaError
from qola.hooks import jit as jitbuild
from qola.output.publish import publish_tree
from qola.pipeline.spec import Prepared
from qola.plan.manifest import parse
from qola.plan.model import JitSplit

GEN = KERNELS / "csrc" / "attn" / "generate.py"
AOT_FOUR = AOT_TWO.replace("mask = false, ", "mask = [false, true], ")
FOUR = TWO | {"attn_fwd_d64_fp16_batch_b64x64_mask_nlse", "attn_fwd_d64_fp16_batch_b64x64_mask_lse"}

CALL = r"""
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1], mode=ctypes.RTLD_LOCAL)
f = lib.qj_libattn_fwd_attn_fwd
f.argtypes, f.restype = [ctypes.POINTER(P)], ctypes.c_int
lib.qj_qola_jit_last_error.restype = ctypes.c_char_p
dtype, hdim, nhead, causal = sys.argv[2].encode(), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
p = P(None, None, None, None, None, None, None, 0, 0, 0, nhead, max(nhead, 1), hdim, 0.125, dtype, causal, None)
print(f(ctypes.byref(p)), lib.qj_qola_jit_last_error().decode())
"""

COUNTING = """#!/bin/sh
if [ "$1" = "--version" ]; then exec {real} --version; fi
echo "$$" >> {count}
exec {real} "$@"
"""


def manifest(path: Path, jit: str, arch: str = "sm_90", link: str = "shared") -> Path:
    path.write_text(
        f'[qola]\nnamespace = "qj"\n[build]\narchitectures = ["{arch}"]\nlink = "{link}"\n'
        f'[[modules]]\nname = "libattn_fwd"\nmode = "cpp_itfs"\n{jit}'
    )
    return path


def all_instances() -> set[str]:
    out = Path(os.environ.get("TMPDIR", "/tmp")) / f"qola-jit-list-{os.getpid()}.txt"
    subprocess.run([sys.executable, str(GEN), "-d", "fwd", "--receipt", "0", "--list_blobs", str(out)], check=True)
    names = {Path(line).stem for line in out.read_text().split()}
    out.unlink()
    return names - {"attn_fwd_api"}


def compiled_sources(build_dir: Path, module: str = "libattn_fwd") -> set[str]:
    """Stems of the sources build.ninja compiles with the device compiler for ``module``."""
    text = re.sub(r"\$\n\s*", "", (build_dir / "build.ninja").read_text())  # ninja's line continuations
    return {Path(m).stem for m in re.findall(rf"^build obj/{module}/\S+: cc(?:_host)? (\S+)", text, re.M)}


def build(
    tmp: Path, jit: str, *flags: str, arch: str = "sm_90", out: Path | None = None, link: str = "shared"
) -> tuple[Path, Path]:
    m = manifest(tmp / "q.toml", jit, arch, link)
    out = out or tmp / "out"
    proc = run_qola("build", "--manifest", str(m), "--aiter-root", str(KERNELS), "-o", str(out), "-j", "2", *flags)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out, Path(str(out) + ".build")


# --------------------------------------------------------------------------- fast


def test_manifest_shape_and_errors() -> None:
    m = parse(
        f'[jit]\nmodules = ["libattn_fwd"]\n{AOT_TWO.replace("[jit]", "")}\n'
        '[[jit.aot.mha_fwd_variants]]\ndtype = "bf16"\n'
    )
    assert m.jit is not None and m.jit.enabled and m.jit.modules == ["libattn_fwd"]
    assert m.jit.aot.variants[0].options["lse"] == [False, True] and m.jit.aot.mha_fwd_variants[0].dtype == "bf16"
    empty = parse("[jit]\n").jit
    assert empty is not None and empty.aot.variants == [] and parse("").jit is None
    with pytest.raises(QolaError, match=r"jit\.aot\.variant: unknown key; did you mean 'variants'"):
        parse("[jit]\n[[jit.aot.variant]]\nmodule = 'x'\npattern = '*'\n")


def _prepared(tmp: Path, jit: str) -> Prepared:
    m = manifest(tmp / "q.toml", jit)
    args = argparse.Namespace(manifest=str(m), aiter_root=str(KERNELS), archs=None, mode=None, allow_unpinned=True)
    return prepare(args, dict(os.environ))


def test_plan_jit_selects_the_aot_instances(tmp_path: Path) -> None:
    prep = _prepared(tmp_path, AOT_TWO)
    (mod,) = jitbuild.plan_jit(prep.plan, prep.manifest, dict(os.environ)).modules
    assert mod.jit == JitSplit(tuple(sorted(TWO)), declared=True, style="example_attn")
    # [jit] without aot: everything deferred; enabled = false or no [jit]: nothing changes
    prep = _prepared(tmp_path, "[jit]\n")
    assert jitbuild.plan_jit(prep.plan, prep.manifest, {}).modules[0].jit == JitSplit((), False, "example_attn")
    for text in ("[jit]\nenabled = false\n", ""):
        prep = _prepared(tmp_path, text)
        assert jitbuild.plan_jit(prep.plan, prep.manifest, {}) == prep.plan
        assert prep.plan.modules[0].jit is None


@pytest.mark.parametrize(
    "text, switch, deferred",
    [("", "on", True), (AOT_TWO, "on", True), ("[jit]\nenabled = false\n", "on", True), (AOT_TWO, "off", False)],
)
def test_jit_switch_of_the_command_line(tmp_path: Path, text: str, switch: str, deferred: bool) -> None:
    """``--jit on|off`` (TE's CK_JIT switch, cmake/QoLA.cmake ``QOLA_JIT``): on gives a manifest without
    [jit] an empty one (everything deferred) and keeps a manifest's own [jit.aot]; off builds all ahead."""
    m = manifest(tmp_path / "q.toml", text)
    args = argparse.Namespace(
        manifest=str(m), aiter_root=str(KERNELS), archs=None, mode=None, allow_unpinned=True, jit=switch
    )
    prep = prepare(args, dict(os.environ))
    assert prep.manifest.jit is not None and prep.manifest.jit.enabled is deferred
    (mod,) = jitbuild.plan_jit(prep.plan, prep.manifest, dict(os.environ)).modules
    aot = tuple(sorted(TWO)) if "jit.aot" in text else ()
    assert mod.jit == (JitSplit(aot, bool(aot), "example_attn") if deferred else None)


@pytest.mark.parametrize(
    "jit, message",
    [
        ('[jit]\nmodules = ["nope"]\n', "jit.modules: module 'nope' is not built"),
        (AOT_TWO.replace("hdim = 64", "hdim = 96"), "jit.aot.variants[0] {hdim=96, "),
        (AOT_TWO.replace('module = "libattn_fwd"', 'module = "other"'), "module 'other' is not built"),
    ],
)
def test_plan_jit_user_errors(tmp_path: Path, jit: str, message: str) -> None:
    prep = _prepared(tmp_path, jit)
    with pytest.raises(QolaError) as exc:
        jitbuild.plan_jit(prep.plan, prep.manifest, dict(os.environ))
    assert message in exc.value.message


def test_portable_flags_drop_build_machine_paths() -> None:
    flags = [
        "-O3",
        "-I/b/include",
        "-I",
        "/x",
        "-isystem",
        "/y",
        "-ccbin",
        "/usr/bin/g++-12",
        "-DX=1",
        "-Xcompiler",
        "-fPIC",
        "-isystem/z",
    ]
    assert jitbuild.portable_flags(flags) == ["-O3", "-DX=1", "-Xcompiler", "-fPIC"]


def test_publish_tree_mirrors_and_removes(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "out" / "jit" / "m"
    (src / "src").mkdir(parents=True)
    (src / "index.json").write_text("{}")
    (src / "src" / "a.cu").write_text("a")
    (dst / "src").mkdir(parents=True)
    (dst / "src" / "stale.cu").write_text("old")
    (dst / "old").mkdir()
    publish_tree(src, dst)
    assert sorted(str(p.relative_to(dst)) for p in dst.rglob("*")) == ["index.json", "src", "src/a.cu"]
    assert not list(dst.parent.glob(".*"))  # no temp files left
    publish_tree(None, dst)
    assert not dst.exists()


# --------------------------------------------------------------------------- builds


@pytest.mark.slow
@pytest.mark.skipif(NVCC is None, reason="needs nvcc")
def test_build_defers_all_but_aot_and_runtime_compiles_once(tmp_path: Path) -> None:
    out, bdir = build(tmp_path, AOT_TWO)
    everything = all_instances()
    assert len(everything) == 48
    # the library compiles exactly the AOT instances + the dispatch + the wrapper + the stubs
    compiled = compiled_sources(bdir)
    assert compiled == TWO | {"attn_fwd_api", "attn_fwd_itfs", "qola_jit_stubs_qj_libattn_fwd_0"}, compiled
    index = json.loads((out / "jit/qj_libattn_fwd/index.json").read_text())
    assert {u["name"] for u in index["units"]} == everything - TWO
    assert sorted(p.stem for p in (out / "jit/qj_libattn_fwd/src").iterdir()) == sorted(everything - TWO)
    assert not any("-I/" in f or str(bdir) in f for f in index["flags"])  # nothing of the build machine
    data = json.loads((out / "manifest.json").read_text())
    rec = data["modules"][0]
    assert rec["status"] == "built" and rec["jit"]["dir"] == "jit/qj_libattn_fwd"
    assert set(rec["jit"]["aot"]["names"]) == TWO and rec["jit"]["deferred"]["count"] == 46
    assert set(rec["instances"]["names"]) == everything | {"attn_fwd_api"}  # every generated file
    assert all(n.startswith(("qj_", "_ZN4qola2qj")) for n in rec["exports"]), rec["exports"]
    assert "qj_qola_jit_last_error" in rec["exports"]
    assert run_qola("audit", str(out)).returncode == 0
    assert not list(out.rglob(".*tmp*"))

    cc = tmp_path / "countcc"
    cc.write_text(COUNTING.format(real=NVCC, count=tmp_path / "count"))
    cc.chmod(0o755)
    (tmp_path / "call.py").write_text(child_preamble() + CALL)
    env = {**os.environ, "QOLA_JIT_CACHE_DIR": str(tmp_path / "cache"), "QOLA_JIT_COMPILER": str(cc)}

    def call(dtype: str, hdim: int, nhead: int, causal: int = 0, **extra: str) -> str:
        argv = [sys.executable, str(tmp_path / "call.py"), str(out / "lib/qj_libattn_fwd.so"), dtype, str(hdim)]
        proc = subprocess.run(
            [*argv, str(nhead), str(causal)],
            capture_output=True,
            text=True,
            env={**env, **extra},
            timeout=600,
        )
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.strip()

    def compiles() -> int:
        count = tmp_path / "count"
        return len(count.read_text().split()) if count.exists() else 0

    assert call("fp16", 64, 0) == "-2" and compiles() == 0  # an AOT instance: no compile
    assert call("bf16", 128, 1) == "0" and compiles() == 1  # deferred: compiled, ran (batch 0: OK)
    assert call("bf16", 128, 0) == "-2" and compiles() == 1  # new process: cache hit, the real checks ran
    first = call("fp32", 64, 1, QOLA_JIT="0")  # another deferred unit, compiling forbidden: the stub's -1
    assert first.startswith("-1 ") and "QOLA_JIT=0 forbids" in first and compiles() == 1

    # a second build into the same OUT with more variants ahead: OUT/jit mirrors it (no stale sources)
    out2, bdir2 = build(tmp_path, AOT_FOUR, out=out)
    assert compiled_sources(bdir2) >= FOUR
    assert sorted(p.stem for p in (out2 / "jit/qj_libattn_fwd/src").iterdir()) == sorted(everything - FOUR)
    rec = json.loads((out2 / "manifest.json").read_text())["modules"][0]
    assert rec["jit"]["deferred"]["count"] == 44
    assert call("bf16", 128, 0) == "-2" and compiles() == 1  # same unit, same key: still cached


@pytest.mark.slow
@pytest.mark.skipif(NVCC is None, reason="needs nvcc")
def test_static_archive_keeps_the_runtime_local(tmp_path: Path) -> None:
    out, bdir = build(tmp_path, AOT_TWO, link="static")
    assert (out / "lib/qj_libattn_fwd.a").is_file() and (out / "jit/qj_libattn_fwd/index.json").is_file()
    nm = subprocess.run(
        ["nm", "--defined-only", str(out / "lib/qj_libattn_fwd.a")], capture_output=True, text=True, check=True
    ).stdout
    glob = [ln.split()[-1] for ln in nm.splitlines() if re.match(r"^\S+ [A-TV-Z] ", ln)]
    assert glob and all(n.startswith(("qj_", "_ZN4qola2qj")) for n in glob), glob
    assert "qola_jit_table" in (bdir / "link/libattn_fwd/qj_libattn_fwd.objs.rsp").read_text()


@pytest.mark.slow
@pytest.mark.hip
@pytest.mark.skipif(HIPCC is None, reason="needs hipcc")
def test_hip_gfx90a_build(tmp_path: Path) -> None:
    out, bdir = build(tmp_path, AOT_TWO, arch="gfx90a")
    index = json.loads((out / "jit/qj_libattn_fwd/index.json").read_text())
    assert index["lang"] == "hip" and index["arch"] == "gfx90a" and len(index["units"]) == 46
    assert "--offload-arch=gfx90a" in index["flags"] and "-x" in index["flags"]
    assert compiled_sources(bdir) == TWO | {"attn_fwd_api", "attn_fwd_itfs", "qola_jit_stubs_qj_libattn_fwd_0"}
    assert run_qola("audit", str(out)).returncode == 0


PY_CALL = r"""
import importlib, sys
sys.path.insert(0, sys.argv[1])
mod = importlib.import_module("qj_module_attn_fwd")
try:
    mod.attn_fwd(0, 0, 0, 0, 0, 0, 0, int(sys.argv[4]), 1, int(sys.argv[3]), 0.125, sys.argv[2])
    print("ok")
except ValueError:
    print("bad_args")  # ATTN_FWD_BAD_ARGS: the real instance ran its checks
except RuntimeError as exc:
    print("error", exc)
"""


@pytest.mark.slow
@pytest.mark.skipif(NVCC is None, reason="needs nvcc")
def test_pybind_module_calls_a_deferred_variant(tmp_path: Path) -> None:
    m = tmp_path / "q.toml"
    m.write_text(
        '[qola]\nnamespace = "qj"\n[build]\narchitectures = ["sm_90"]\n'
        '[[modules]]\nname = "module_attn_fwd"\nmode = "pybind"\n'
        + AOT_TWO.replace('"libattn_fwd"', '"module_attn_fwd"')
    )
    out = tmp_path / "out"
    proc = run_qola("build", "--manifest", str(m), "--aiter-root", str(KERNELS), "-o", str(out), "-j", "2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rec = json.loads((out / "manifest.json").read_text())["modules"][0]
    assert rec["exports"] == ["PyInit_qj_module_attn_fwd"] and rec["jit"]["deferred"]["count"] == 46
    cc = tmp_path / "countcc"
    cc.write_text(COUNTING.format(real=NVCC, count=tmp_path / "count"))
    cc.chmod(0o755)
    (tmp_path / "call.py").write_text(PY_CALL)
    env = {**os.environ, "QOLA_JIT_CACHE_DIR": str(tmp_path / "cache"), "QOLA_JIT_COMPILER": str(cc)}

    def call(dtype: str, hdim: int, nhead: int, **extra: str) -> str:
        p = subprocess.run(
            [sys.executable, str(tmp_path / "call.py"), str(out / "lib"), dtype, str(hdim), str(nhead)],
            capture_output=True,
            text=True,
            env={**env, **extra},
            timeout=600,
        )
        assert p.returncode == 0, p.stderr
        return p.stdout.strip()

    assert call("bf16", 128, 1, QOLA_JIT="0").startswith("error attn_fwd: no instance")  # the stub's -1
    assert call("bf16", 128, 1) == "ok" and len((tmp_path / "count").read_text().split()) == 1
    assert call("bf16", 128, 0) == "bad_args" and len((tmp_path / "count").read_text().split()) == 1


def test_split_defers_function_specialisations_only(tmp_path: Path) -> None:
    """A generated file that specialises only class templates (AITER's asm v3 dispatch:
    ``template<> struct FmhaFwdV3Name<…>``) is no instance: it stays in the library, not in the JIT."""
    import dataclasses

    from qola.hooks.jit import split
    from qola.plan.model import JitSplit, ModulePlan

    kernel = tmp_path / "fmha_fwd_d32_x_gfx9.cpp"
    kernel.write_text("template <>\nfloat fmha_fwd_<trait_, ck_tile::gfx9_t>(const S& s, A a) { return 0; }\n")
    asm = tmp_path / "asm_fmha_fwd_v3_gfx942.cpp"
    asm.write_text(
        'template<> struct FmhaFwdV3Name<sel<1>> { static constexpr const char* n = "x"; };\n'
        "namespace gfx942 { float fmha_fwd_v3(int t) { return t; } }\n"
    )
    api = tmp_path / "fmha_fwd_api.cpp"
    api.write_text("template <>\nfloat f_<int>(int) { return 0; }\n")
    fields: dict[str, Any] = {
        f.name: ()
        for f in dataclasses.fields(ModulePlan)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    }
    mod = dataclasses.replace(ModulePlan(**{**fields, "name": "m", "md_name": "m"}), jit=JitSplit((), False, "ck", "0"))
    aot, deferred = split(mod, [str(kernel), str(asm), str(api)])
    assert deferred == (str(kernel),)
    assert set(aot) == {"asm_fmha_fwd_v3_gfx942"}
