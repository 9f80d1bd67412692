"""qola's CMake clients replayed on the real AITER tree (the amd-aiter sdist) in the ROCm 7 environment
(``scripts/rocm7.sh run python -m pytest -m rocm tests/clients/test_rocm_cmake_clients.py``).

Transformer Engine's call form on TE's manifest narrowed to one CK kernel per direction
(test_rocm_aiter.py's narrowing), gfx942 and gfx950: ``qola.cli checkout`` from a local git mirror of the
tree into ``<QoLA>/build/third_party/aiter``, ``qola.cli build --arch "gfx942;gfx950" --skip-checkout``
into ``<QoLA>/build``, ``file(COPY)`` of ``lib/*.so`` and ``include/``, ``-l:te_libmha_fwd.so
-l:te_libmha_bwd.so``, ``$ORIGIN`` after ``cmake --install``. Then ``qola_add_modules()`` of
cmake/QoLA.cmake on the same output: the same tree and build, so nothing is compiled twice."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from support.cmake_clients import (
    ADD_MODULES_CMAKE,
    TE_CMAKE,
    cmake,
    mirror_tree,
    plain_checkout,
    project,
    read_vars,
    regular_tree,
)
from support.libdata import kernels_by_arch
from support.rocm_aiter import ARCHS, manifest

pytestmark = [
    pytest.mark.rocm,
    pytest.mark.aiter,
    pytest.mark.ck,
    pytest.mark.slow,
    pytest.mark.skipif(not shutil.which("cmake"), reason="needs cmake"),
]

NS, GROUP = "te", "ck_fused_attn"
LIBS = ("te_libmha_fwd.so", "te_libmha_bwd.so")
FUSED_ATTN_C = r"""
#include <stdio.h>
#include <stddef.h>
#include "qola_config.h"
extern const char* te_qola_version(void);
int fused_attn_probe(char* buf, size_t n) { return snprintf(buf, n, "%s %s", QOLA_NAMESPACE_STR, te_qola_version()); }
"""
MAIN_C = r"""
#include <stdio.h>
#include <stddef.h>
int fused_attn_probe(char* buf, size_t n);
int main(void) { char buf[256]; fused_attn_probe(buf, sizeof buf); puts(buf); return 0; }
"""
SOURCES = {"fused_attn.c": FUSED_ATTN_C, "main.c": MAIN_C}


def te_manifest(path: Path, commit: str) -> Path:
    """TE's qola_manifest.toml shape (test_rocm_aiter's narrowing), pinned to the mirror's commit,
    every module in one group as a qola_add_modules() consumer declares them."""
    manifest(path, NS, bwd=True)
    text = path.read_text().replace("[qola]\n", f'[qola]\naiter_commit = "{commit}"\n', 1)
    # the sdist's libmha_fwd (AITER's pre-Dec-2025 API) lists no sources, so TE's drop_srcs match nothing:
    # against the pinned tree (this mirror's commit) qola refuses such a pattern, where the plain sdist
    # only gets a warning (docs/manifest.md, drop_srcs)
    text, dropped = re.subn(r"drop_srcs = \[[^\]]*\]\n", "", text)
    assert dropped == 1
    text = re.sub(r'(\[\[modules\]\]\nname = "[a-z_]+"\n)', rf'\1group = "{GROUP}"\n', text)
    assert text.count(f'group = "{GROUP}"') == 2
    path.write_text(text)
    return path


def ran(exe: Path) -> str:
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split()
    assert out[0] == NS and len(out) == 2, out
    return out[1]


def te_defs(qola_dir: Path, m: Path, prefix: Path) -> dict[str, str]:
    """The -D settings TE's CMakeLists.txt is configured with (its install prefix ``prefix``)."""
    return {
        "QOLA_DIR": str(qola_dir),
        "QOLA_MANIFEST": str(m),
        "ARCHS": ";".join(ARCHS),
        "QOLA_TEST_ARGS": "-j;2",
        "QOLA_LINK": ";".join(f"-l:{lib}" for lib in LIBS),
        "QOLA_LIB_FILES": ";".join(LIBS),
        "CMAKE_INSTALL_PREFIX": str(prefix),
    }


def test_transformer_engine_then_qola_add_modules(aiter_root: Path, tmp_path: Path) -> None:
    mirror = mirror_tree(aiter_root, tmp_path)
    m = te_manifest(tmp_path / "qola_manifest.toml", mirror.commit)
    qola_dir = plain_checkout(tmp_path)
    out, tree = qola_dir / "build", qola_dir / "build" / "third_party" / "aiter"

    # 1. TE's CMakeLists.txt
    src = project(tmp_path / "te", TE_CMAKE, SOURCES)
    cfg = cmake(src, tmp_path / "bld", te_defs(qola_dir, m, tmp_path / "prefix"), mirror.env)
    assert cfg.returncode == 0, cfg.stdout[-4000:] + cfg.stderr[-8000:]
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
