"""The build engine on the example tree: real compiles with nvcc (sm_90) and hipcc (gfx90a).

Most tests call the library's pipeline (:func:`qola.pipeline.run.build`) directly; those about the
command line itself (the no-op fast path keyed on argv, a SIGKILL mid-build, exit codes and what
the user reads) run ``qola build`` in a subprocess."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, cast

import pytest
from support.common import KERNELS, run_qola, wait_for

from qola.core.errors import QolaError
from qola.pipeline import run as pipeline
from qola.pipeline.run import BuildSpec

pytestmark = pytest.mark.slow

PLAIN = ("module_rmsnorm", "module_softmax")


def manifest(path: Path, archs: list[str], modules: tuple[str, ...] = PLAIN, extra: str = "", ns: str = "qk") -> Path:
    body = f'[qola]\nnamespace = "{ns}"\n[build]\narchitectures = {json.dumps(archs)}\n'
    for m in modules:
        body += f'\n[[modules]]\nname = "{m}"\n'
    path.write_text(body + extra)
    return path


def build(m: Path, tree: Path, out: Path, **kw: Any) -> pipeline.BuildReport:
    """``qola build -j 2`` through the library."""
    return pipeline.build(BuildSpec.make(manifest=str(m), aiter_root=str(tree), output_dir=str(out), jobs=2, **kw))


def sha256(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def check_published(out: Path) -> dict[str, Any]:
    data = json.loads((out / "manifest.json").read_text())
    for m in data["modules"]:
        if m["status"] == "built":
            art = out / m["artifact"]
            assert art.is_file(), m
            assert sha256(art) == m["sha256"] and art.stat().st_size == m["size"]
        assert (out / m["log"]).is_file()
    assert not list(out.rglob(".*tmp*")), "temp files left in the output"
    return cast("dict[str, Any]", data)


def ninja_runs(build_dir: Path) -> list[str]:
    """Outputs ninja recorded (one line per finished edge) in .ninja_log."""
    lines = (build_dir / ".ninja_log").read_text().splitlines()[1:]
    return [ln.split("\t")[3] for ln in lines]


@pytest.fixture(scope="module")
def cuda_build(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path, Path]:
    tmp = tmp_path_factory.mktemp("cuda")
    tree = tmp / "kernels"
    shutil.copytree(KERNELS, tree, ignore=shutil.ignore_patterns("hsa"))
    m = manifest(tmp / "q.toml", ["sm_90"], modules=(*PLAIN, "module_attn_fwd"))
    out = tmp / "out"
    report = build(m, tree, out)
    assert report.ok, [r.detail for r in report.modules]
    return tmp, tree, m, out


def test_cuda_build_publishes_everything(cuda_build: tuple[Path, Path, Path, Path]) -> None:
    tmp, _tree, _m, out = cuda_build
    data = check_published(out)
    assert {x["name"] for x in data["modules"]} == {*PLAIN, "module_attn_fwd"}
    assert all(x["status"] == "built" for x in data["modules"])
    assert data["toolchain"]["kind"] == "cuda" and data["archs"] == ["sm_90"]
    attn = next(x for x in data["modules"] if x["name"] == "module_attn_fwd")
    assert attn["generated"] == 49 and attn["instances"]["count"] == 49
    assert (out / "lib" / "qk_module_rmsnorm.so").is_file()
    assert (out / "configs" / "rmsnorm_tuned.csv").is_file()
    # one graph: every module's objects are in the same build.ninja
    graph = (tmp / "out.build" / "build.ninja").read_text()
    assert all(f"module_{n}" in graph for n in (*PLAIN, "module_attn_fwd"))


def test_noop_rebuild_compiles_nothing(cuda_build: tuple[Path, Path, Path, Path]) -> None:
    tmp, tree, m, out = cuda_build
    before = len(ninja_runs(tmp / "out.build"))
    report = build(m, tree, out)  # no argv: no fast path, the whole pipeline runs
    assert report.ok and not report.up_to_date
    assert len(ninja_runs(tmp / "out.build")) == before
    check_published(out)


def test_touch_header_rebuilds_only_dependents(cuda_build: tuple[Path, Path, Path, Path]) -> None:
    tmp, tree, m, out = cuda_build
    bdir = tmp / "out.build"
    before = len(ninja_runs(bdir))
    header = tree / "csrc" / "include" / "softmax.h"
    # newer than every object, not in the future: a host-only compile finishes within seconds, and an
    # object written before a future-dated header stays dirty (the no-op test after this one saw it)
    newest = max(o.stat().st_mtime for o in (bdir / "obj").rglob("*.o"))
    os.utime(header, (max(time.time(), newest + 0.01),) * 2)
    assert build(m, tree, out).ok
    rebuilt = ninja_runs(bdir)[before:]
    assert rebuilt, "nothing rebuilt after touching a header"
    assert all("module_softmax" in r for r in rebuilt), rebuilt
    assert any(r.endswith(".o") for r in rebuilt)
    check_published(out)


def test_broken_module_does_not_stop_others(tmp_path: Path) -> None:
    tree = tmp_path / "kernels"
    shutil.copytree(KERNELS, tree, ignore=shutil.ignore_patterns("hsa"))
    (tree / "csrc" / "kernels" / "broken.cu").write_text("int broken() { return not_declared_anywhere; }\n")
    extra = '\n[[modules]]\nname = "module_broken"\nsrcs = ["csrc/kernels/broken.cu"]\nis_python_module = false\n'
    m = manifest(tmp_path / "q.toml", ["sm_90"], modules=("module_rmsnorm",), extra=extra)
    out = tmp_path / "out"
    report = build(m, tree, out, keep_going=True)  # what built is published though one failed (issue 41 item 7)
    assert not report.ok and report.exit_code == 1
    data = check_published(out)
    status = {x["name"]: x for x in data["modules"]}
    assert status["module_rmsnorm"]["status"] == "built"
    broken = status["module_broken"]
    assert broken["status"] == "failed" and broken["artifact"] is None
    assert "not_declared_anywhere" in (out / "logs" / "module_broken.log").read_text()
    assert broken["log"] == "logs/module_broken.log" and broken["success"] is False and broken["error"]
    assert status["module_rmsnorm"]["success"] is True and status["module_rmsnorm"]["error"] == ""
    assert data["summary"] == {"total": len(status), "success": len(status) - 1, "failed": 1}
    failed = {r.name: r for r in report.modules if r.status == "failed"}
    assert list(failed) == ["module_broken"] and "not_declared_anywhere" in (failed["module_broken"].detail or "")
    assert not list((out / "lib").glob("qk_module_broken*"))
    # what the user reads: the failed module, the compiler's error, no traceback
    proc = run_qola("build", "--manifest", str(m), "--aiter-root", str(tree), "-o", str(out), "-j", "2")
    assert proc.returncode == 1, proc.stderr
    assert "module_broken" in proc.stderr and "not_declared_anywhere" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_failing_generator_is_a_clear_error(tmp_path: Path) -> None:
    tree = tmp_path / "kernels"
    shutil.copytree(KERNELS, tree, ignore=shutil.ignore_patterns("hsa"))
    (tree / "csrc" / "gen_fail.py").write_text("import sys\nprint('cannot generate: no recipe')\nsys.exit(3)\n")
    extra = (
        '\n[[modules]]\nname = "module_gen"\nsrcs = []\nblob_gen_cmd = ["csrc/gen_fail.py --output_dir {}"]\n'
        "is_python_module = false\n"
    )
    m = manifest(tmp_path / "q.toml", ["sm_90"], modules=(), extra=extra)
    out = tmp_path / "out"
    report = pipeline.build(BuildSpec.make(manifest=str(m), aiter_root=str(tree), output_dir=str(out)))
    assert report.exit_code == 1
    (r,) = report.modules
    assert (
        r.status == "failed" and "exit code 3" in (r.detail or "") and "cannot generate: no recipe" in (r.detail or "")
    )
    # nothing is published (OUT keeps its previous version): the log is in the build dir, named
    assert report.logs is not None and not (out / "logs").exists()
    log = (report.logs / "module_gen.log").read_text()
    assert "exit code 3" in log and "cannot generate: no recipe" in log and "gen_fail.py" in log


def test_sigkill_then_rebuild_never_shows_corrupt_output(tmp_path: Path) -> None:
    tree = tmp_path / "kernels"
    shutil.copytree(KERNELS, tree, ignore=shutil.ignore_patterns("hsa"))
    m = manifest(tmp_path / "q.toml", ["sm_90"])
    out = tmp_path / "out"
    # a first complete build, so O holds a published result while the second one is killed
    assert build(m, tree, out).ok
    published = {p: sha256(p) for p in (out / "lib").iterdir()}
    for src in (tree / "csrc" / "kernels").glob("*.cu"):
        src.write_text(src.read_text() + "\n// changed\n")
    # a launcher that marks and stalls each compile, so the kill lands mid-compile every time
    slow = tmp_path / "slow-launcher"
    compiling = tmp_path / "compiling"
    slow.write_text(f'#!/bin/sh\ntouch {compiling}\nsleep 600\nexec "$@"\n')
    slow.chmod(0o755)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "qola",
            "build",
            "--manifest",
            str(m),
            "--aiter-root",
            str(tree),
            "-o",
            str(out),
            "-j",
            "2",
            "--launcher",
            str(slow),
        ],
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    assert wait_for(lambda: compiling.exists() or proc.poll() is not None, 300), "no compile started"
    assert proc.poll() is None, "the build ended before a compile began"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    # what O shows is exactly the last published state: every file complete and matching manifest.json
    check_published(out)
    assert {p: sha256(p) for p in (out / "lib").iterdir() if not p.name.startswith(".")} == published
    assert build(m, tree, out).ok
    check_published(out)


def test_dry_run_touches_nothing(tmp_path: Path) -> None:
    m = manifest(tmp_path / "q.toml", ["sm_90"], modules=("module_attn_fwd",))
    out = tmp_path / "out"
    report = build(m, KERNELS, out, dry_run=True)
    assert report.dry_run and report.ok and report.manifest_json is None
    assert not out.exists()
    assert report.layout.graph == tmp_path / "out.build" / "build.ninja" and report.layout.graph.is_file()
    assert report.compiled is not None
    assert any("attn_fwd_api" in line for line in report.compiled.ninja_log)
    # the command prints what ninja would run
    proc = run_qola("build", "--manifest", str(m), "--aiter-root", str(KERNELS), "-o", str(out), "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert "attn_fwd_api" in proc.stdout and not out.exists()


@pytest.mark.hip
def test_hip_build_gfx90a(tmp_path: Path) -> None:
    tree = tmp_path / "kernels"
    shutil.copytree(KERNELS, tree, ignore=shutil.ignore_patterns("hsa"))
    # the attention module narrowed to 2 of its 49 instances (the CUDA build above compiles them all)
    attn = (
        '\n[[modules]]\nname = "module_attn_fwd"\nblob_gen_cmd = ["csrc/attn/generate.py -d fwd '
        '--filter attn_fwd_d64_fp16_batch*_nmask_* --output_dir {}"]\n'
    )
    m = manifest(tmp_path / "q.toml", ["gfx90a"], modules=PLAIN, extra=attn)
    out = tmp_path / "out"
    proc = run_qola("build", "--manifest", str(m), "--aiter-root", str(tree), "-o", str(out), "-j", "2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = check_published(out)
    assert data["toolchain"]["kind"] == "hip" and all(x["status"] == "built" for x in data["modules"])
    assert 1 <= {x["name"]: x["generated"] for x in data["modules"]}["module_attn_fwd"] < 49
    assert "--offload-arch=gfx90a" in (tmp_path / "out.build" / "build.ninja").read_text()


def test_per_source_flags_reach_only_their_source(tmp_path: Path) -> None:
    extra = '[modules.flags_extra_hip_per_source]\n"softmax_pybind.cu" = ["-DQOLA_PER_SOURCE=1", "-O1"]\n'
    m = manifest(tmp_path / "q.toml", ["sm_90"], modules=("module_softmax",), extra=extra)
    assert build(m, KERNELS, tmp_path / "out", dry_run=True).ok
    graph = (tmp_path / "out.build" / "build.ninja").read_text().replace("$\n", "")
    edges = [
        blk for blk in graph.split("\nbuild ") if blk.startswith("obj/module_softmax/") and ": hostonly " not in blk
    ]
    with_flag = [e.split(":")[0] for e in edges if "-DQOLA_PER_SOURCE=1" in e]
    assert len(edges) == 2 and len(with_flag) == 1 and "softmax_pybind" in with_flag[0]


def _flags_by_object(graph_dir: Path, flag_prefix: str) -> dict[str, list[str]]:
    graph = (graph_dir / "build.ninja").read_text().replace("$\n", "")
    edges = [blk for blk in graph.split("\nbuild ") if blk.startswith("obj/")]
    return {
        Path(e.split(":")[0]).name.rsplit("-", 1)[0]: sorted({w for w in e.split() if w.startswith(flag_prefix)})
        for e in edges
        if ".cu" in e.split("\n")[0]
    }


def test_per_source_flags_first_match_wins_in_table_order(tmp_path: Path) -> None:
    """AITER (aiter/jit/utils/cpp_extension.py): the patterns are tried in the table's order and only
    the first match's flags are added; the old code added every match's (rmsnorm got A and B)."""
    extra = '[modules.flags_extra_hip_per_source]\n"*norm.cu" = ["-DQOLA_PS_A=1"]\n"*.cu" = ["-DQOLA_PS_B=1"]\n'
    m = manifest(tmp_path / "q.toml", ["sm_90"], modules=("module_rmsnorm",), extra=extra)
    assert build(m, KERNELS, tmp_path / "out", dry_run=True).ok
    got = _flags_by_object(tmp_path / "out.build", "-DQOLA_PS_")
    assert got["rmsnorm"] == ["-DQOLA_PS_A=1"], got
    assert all(v == ["-DQOLA_PS_B=1"] for k, v in got.items() if k != "rmsnorm"), got
    # the other order: "*.cu" comes first and wins for every source
    extra = '[modules.flags_extra_hip_per_source]\n"*.cu" = ["-DQOLA_PS_B=1"]\n"*norm.cu" = ["-DQOLA_PS_A=1"]\n'
    m = manifest(tmp_path / "q.toml", ["sm_90"], modules=("module_rmsnorm",), extra=extra)
    assert build(m, KERNELS, tmp_path / "out", dry_run=True).ok
    got = _flags_by_object(tmp_path / "out.build", "-DQOLA_PS_")
    assert got and all(v == ["-DQOLA_PS_B=1"] for v in got.values()), got


def test_per_source_flags_match_the_absolute_path_too(tmp_path: Path) -> None:
    """A pattern with a directory (``*/kernels/*.cu``) matches the source's absolute path, and a
    pattern equal to the absolute path matches it; the old code matched basenames only."""
    softmax = KERNELS / "csrc" / "kernels" / "softmax.cu"
    extra = (
        "[modules.flags_extra_hip_per_source]\n"
        f'"{softmax.parent.parent / "pybind"}/*" = ["-DQOLA_PS_P=1"]\n'
        '"*/kernels/*.cu" = ["-DQOLA_PS_C=1"]\n'
    )
    m = manifest(tmp_path / "q.toml", ["sm_90"], modules=("module_softmax",), extra=extra)
    assert build(m, KERNELS, tmp_path / "out", dry_run=True).ok
    got = _flags_by_object(tmp_path / "out.build", "-DQOLA_PS_")
    assert got["softmax"] == ["-DQOLA_PS_C=1"] and got["softmax_pybind"] == ["-DQOLA_PS_P=1"], got
    extra = f'[modules.flags_extra_hip_per_source]\n"{softmax}" = ["-DQOLA_PS_E=1"]\n'
    m = manifest(tmp_path / "q.toml", ["sm_90"], modules=("module_softmax",), extra=extra)
    assert build(m, KERNELS, tmp_path / "out", dry_run=True).ok
    got = _flags_by_object(tmp_path / "out.build", "-DQOLA_PS_")
    assert got["softmax"] == ["-DQOLA_PS_E=1"] and got["softmax_pybind"] == [], got


def test_torch_extension_without_torch_is_a_clear_error(tmp_path: Path) -> None:
    import importlib.util

    if importlib.util.find_spec("torch") is not None:
        pytest.skip("torch is installed here (the GPU test covers the torch extension build)")
    extra = (
        '\n[[modules]]\nname = "module_needs_torch"\nsrcs = ["csrc/kernels/softmax.cu"]\n'
        "torch_exclude = false\nis_python_module = true\n"
    )
    m = manifest(tmp_path / "q.toml", ["sm_90"], modules=(), extra=extra)
    with pytest.raises(QolaError) as info:
        build(m, KERNELS, tmp_path / "out")
    assert "torch is not importable" in info.value.message and "torch_exclude = true" in (info.value.hint or "")
    assert info.value.exit_code == 2 and not (tmp_path / "out").exists()


def test_noop_fast_path_and_what_invalidates_it(cuda_build: tuple[Path, Path, Path, Path]) -> None:
    tmp, tree, m, out = cuda_build
    args = ("build", "--manifest", str(m), "--aiter-root", str(tree), "-o", str(out), "-j", "2")
    assert run_qola(*args).returncode == 0  # settle
    proc = run_qola(*args)
    assert proc.returncode == 0 and "is up to date" in proc.stderr
    # an environment variable the module table reads changes a module's flags: rebuilds it
    before = len(ninja_runs(tmp / "out.build"))
    proc = run_qola(*args, env={"QK_RMSNORM_USE_RSQRT": "0"})
    assert proc.returncode == 0 and "is up to date" not in proc.stderr, proc.stderr
    rebuilt = ninja_runs(tmp / "out.build")[before:]
    assert rebuilt and all("module_rmsnorm" in r for r in rebuilt), rebuilt
    assert run_qola(*args).returncode == 0  # back to the default flags
    # a deleted published file is noticed and republished
    (out / "lib" / "qk_module_softmax.so").unlink()
    proc = run_qola(*args)
    assert proc.returncode == 0 and "is up to date" not in proc.stderr
    check_published(out)
    # an edited generator script re-runs codegen
    gen = tree / "csrc" / "attn" / "generate.py"
    gen.write_text(gen.read_text() + "\n# edited\n")
    proc = run_qola(*args)
    assert proc.returncode == 0 and "is up to date" not in proc.stderr
    assert "is up to date" in run_qola(*args).stderr
    # the manifest itself
    m.write_text(m.read_text() + "\n# a comment\n")
    assert "is up to date" not in run_qola(*args).stderr
