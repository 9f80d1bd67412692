"""Generator failures are module failures (exit 1, the module failed in manifest.json, the command and
its output shown without --verbose, nothing of it published, no traceback); an absent per-arch asm
generator (``hsa/<gfx>/…``) is skipped with a warning; a generator that misses a Python package names
the interpreter and the install; AITER's generators get a ``hipconfig`` whose version they can parse.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support.common import KERNELS, run_qola

from qola.compile.codegen import GenJob, run_generators
from qola.core.errors import FailedProcessError, QolaError
from qola.plan.genrules import asm_arch, missing_package_hint
from qola.plan.planner import Generator
from qola.toolchain.base import Toolchain
from qola.toolchain.hipconfig import generator_env, parses

NS = "qk"
EXIT3 = "import sys\nprint('about to fail: GEN-STDOUT-MARK')\nprint('GEN-STDERR-MARK', file=sys.stderr)\nsys.exit(3)\n"
NEEDS_PKG = "import qola_no_such_pkg_xyz  # noqa\n"
# AITER's two ways of reading `hipconfig --version` (aiter/jit/core.py; int() of the dotted parts)
AITER_PARSE = (
    "import shutil, subprocess, sys\n"
    "from packaging.version import parse\n"
    "out = subprocess.check_output([shutil.which('hipconfig'), '--version'], text=True)\n"
    "v = parse(out.split()[-1].rstrip('-').replace('-', '+'))\n"
    "major, minor = (int(p) for p in out.split('.')[:2])\n"
    "d = sys.argv[sys.argv.index('--output_dir') + 1]\n"
    "open(f'{d}/seen.cu', 'w').write(f'// {out!r} {v} {major} {minor}\\n')\n"
)


def own_traceback(stderr: str) -> bool:
    """qola's own traceback starts a line; a generator's, quoted in an error, is indented."""
    return any(line.startswith("Traceback") for line in stderr.splitlines())


def toolchain(kind: str = "hip", version_output: str = "HIP version: 6.4.43484-9999\n") -> Toolchain:
    return Toolchain(
        kind=kind,
        compiler="/usr/bin/hipcc",
        version="6.4.43484",
        version_output=version_output,
        identity="x",
        archs=("gfx942",),
        host_cxx="c++",
        child_env={},
    )


def fake_hipconfig(bin_dir: Path, output: str) -> Path:
    bin_dir.mkdir(parents=True, exist_ok=True)
    path = bin_dir / "hipconfig"
    path.write_text(
        f"#!/bin/sh\nif [ \"$1\" = --version ]; then printf '%s' '{output}'; exit 0; fi\necho \"real hipconfig: $*\"\n"
    )
    path.chmod(0o755)
    return path


# ---------------------------------------------------------------- rules, no build


def test_asm_arch_only_under_the_trees_hsa_gfx_dirs(tmp_path: Path) -> None:
    hsa = tmp_path / "aiter_meta" / "hsa"
    assert asm_arch(f"{hsa}/gfx90a//fmha_v3_fwd/codegen.py", hsa) == "gfx90a"
    assert asm_arch(f"{hsa}/gfx942/fmha_v3_bwd/codegen.py", hsa) == "gfx942"
    assert asm_arch(f"{hsa}/codegen.py", hsa) is None
    assert asm_arch(f"{hsa}/common/codegen.py", hsa) is None
    assert asm_arch(f"{tmp_path}/csrc/gfx90a/codegen.py", hsa) is None
    assert asm_arch(f"{hsa}/gfx90a/x/codegen.py", None) is None


def test_missing_package_hint_names_interpreter_and_install() -> None:
    out = "Traceback (most recent call last):\n  ...\nModuleNotFoundError: No module named 'yaml'\n"
    hint = missing_package_hint(out, sys.executable)
    assert sys.executable in (hint or "") and f"{sys.executable} -m pip install PyYAML" in (hint or "")
    assert sys.version.split()[0] in (hint or "") and "pandas" in (hint or "")
    assert "install jinja2" in (missing_package_hint("ImportError: No module named 'jinja2.ext'", "/py") or "")
    assert missing_package_hint("SyntaxError: bad", sys.executable) is None


def test_absent_asm_generator_is_skipped_others_fail(tmp_path: Path) -> None:
    hsa = tmp_path / "tree" / "hsa"
    ok = tmp_path / "tree" / "csrc" / "gen.py"
    ok.parent.mkdir(parents=True)
    ok.write_text("import sys\nd = sys.argv[sys.argv.index('--output_dir') + 1]\nopen(d + '/a.cu', 'w').write('')\n")
    asm = Generator(f"{hsa}/gfx90a//fmha_v3_fwd/codegen.py --output_dir {{}}")
    job = GenJob("m", (Generator(f"{ok} --output_dir {{}}"), asm))
    env = {"PATH": "/usr/bin:/bin"}
    res = run_generators(job, tmp_path / "gen", env=env, hsa_dir=hsa)
    assert [Path(s).name for s in res.sources] == ["a.cu"]
    (warning,) = res.warnings
    assert "gfx90a" in warning and "fmha_v3_fwd/codegen.py" in warning and "skipped" in warning
    again = run_generators(job, tmp_path / "gen", env=env, hsa_dir=hsa)
    assert again.skipped and again.warnings == res.warnings  # the stamp remembers the warning
    # absent anywhere else (or without the tree's hsa dir): the module fails
    with pytest.raises(QolaError, match="does not exist"):
        run_generators(
            GenJob("n", (Generator(f"{tmp_path}/tree/csrc/nope.py --output_dir {{}}"),)),
            tmp_path / "gen",
            env=env,
            hsa_dir=hsa,
        )
    with pytest.raises(QolaError, match="does not exist"):
        run_generators(GenJob("n", (asm,)), tmp_path / "gen", env=env)
    # an asm generator that exists and fails fails the module
    bad = hsa / "gfx942" / "fmha_v3_fwd" / "codegen.py"
    bad.parent.mkdir(parents=True)
    bad.write_text(EXIT3)
    with pytest.raises(FailedProcessError) as info:
        run_generators(GenJob("n", (Generator(f"{bad} --output_dir {{}}"),)), tmp_path / "gen", env=env, hsa_dir=hsa)
    assert info.value.returncode == 3 and "GEN-STDOUT-MARK" in info.value.message


@pytest.mark.parametrize("name", ["a\\nb.cu", "tab\\tname.cu", "bad\\udcff.cu"])
def test_a_generated_name_no_build_file_can_hold_fails_its_module(tmp_path: Path, name: str) -> None:
    """A generator writing a file whose name holds a newline used to trip an assertion in the ninja
    writer (a traceback): the module fails naming the file, nothing reaches its blob dir (issue 23)."""
    gen = tmp_path / "gen.py"
    gen.write_text(
        "import os, sys\nd = sys.argv[sys.argv.index('--output_dir') + 1]\n"
        "open(os.path.join(os.fsencode(d), os.fsencode('" + name + "')), 'w').write('')\n"
        "open(os.path.join(d, 'ok.cu'), 'w').write('')\n"
    )
    job = GenJob("m", (Generator(f"{gen} --output_dir {{}}"),))
    with pytest.raises(QolaError, match=r"module m: its generator wrote a file named .*which no build file can name"):
        run_generators(job, tmp_path / "out", env={"PATH": "/usr/bin:/bin"})
    assert not (tmp_path / "out" / "m" / "blob").exists()


def test_failed_process_output_is_bounded_to_its_tail() -> None:
    err = FailedProcessError(["gen.py"], 1, "".join(f"line {i}\n" for i in range(500)))
    assert "line 499" in err.message and "line 459" not in err.message and "line 460" in err.message
    assert "earlier line(s) cut" in err.message


# ---------------------------------------------------------------- hipconfig


def test_hipconfig_shim_when_hipconfig_prints_hipcc_style(tmp_path: Path) -> None:
    fake = fake_hipconfig(tmp_path / "fakebin", "HIP version: 6.4.43484-9999")
    assert not parses(subprocess.run([fake, "--version"], capture_output=True, text=True).stdout)
    env = {"PATH": f"{fake.parent}:/usr/bin:/bin"}
    gen_env, note = generator_env(toolchain(), env, tmp_path / "tools" / "bin")
    assert note and str(fake) in note and "6.4.43484-9999" in note
    assert gen_env["PATH"].split(":")[0] == str(tmp_path / "tools" / "bin")
    assert env["PATH"] == f"{fake.parent}:/usr/bin:/bin"  # the caller's env is left alone
    shim = tmp_path / "tools" / "bin" / "hipconfig"
    assert subprocess.run([shim, "--version"], capture_output=True, text=True).stdout == "6.4.43484-9999"
    assert subprocess.run([shim, "--path"], capture_output=True, text=True).stdout == "real hipconfig: --path\n"
    # a generator running AITER's parse sees the bare version
    script = tmp_path / "gen_hip.py"
    script.write_text(AITER_PARSE)
    res = run_generators(GenJob("m", (Generator(f"{script} --output_dir {{}}"),)), tmp_path / "gen", env=gen_env)
    seen = Path(res.sources[0]).read_text()
    assert seen == "// '6.4.43484-9999' 6.4.43484+9999 6 4\n", seen


def test_hipconfig_left_alone_when_it_parses_or_for_cuda(tmp_path: Path) -> None:
    fake = fake_hipconfig(tmp_path / "fakebin", "6.4.43484-9999")
    env = {"PATH": f"{fake.parent}:/usr/bin:/bin"}
    assert generator_env(toolchain(), env, tmp_path / "tools") == (env, None)
    assert generator_env(toolchain("cuda", "Cuda compilation tools, release 13.0"), env, tmp_path / "t") == (env, None)
    assert not (tmp_path / "tools").exists() and not (tmp_path / "t").exists()
    # none on PATH: the shim answers --version and says so for anything else
    _gen_env, note = generator_env(toolchain(), {"PATH": str(tmp_path / "empty")}, tmp_path / "tools")
    assert note and "not on PATH" in note
    shim = tmp_path / "tools" / "hipconfig"
    assert subprocess.run([shim, "-v"], capture_output=True, text=True).stdout == "6.4.43484-9999"
    assert subprocess.run([shim, "--path"], capture_output=True, text=True).returncode == 1


@pytest.mark.hip
@pytest.mark.slow
def test_hip_dry_run_generators_get_the_probed_version(tmp_path: Path) -> None:
    """qola build (dry run, Debian's hipcc for gfx90a) with a hipconfig that prints the hipcc form."""
    tree = tmp_path / "kernels"
    shutil.copytree(KERNELS, tree, ignore=shutil.ignore_patterns("hsa", "__pycache__"))
    (tree / "csrc" / "gen_hip.py").write_text(AITER_PARSE)
    fake = fake_hipconfig(tmp_path / "fakebin", "HIP version: 6.4.43484-9999")
    m = tmp_path / "q.toml"
    m.write_text(
        f'[qola]\nnamespace = "{NS}"\n[build]\narchitectures = ["gfx90a"]\n\n[[modules]]\n'
        'name = "module_hipv"\nsrcs = []\nis_python_module = false\n'
        'blob_gen_cmd = ["csrc/gen_hip.py --output_dir {}"]\n'
    )
    out = tmp_path / "out"
    proc = run_qola(
        "build",
        "--dry-run",
        "--manifest",
        str(m),
        "--aiter-root",
        str(tree),
        "-o",
        str(out),
        env={"PATH": f"{fake.parent}:{os.environ['PATH']}"},
    )
    assert proc.returncode == 0, proc.stderr
    hipcc = subprocess.run(
        ["hipcc", "--version"], capture_output=True, text=True, env={**os.environ, "HIP_PLATFORM": "amd"}
    )
    probed = hipcc.stdout.split("HIP version:")[1].split()[0]  # Debian's: 5.2.21153-0
    seen = (tmp_path / "out.build" / "gen" / "module_hipv" / "blob" / "seen.cu").read_text()
    assert seen.startswith(f"// {probed!r} "), seen
    assert "note:" in proc.stderr and "hipconfig" in proc.stderr and not own_traceback(proc.stderr)


# ---------------------------------------------------------------- qola build (nvcc, sm_90)


def broken_tree(tmp: Path) -> Path:
    tree = tmp / "kernels"
    shutil.copytree(KERNELS, tree, ignore=shutil.ignore_patterns("hsa", "__pycache__"))
    (tree / "csrc" / "gen_exit3.py").write_text(EXIT3)
    (tree / "csrc" / "gen_needs_pkg.py").write_text(NEEDS_PKG)
    return tree


def build(tmp: Path, tree: Path, body: str) -> tuple[subprocess.CompletedProcess[str], Path, dict[str, Any]]:
    m = tmp / "q.toml"
    m.write_text(f'[qola]\nnamespace = "{NS}"\n[build]\narchitectures = ["sm_90"]\n' + body)
    out = tmp / "out"
    # --keep-going: what a failed module leaves in a published version (issue 41 item 7: else nothing is)
    proc = run_qola("build", "--manifest", str(m), "--aiter-root", str(tree), "-o", str(out), "-j", "2", "--keep-going")
    data = json.loads((out / "manifest.json").read_text())
    return proc, out, {x["name"]: x for x in data["modules"]}


@pytest.mark.slow
def test_failing_generators_fail_their_modules_only(tmp_path: Path) -> None:
    tree = broken_tree(tmp_path)
    body = (
        '\n[[modules]]\nname = "module_softmax"\n'
        '\n[[modules]]\nname = "module_attn_fwd"\nblob_gen_cmd = ["csrc/gen_exit3.py --output_dir {}"]\n'
        '\n[[modules]]\nname = "libattn_fwd"\nmode = "cpp_itfs"\n'
        'blob_gen_cmd = ["csrc/gen_needs_pkg.py --output_dir {}"]\n'
    )
    proc, out, mods = build(tmp_path, tree, body)
    err = proc.stderr
    assert proc.returncode == 1, err
    assert not own_traceback(err), err
    # the failing command and the generator's output, without --verbose
    assert f"{tree}/csrc/gen_exit3.py --output_dir" in err and "exit code 3" in err
    assert "GEN-STDOUT-MARK" in err and "GEN-STDERR-MARK" in err
    assert "ModuleNotFoundError: No module named 'qola_no_such_pkg_xyz'" in err
    assert f"{sys.executable} -m pip install qola_no_such_pkg_xyz" in err
    assert str(out / "logs" / "module_attn_fwd.log") in err
    for name in ("module_attn_fwd", "libattn_fwd"):
        rec = mods[name]
        assert rec["status"] == "failed" and rec["artifact"] is None, rec
        assert rec["log"] == f"logs/{name}.log" and rec["success"] is False and rec["so_path"] is None
        assert not list((out / "lib").glob(f"{NS}_{name}*"))
    assert "exit code 3" in mods["module_attn_fwd"]["error"]  # QoLA's shape: the reason as a string
    log = (out / "logs" / "module_attn_fwd.log").read_text()
    assert "gen_exit3.py" in log and "GEN-STDOUT-MARK" in log and "GEN-STDERR-MARK" in log
    # the module that could build did, and is published
    assert mods["module_softmax"]["status"] == "built"
    assert (out / mods["module_softmax"]["artifact"]).is_file()
    # no consumer files naming a failed library, no JIT tree
    assert not list(out.rglob("*.cmake")) and not list(out.rglob("*.pc"))
    assert not (out / "jit").exists() or not any((out / "jit").iterdir())
    assert not list(out.rglob(".*tmp*"))


@pytest.mark.slow
def test_embed_module_whose_generator_fails_publishes_nothing(tmp_path: Path) -> None:
    tree = broken_tree(tmp_path)
    (tree / "hsa").mkdir()
    subprocess.run(
        [sys.executable, tree / "scripts" / "build_hsa.py", "--arch", "sm_90", "--output", tree / "hsa"],
        check=True,
        capture_output=True,
    )
    asm = '\n[[modules]]\nname = "module_asm"\nembed = ["vec_add"]\n'
    proc, out, mods = build(tmp_path, tree, asm)
    assert proc.returncode == 0, proc.stderr
    header = out / "include" / "qola_embedded_module_asm.h"
    assert header.is_file() and mods["module_asm"]["status"] == "built"
    # the same module with a failing generator (--keep-going): nothing of this build's module is
    # published, the previous version's library and header stay (issue 41 item 7), no traceback
    lib = out / "lib" / f"{NS}_module_asm.so"
    before = (lib.read_bytes(), header.read_bytes())
    proc, out, mods = build(tmp_path, tree, asm + 'blob_gen_cmd = ["csrc/gen_exit3.py --output_dir {}"]\n')
    assert proc.returncode == 1 and not own_traceback(proc.stderr), proc.stderr
    assert "FileNotFoundError" not in proc.stderr and "GEN-STDOUT-MARK" in proc.stderr
    assert mods["module_asm"]["status"] == "built" and mods["module_asm"]["kept"], mods["module_asm"]
    assert "kept the previous version: module_asm" in proc.stderr
    assert (lib.read_bytes(), header.read_bytes()) == before
    assert (out / "include" / "qola_config.h").is_file()


@pytest.mark.aiter
@pytest.mark.hip
@pytest.mark.slow
def test_gfx90a_mha_fwd_dry_run_skips_the_v3_asm_generator(tmp_path: Path, aiter_root: Path) -> None:
    """AITER has no hsa/gfx90a: libmha_fwd plans and builds (dry run) without fmha_v3_fwd, with warnings."""
    m = tmp_path / "te.toml"  # examples/te-manifest.toml's libmha_fwd
    m.write_text(
        '[qola]\nnamespace = "te"\nrocm_versions = ["7.2"]\n[build]\narchitectures = ["gfx950"]\n'
        'mode = "cpp_itfs"\n\n[[modules]]\nname = "libmha_fwd"\nreceipt = 700\n'
        'drop_directions = ["fwd_splitkv", "batch_prefill"]\nembed = ["fmha_v3_fwd"]\n\n'
        '[[mha_fwd_variants]]\ndtype = ["bf16", "fp16"]\nhas_bias = false\nhas_alibi = false\n'
        "has_lse = true\nhas_dropout = false\nhas_skip = false\nhas_sink = false\n"
    )
    out = tmp_path / "out"
    proc = run_qola(
        "build",
        "--dry-run",
        "--manifest",
        str(m),
        "--aiter-root",
        str(aiter_root),
        "--arch",
        "gfx90a",
        "--allow-unpinned",
        "-o",
        str(out),
    )
    assert proc.returncode == 0, proc.stderr
    assert not own_traceback(proc.stderr), proc.stderr
    skipped = [ln for ln in proc.stderr.splitlines() if ln.startswith("warning: module libmha_fwd: skipped generator")]
    assert len(skipped) == 1 and "hsa/gfx90a/fmha_v3_fwd/codegen.py" in skipped[0] and "gfx90a" in skipped[0]
    assert "nothing of fmha_v3_fwd embedded for gfx90a" in proc.stderr
    assert "module_libmha_fwd" in (tmp_path / "out.build" / "build.ninja").read_text()
    assert "[qola" in proc.stdout and not out.exists()


def test_generator_child_is_generator_env_from_the_toolchains_view(tmp_path: Path) -> None:
    """The build hands the generators' stage a ToolchainEnv (issue 24): the same environment as
    generator_env over the whole mapping, with the archs qola gives them set over it."""
    from qola.plan.variants import GeneratorEnv
    from qola.toolchain.env import ToolchainEnv
    from qola.toolchain.hipconfig import generator_child

    fake = fake_hipconfig(tmp_path / "fakebin", "HIP version: 6.4.43484-9999")
    env = {"PATH": f"{fake.parent}:/usr/bin:/bin", "OTHER": "kept", "QOLA_GENERATOR_TIMEOUT": "30"}
    given = {"GPU_ARCHS": "gfx942"}
    child, note = generator_child(toolchain(), ToolchainEnv.of(env), given, tmp_path / "tools")
    whole, whole_note = generator_env(toolchain(), {**env, **given}, tmp_path / "tools")
    assert child.as_dict() == whole and note == whole_note and note and "6.4.43484-9999" in note
    assert child.as_dict()["PATH"].split(":")[0] == str(tmp_path / "tools") and child.as_dict()["OTHER"] == "kept"
    script = tmp_path / "gen_hip.py"
    script.write_text(AITER_PARSE)
    genv = GeneratorEnv(child, env["QOLA_GENERATOR_TIMEOUT"])
    res = run_generators(GenJob("m", (Generator(f"{script} --output_dir {{}}"),)), tmp_path / "gen", env=genv)
    assert Path(res.sources[0]).read_text() == "// '6.4.43484-9999' 6.4.43484+9999 6 4\n"
    fixed = fake_hipconfig(tmp_path / "good", "6.4.43484-9999")
    same, nothing = generator_child(
        toolchain(), ToolchainEnv.of({"PATH": f"{fixed.parent}:/bin"}), given, tmp_path / "x"
    )
    assert nothing is None and same.as_dict() == {"PATH": f"{fixed.parent}:/bin", **given}
