"""qola's CMake clients replayed on the real AITER tree (the amd-aiter sdist) in the ROCm 7 environment
(``scripts/rocm7.sh run python -m pytest -m rocm tests/clients/test_rocm_cmake_clients.py``).

Transformer Engine's call form on TE's manifest narrowed to one CK kernel per direction
(test_rocm_aiter.py's narrowing), gfx942 and gfx950: ``qola.cli checkout`` from a local git mirror of the
tree into ``<QoLA>/build/third_party/aiter``, ``qola.cli build --arch "gfx942;gfx950" --skip-checkout``
into ``<QoLA>/build``, ``file(COPY)`` of ``lib/*.so`` and ``include/``, ``-l:te_libmha_fwd.so
-l:te_libmha_bwd.so``, ``$ORIGIN`` after ``cmake --install``. Then ``qola_add_modules()`` of
cmake/QoLA.cmake on the same output: the same tree and build, so nothing is compiled twice. The TE
build is the session's ``te_build`` (tests/support/te_cmake.py), which the other ROCm tests read too."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from support.cmake_clients import ADD_MODULES_CMAKE, cmake, project, read_vars, regular_tree
from support.libdata import kernels_by_arch
from support.rocm_aiter import ARCHS
from support.te_cmake import GROUP, LIBS, NS, SOURCES, TeBuild

pytestmark = [
    pytest.mark.rocm,
    pytest.mark.aiter,
    pytest.mark.ck,
    pytest.mark.slow,
    pytest.mark.skipif(not shutil.which("cmake"), reason="needs cmake"),
]


def ran(exe: Path) -> str:
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split()
    assert out[0] == NS and len(out) == 2, out
    return out[1]


def test_transformer_engine_then_qola_add_modules(te_build: TeBuild) -> None:
    # 1. TE's CMakeLists.txt: configured and built by the session's te_build (support/te_cmake.py)
    tmp_path, mirror, m, qola_dir = te_build.tmp, te_build.mirror, te_build.manifest, te_build.qola_dir
    out, tree = te_build.out, te_build.tree
    head = subprocess.run(["git", "-C", str(tree), "rev-parse", "HEAD"], capture_output=True, text=True, check=True)
    assert head.stdout.strip() == mirror.commit
    data = json.loads((out / "manifest.json").read_text())
    assert data["archs"] == list(ARCHS)
    assert sorted(m_["name"] for m_ in data["modules"] if m_["status"] == "built") == ["libmha_bwd", "libmha_fwd"]
    for lib in LIBS:  # device code for both archs, from the one ;-separated --arch
        assert set(kernels_by_arch(out / "lib" / lib)) >= set(ARCHS), lib

    cache = tmp_path / "bld" / "aiter-prebuilts" / "rocm-7_aiter-pinned"
    files = regular_tree(cache)
    assert {
        "include/qola_config.h",
        "include/qola_mha_fwd.h",
        "include/qola_mha_bwd.h",
        *(f"lib/{lib}" for lib in LIBS),
    } <= set(files)
    for lib in LIBS:
        assert (cache / "lib" / lib).read_bytes() == (out / "lib" / lib).read_bytes()
    version = ran(tmp_path / "bld" / "app")
    subprocess.run(["cmake", "--install", str(tmp_path / "bld")], capture_output=True, check=True)
    assert ran(tmp_path / "prefix" / "lib" / "app") == version
    readelf = ["readelf", "-d", str(tmp_path / "prefix" / "lib" / "libfused_attn.so")]
    needed = subprocess.run(readelf, capture_output=True, text=True, check=True).stdout
    assert all(f"[{lib}]" in needed for lib in LIBS), needed

    # 2. qola_add_modules() on the same output dir and tree: checkout kept, nothing recompiled
    before = {lib: (out / "lib" / lib).read_bytes() for lib in LIBS}
    objects = {p: p.stat().st_mtime_ns for p in (qola_dir / "build.build").rglob("*.o")}
    assert objects
    src2 = project(tmp_path / "proj", ADD_MODULES_CMAKE, SOURCES)
    defs2 = {
        "QOLA_DIR": str(qola_dir),
        "QOLA_MANIFEST": str(m),
        "QOLA_OUT": str(out),
        "QOLA_GROUP": GROUP,
        "ARCHS": ";".join(ARCHS),
        "QOLA_BUILD_ARGS": "-j;2",
    }
    cfg = cmake(src2, tmp_path / "bld2", defs2, mirror.env)
    assert cfg.returncode == 0, cfg.stdout[-4000:] + cfg.stderr[-8000:]
    got = read_vars(tmp_path / "bld2")
    assert got["tree"] == str(tree) and got["libs"] == ";".join(sorted(LIBS))
    assert got["targets"] == ";".join(f"qola::{NS}::{lib[3:-3]}" for lib in sorted(LIBS))
    assert {p: p.stat().st_mtime_ns for p in objects} == objects, "an object was recompiled"
    assert {lib: (out / "lib" / lib).read_bytes() for lib in LIBS} == before
    assert ran(tmp_path / "bld2" / "app_files") == version
    assert ran(tmp_path / "bld2" / "app_targets") == version
