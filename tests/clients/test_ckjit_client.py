"""ROCm/ck-jit's call form (``ck_jit_build.py full --with-qola``) against a double that acts as ck-jit
does (tests/support/ckjit_fake.py, after ck-jit's parse rule in tests/support/ckjit_rule.py):
``sys.executable -m qola.cli build --manifest M --aiter-root A --output-dir O --arch <archs>
--skip-checkout`` run with ``cwd=<qola checkout>``, no PYTHONPATH, ``ROCM_PATH`` at a fake ROCm whose
``bin/hipcc`` and ``$CXX`` are the interceptor. The tree is the project's own fixture in the shape of
TE's AITER (``libmha_fwd``'s cpp_itfs API) with a generator that writes CK-style instances and an
``fmha_fwd_api.cpp`` dispatch into its output dir, as CK's does.

What must happen, as with ck-jit: each instance is recorded and stubbed, the dispatch compiled and
recorded as an API file, the wrapper compiled for real, and the ``te_libmha_fwd.so`` link taken over
by the post-build with the real objects, the version script and the archs. On the old compile line
(``-MT obj``) the double reads the object as the source and the build fails (exit 3)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from subprocess import CompletedProcess

import pytest
from support import fixes_tree
from support import itfs_fixture as fx
from support.ckjit_fake import fake_rocm, records
from support.ckjit_replay import archs_named, defined_functions, install, replay_all
from support.ckjit_rule import SYMBOL_PREFIX
from support.cmake_clients import plain_checkout
from support.common import compile_commands, run_qola
from support.libdata import kernels_by_arch

pytestmark = [pytest.mark.hip, pytest.mark.slow]

ARCH = "gfx90a"  # what Debian 12's hipcc (CI's host) compiles for

# CK's fMHA generator in small: instances and a dispatch calling them; HINTS (prepended by the test)
# writes the line ck-jit's codegen patch adds before each dispatch call (``//jit_kernel: <file>``).
# Each instance is shaped as CK's: a device kernel and an explicit specialisation of ``fmha_fwd_<>``
# (the symbol ck-jit's runtime resolves: ``_Z9fmha_fwd_I…``), declared in a header of the tree's
# include dir (which ck-jit's install copies beside the blobs, as it does CK's)
INSTANCE_HEADER = "template <typename Traits> float fmha_fwd_(int x);\n"
GENERATOR = """import argparse, pathlib
p = argparse.ArgumentParser()
p.add_argument("--output_dir", required=True)
out = pathlib.Path(p.parse_args().output_dir)
out.mkdir(parents=True, exist_ok=True)
kernels = ["fmha_fwd_d64_bf16_batch_b128_gfx9", "fmha_fwd_d128_bf16_batch_b128_gfx9"]
lines = []
for i, k in enumerate(kernels):
    (out / (k + ".cpp")).write_text(
        '#include <hip/hip_runtime.h>\\n#include "fmha_fwd_instance.hpp"\\n'
        "struct %s_traits {};\\n" % k
        + "__global__ void %s_kernel(float* o, int x) { *o = float(x * %d); }\\n" % (k, i + 2)
        + "template <> float fmha_fwd_<%s_traits>(int x) { return float(x * %d); }\\n" % (k, i + 2)
        + "float %s_run(int x) { return fmha_fwd_<%s_traits>(x); }\\n" % (k, k))
    lines.append("float %s_run(int);" % k)
lines.append("float fmha_fwd_dispatch(int d, int x) {")
for d, k in zip((64, 128), kernels):
    if HINTS:
        lines.append("//jit_kernel: %s.cpp" % k)
    lines.append("    if (d == %d) return %s_run(x);" % (d, k))
lines += ["    return -1;", "}"]
(out / "fmha_fwd_api.cpp").write_text("\\n".join(lines) + "\\n")
"""

MANIFEST = f"""[qola]
namespace = "te"

[build]
architectures = ["{ARCH}"]
mode = "cpp_itfs"

[[modules]]
name = "libmha_fwd"
blob_gen_cmd = ["csrc/cpp_itfs/gen_fwd.py --output_dir {{}}"]
"""


def _build_under_ckjit(tmp_path: Path, hints: bool) -> tuple[CompletedProcess[str], Path, Path, Path]:
    tree = fx.write_tree(tmp_path / "aiter", "new")
    (tree / "csrc" / "cpp_itfs" / "gen_fwd.py").write_text(f"HINTS = {int(hints)}\n" + GENERATOR)
    (tree / "csrc" / "include" / "fmha_fwd_instance.hpp").write_text(INSTANCE_HEADER)
    (tmp_path / "qola_manifest.toml").write_text(MANIFEST)
    plain_checkout(tmp_path)
    return _run_under_ckjit(tmp_path)


def _run_under_ckjit(tmp_path: Path, **more_env: str) -> tuple[CompletedProcess[str], Path, Path, Path]:
    """ck-jit's ``full --with-qola`` on the tree, manifest and qola checkout under ``tmp_path``: its
    scratch dir cleared and its fake ROCm made anew (as every ``full`` does), qola run as it runs it
    (``more_env`` added to the environment)."""
    tree, m, qola_dir = tmp_path / "aiter", tmp_path / "qola_manifest.toml", tmp_path / "3rdparty" / "QoLA"
    shutil.rmtree(tmp_path / "ck_jit_tmp", ignore_errors=True)
    hipcc = shutil.which("hipcc") or "/usr/bin/hipcc"
    rocm, ck = fake_rocm(tmp_path, hipcc, "c++", tree)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "HIPCC", "HIP_PATH")}
    env.update(ck, HIP_PLATFORM="amd", **more_env)
    out = tmp_path / "jit" / "qola"
    argv = ["build", "--manifest", str(m), "--aiter-root", str(tree)]
    argv += ["--output-dir", str(out), "--arch", ARCH, "--skip-checkout", "-j", "2"]
    proc = run_qola(*argv, entry="qola.cli", cwd=qola_dir, env=env, whole_env=True)
    return proc, out, rocm, Path(ck["CK_JIT_TMP_DIR"])


def test_ckjit_takes_every_blob_the_api_and_the_link(tmp_path: Path) -> None:
    proc, out, rocm, tmp = _build_under_ckjit(tmp_path, hints=True)
    calls = records(tmp, "calls.ndjson")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:] + json.dumps(calls[-5:])

    blobs = {Path(c["source"]).name: c for c in calls if c["kind"] == "blob"}
    assert set(blobs) == {"fmha_fwd_d64_bf16_batch_b128_gfx9.cpp", "fmha_fwd_d128_bf16_batch_b128_gfx9.cpp"}
    build = Path(str(out) + ".build")
    for c in blobs.values():  # stubbed: ck-jit wrote zero bytes where the object would be, which qola
        assert not (build / c["output"]).exists()  # removed once linked (never up to date: see below)
    recorded = records(tmp, "manifest.json.ndjson")
    assert sorted(Path(e["source"]).name for e in recorded if e["kind"] == "blob") == sorted(blobs)
    for e in recorded:  # what ck-jit compiles later: the instance's flags, without source and object
        assert f"--offload-arch={ARCH}" in e["argv"] and "-c" not in e["argv"] and "-o" not in e["argv"]
    assert [(Path(e["source"]).name, e["rewritten"]) for e in recorded if e["kind"] == "api"] == [
        ("fmha_fwd_api_jit.cpp", 2)
    ]
    assert any(c["kind"] == "compile" and "qola_libmha_fwd_itfs" in c["source"] for c in calls)

    post = [c for c in calls if c["kind"] == "post_build" and "objects" in c]
    assert len(post) == 1 and post[0]["output"].endswith("lib/te_libmha_fwd.so"), post
    objs = [Path(o).name for o in post[0]["objects"]]
    assert any(o.startswith("fmha_fwd_api-") for o in objs) and any(o.startswith("qola_libmha_fwd_itfs") for o in objs)
    assert not any(o.startswith("fmha_fwd_d") for o in objs)  # the stubs stay out
    assert any("--version-script" in f for f in post[0]["ld_flags"]) and post[0]["arch"] == [f"--offload-arch={ARCH}"]

    # TE's build log says what the wrapper did (issue 39): the stubs it left and where its words are
    said = proc.stdout + proc.stderr
    assert "libmha_fwd: 2 of " in said and "objects are empty (0 bytes)" in said, said[-3000:]
    assert str(out / "logs" / "libmha_fwd.log") in said and "$CK_JIT_TMP_DIR/manifest.json.ndjson" in said
    data = json.loads((out / "manifest.json").read_text())
    assert [x["status"] for x in data["modules"]] == ["built"]
    assert str(rocm / "bin" / "hipcc") in json.dumps(data["toolchain"])  # recorded as the compiler used
    nm = subprocess.run(
        ["nm", "-D", "--defined-only", str(out / "lib" / "te_libmha_fwd.so")], capture_output=True, text=True
    )
    assert "_ZN4qola2te7mha_fwd" in nm.stdout and "fmha_fwd_dispatch" not in nm.stdout  # isolated still


def test_a_library_that_cannot_reach_its_kernels_fails(tmp_path: Path) -> None:
    """Without the codegen hints (a CK that ck-jit's patch does not fit: the amd-aiter sdist's) the
    dispatch still calls the kernels, whose objects are stubs: ck-jit's post-build links the library
    all the same (``--allow-shlib-undefined``); qola reads it back and fails the module, naming the
    kernels nothing defines, instead of publishing a library that fails in TE's link or dlopen."""
    proc, out, _, tmp = _build_under_ckjit(tmp_path, hints=False)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert any(c["kind"] == "post_build" and "objects" in c for c in records(tmp, "calls.ndjson"))
    text = proc.stdout + proc.stderr
    assert "defined by nothing it loads" in text, text[-3000:]
    assert "fmha_fwd_d64_bf16_batch_b128_gfx9_run(int)" in text, text[-3000:]
    assert not (out / "lib" / "te_libmha_fwd.so").exists()


def test_every_recorded_kernel_compiles_later_elsewhere_with_the_build_dir_gone(tmp_path: Path) -> None:
    """The rest of ck-jit's life (issue 39): what its interceptor recorded is installed as its build
    installs it, then, with qola's output, build dir and the AITER tree moved away, each kernel is
    compiled as its runtime does at first use (``ck_jit_compile.sh``, from the install's root, the
    flags word-split from one string) and as TE's CI prebuild does (``ck_jit_prebuild.py build``,
    started in an empty directory). Each library must export the function ck-jit's runtime resolves
    (``_Z9fmha_fwd_I…``) and hold device code for every arch its flags name. qola's old compile lines
    (``-MD -MF obj/<module>/<file>.o.d``) failed every replay: "error opening 'obj/libmha_fwd/…'"."""
    proc, out, _, tmp = _build_under_ckjit(tmp_path, hints=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    tree = tmp_path / "aiter"
    kernels = install(tmp / "manifest.json.ndjson", tree, tmp_path / "install" / "ck_jit")
    assert sorted(k.name for k in kernels) == [
        "fmha_fwd_d128_bf16_batch_b128_gfx9.cpp",
        "fmha_fwd_d64_bf16_batch_b128_gfx9.cpp",
    ]
    gone = tmp_path / "gone"
    gone.mkdir()
    for p in (out, Path(str(out) + ".build"), tree):
        p.rename(gone / p.name)
    hipcc = os.path.realpath(shutil.which("hipcc") or "/usr/bin/hipcc")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CK_JIT", "ROCM_"))} | {"HIP_PLATFORM": "amd"}
    done = replay_all(kernels, tmp_path / "install" / "ck_jit", tmp_path / "replay", hipcc, env)
    for k in kernels:
        assert archs_named(k) == [ARCH], k.argv
        for how in ("runtime", "prebuild"):
            lib = done[k.name][how]
            assert isinstance(lib, Path), f"{k.name} ({how}) did not compile:\n{lib}\nflags: {k.argv}"
            assert [s for s in defined_functions(lib) if s.startswith(SYMBOL_PREFIX["fwd"])], (how, lib)
            stem = k.name.split(".")[0]
            assert f"_Z{len(stem) + 7}{stem}_kernelPfi" in kernels_by_arch(lib).get(ARCH, set()), (how, lib)


def test_a_rebuild_hands_every_stub_to_ck_jit_again(tmp_path: Path) -> None:
    """ck-jit's ``full`` clears its scratch dir (its records) before every run and links each library
    from what its interceptor saw in that run. A second ``full`` with the same qola output (a second
    ``cmake --build``) found qola's stubs up to date: nothing was recorded, ck-jit's runtime was built
    over an empty kernel table and the build failed (measured with ck-jit 617a89b, issue 39). An empty
    object is no compiled code: qola removes it once linked and never takes it as up to date, and a
    build over a wrapper's stubs leaves no no-op record, so every stub reaches the wrapper again."""
    first, out, _, _ = _build_under_ckjit(tmp_path, hints=True)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-6000:]
    before = (out / "lib" / "te_libmha_fwd.so").read_bytes()
    again, out2, _, tmp2 = _run_under_ckjit(tmp_path)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-6000:]
    assert out2 == out and "is up to date" not in again.stderr
    recorded = records(tmp2, "manifest.json.ndjson")
    assert sorted(Path(e["source"]).name for e in recorded if e["kind"] == "blob") == [
        "fmha_fwd_d128_bf16_batch_b128_gfx9.cpp",
        "fmha_fwd_d64_bf16_batch_b128_gfx9.cpp",
    ]
    assert [c for c in records(tmp2, "calls.ndjson") if c["kind"] == "post_build" and "objects" in c]
    assert (out / "lib" / "te_libmha_fwd.so").read_bytes() == before  # the same library, linked anew


def test_on_a_fixed_tree_the_recorded_kernels_name_the_tree_and_replay_with_the_build_dir_gone(tmp_path: Path) -> None:
    """qola's fixes (qola/plan/fixes.py) stage each tree dir that holds a fixed file in the build dir
    (``fixed/``). Only a unit that can read a fixed file compiles from there (here the wrapper, which
    includes the fixed ``aiter_hip_common.h``); every other unit names the tree's paths, as without
    fixes: the kernels ck-jit records (its install copies the tree's include dirs their lines name,
    never a build dir's) replay later with qola's build dir gone. When every unit of a module that
    reads a fixed file took the staged ``-I``, both kernels' lines named ``<out>.build/fixed/csrc/include``,
    ck-jit's install copied no include dir and every replay failed: 'fmha_fwd_instance.hpp' file not found."""
    tree = fx.write_tree(tmp_path / "aiter", "new")
    (tree / "csrc" / "cpp_itfs" / "gen_fwd.py").write_text("HINTS = 1\n" + GENERATOR)
    (tree / "csrc" / "include" / "fmha_fwd_instance.hpp").write_text(INSTANCE_HEADER)
    (tree / "csrc" / "include" / "aiter_hip_common.h").write_text(fixes_tree.COMMON)  # the pin's loader shape
    wrapper = tree / "csrc" / "cpp_itfs" / "mha_fwd.cu"
    wrapper.write_text('#include "aiter_hip_common.h"\n' + wrapper.read_text())
    (tmp_path / "qola_manifest.toml").write_text(MANIFEST)
    plain_checkout(tmp_path)
    proc, out, _, tmp = _run_under_ckjit(tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    fixes = json.loads((out / "manifest.json").read_text())["fixes"]
    assert [(f["name"], f["status"], f["modules"]) for f in fixes if f["status"] != "absent"] == [
        ("asm-embedded-first", "applied", ["libmha_fwd"])
    ]
    build = Path(str(out) + ".build")
    lines = {os.path.basename(u["file"]): u["command"] for u in compile_commands(build)}
    staged = f"-I{build / 'fixed' / 'csrc' / 'include'}"
    assert staged in lines["mha_fwd.cu"].split(), lines["mha_fwd.cu"]  # the wrapper reads the fixed header
    assert [n for n, line in lines.items() if staged in line.split()] == ["mha_fwd.cu"], lines
    fixed = (build / "fixed" / "csrc" / "include" / "aiter_hip_common.h").read_text()
    assert (
        "qola_asm_dir_first" in fixed
        and "qola_asm_dir_first" not in (tree / "csrc/include/aiter_hip_common.h").read_text()
    )
    blobs = [e for e in records(tmp, "manifest.json.ndjson") if e["kind"] == "blob"]
    assert len(blobs) == 2
    for e in blobs:
        assert not [a for a in e["argv"] if str(build / "fixed") in a], e["argv"]
        assert "-Icsrc/include" in e["argv"], e["argv"]  # the tree's dir, relative: ck-jit's install copies it
    kernels = install(tmp / "manifest.json.ndjson", tree, tmp_path / "install" / "ck_jit")
    gone = tmp_path / "gone"
    gone.mkdir()
    for p in (out, build, tree):
        p.rename(gone / p.name)
    hipcc = os.path.realpath(shutil.which("hipcc") or "/usr/bin/hipcc")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CK_JIT", "ROCM_"))} | {"HIP_PLATFORM": "amd"}
    done = replay_all(kernels, tmp_path / "install" / "ck_jit", tmp_path / "replay", hipcc, env)
    for k in kernels:
        for how in ("runtime", "prebuild"):
            assert isinstance(done[k.name][how], Path), f"{k.name} ({how}) did not compile:\n{done[k.name][how]}"


def test_the_compile_cache_steps_aside_for_ck_jits_interceptor(tmp_path: Path) -> None:
    """ck-jit's interceptor stands in for hipcc and records what it compiles (each CK kernel stubbed,
    each dispatch file rewritten): a compile qola's cache served would never reach it. Its first stub
    (an empty object) marks that compiler in the cache, which from then on runs it for every unit; a
    second ``full`` over the same cache records every kernel and dispatch file again."""
    cache = tmp_path / "cc"
    tree = fx.write_tree(tmp_path / "aiter", "new")
    (tree / "csrc" / "cpp_itfs" / "gen_fwd.py").write_text("HINTS = 1\n" + GENERATOR)
    (tree / "csrc" / "include" / "fmha_fwd_instance.hpp").write_text(INSTANCE_HEADER)
    (tmp_path / "qola_manifest.toml").write_text(MANIFEST)
    plain_checkout(tmp_path)
    for attempt in (1, 2):
        proc, out, _, tmp = _run_under_ckjit(tmp_path, QOLA_CACHE_DIR=str(cache))
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
        kinds = sorted(e["kind"] for e in records(tmp, "manifest.json.ndjson"))
        assert kinds == ["api", "blob", "blob"], (attempt, kinds)
        tally = (Path(str(out) + ".build") / "cache" / "tally").read_text().splitlines()
        assert not [t for t in tally if t.startswith("hit")], tally
        if attempt == 2:
            assert tally and all("a wrapper that left stubs" in t for t in tally), tally
    assert len(list((cache / "v1" / "w").iterdir())) == 1  # the interceptor, marked once
