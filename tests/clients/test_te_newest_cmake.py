"""TE's newest ROCm CMake (tests/support/te_newest.py: its order, CK_JIT's skip of the prebuilt lookup,
both manifests) configured against this qola as a plain checkout, on the fixture tree of
tests/support/fixes_tree.py in a git mirror: the main manifest pins commit 1, the CK-free tier's
manifest (namespace ``te_v3``) commit 2. Each flow TE serves through QoLA exits 0:

* a fresh configure (CK_JIT off): checkout, prebuilt miss, build, cache, the tier checked out to its
  own pin and built;
* the same checkout dir after QoLA patched it (a TE checkout switching builders): reset, said;
  the prebuilt cache taken;
* CK_JIT on (``NVTE_CK_JIT`` unset, TE's default): the prebuilt lookup skipped though the cache is
  there, ck_jit_build.py's command line run."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from support import fixes_tree as ft
from support import te_newest
from support.cli import copy_checkout
from support.gitrepo import GIT_ENV, git

pytestmark = pytest.mark.slow


def _configure(tmp: Path, defs: dict[str, str], env: dict[str, str], name: str) -> subprocess.CompletedProcess[str]:
    proj = tmp / "te"
    proj.mkdir(exist_ok=True)
    (proj / "CMakeLists.txt").write_text(te_newest.CMAKE)
    base = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "NVTE_CK_JIT", "NVTE_AITER_SOURCE_DIR")}
    cmd = ["cmake", "-S", str(proj), "-B", str(tmp / "bld"), *(f"-D{k}={v}" for k, v in defs.items())]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**base, **GIT_ENV, **env}, cwd=tmp)
    (tmp / f"{name}.log").write_text(proc.stdout + proc.stderr)
    return proc


def test_tes_newest_cmake_flows(tmp_path: Path) -> None:
    bare, first, second = ft.mirror(tmp_path, archs=("sm_89",))  # the tier's arch has its code object too
    qola_dir = copy_checkout(tmp_path / "QoLA")
    tree = qola_dir / "build" / "third_party" / "aiter"
    (tmp_path / "ck_jit_build.py").write_text(te_newest.CK_JIT_BUILD)
    defs = {
        "QOLA_DIR": str(qola_dir),
        "QOLA_MANIFEST": str(ft.pinned_manifest(tmp_path / "qola_manifest.toml", first, bare)),
        "QOLA_MANIFEST_V3": str(ft.pinned_manifest(tmp_path / "qola_manifest_gfx1250.toml", second, bare, "te_v3")),
        "ARCHS": "sm_90;sm_89",
        "V3_ARCH": "sm_89",
        "QOLA_LIB_FILES": "te_libmha_bwd.so",
        "CK_JIT_BUILD": str(tmp_path / "ck_jit_build.py"),
        "QOLA_TEST_ARGS": "-j;2",
    }
    fresh = _configure(tmp_path, defs, {"NVTE_CK_JIT": "0"}, "fresh")
    out = fresh.stdout + fresh.stderr
    assert fresh.returncode == 0, out[-4000:]
    cache = tmp_path / "bld" / "aiter-prebuilts" / f"rocm-7_aiter-{first}"
    assert (cache / "lib" / "te_libmha_bwd.so").is_file() and (cache / "include" / "qola_config.h").is_file()
    assert (qola_dir / "build_gfx1250" / "lib" / "te_v3_libmha_bwd.so").is_file()
    assert git(tree, "rev-parse", "HEAD") == second  # the tier checked its own pin out, as QoLA's build does

    ft.qola_patched(tree)  # QoLA's checkout patched the dir since
    again = _configure(tmp_path, defs, {"NVTE_CK_JIT": "0"}, "switched")
    out = again.stdout + again.stderr
    assert again.returncode == 0, out[-4000:]
    assert "discarded changes qola did not make in its own checkout dir" in out
    assert "Using prebuilt AITER kernels" in out

    jit = _configure(tmp_path, defs, {}, "ck_jit")  # NVTE_CK_JIT unset: TE's default, CK_JIT on
    out = jit.stdout + jit.stderr
    assert jit.returncode == 0, out[-4000:]
    assert "CK_JIT is enabled" in out and "Using prebuilt AITER kernels" not in out
    assert (tmp_path / "bld" / "te_lib" / "te_libmha_bwd.so").is_file()
