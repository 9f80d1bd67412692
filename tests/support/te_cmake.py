"""Transformer Engine's build of qola, as TE's CMakeLists.txt runs it, on the real AITER tree (the amd-aiter
sdist served from a local git mirror): the ROCm tests' one real build of TE's manifest (the session's
``te`` fixture, tests/conftest.py).

TE's manifest narrowed to one CK kernel per direction (tests/support/rocm_aiter.py), gfx942 and gfx950:
``qola.cli checkout`` of the mirror's commit into ``<QoLA>/build/third_party/aiter``, ``qola.cli build
--arch "gfx942;gfx950" --skip-checkout`` into ``<QoLA>/build``, ``file(COPY)`` of ``lib/*.so`` and
``include/``, ``-l:te_libmha_fwd.so -l:te_libmha_bwd.so``. The ROCm tests that read real CK objects read
this build, and test_rocm_cmake_clients.py checks what TE's CMake made of it (one build of the slice
where there were two: 390 s of CI)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from support.cmake_clients import TE_CMAKE, Mirror, cmake, mirror_tree, plain_checkout, project
from support.rocm_aiter import ARCHS, manifest

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


@dataclass(frozen=True)
class TeBuild:
    tmp: Path  # everything below lives here
    mirror: Mirror  # the git mirror TE's checkout cloned
    manifest: Path
    qola_dir: Path  # <QoLA>: this qola as a plain checkout
    bld: Path  # TE's CMake build dir (its app, the aiter-prebuilts copy)

    @property
    def out(self) -> Path:  # qola's output dir (its build dir beside it: OUT.build)
        return self.qola_dir / "build"

    @property
    def tree(self) -> Path:  # the checkout qola built from
        return self.out / "third_party" / "aiter"


def te_build(aiter_root: Path, tmp: Path) -> TeBuild:
    """TE's CMake configure (qola's checkout and build run in it) and build, asserted to succeed."""
    mirror = mirror_tree(aiter_root, tmp)
    m = te_manifest(tmp / "qola_manifest.toml", mirror.commit)
    qola_dir = plain_checkout(tmp)
    src = project(tmp / "te", TE_CMAKE, SOURCES)
    cfg = cmake(src, tmp / "bld", te_defs(qola_dir, m, tmp / "prefix"), mirror.env)
    assert cfg.returncode == 0, cfg.stdout[-4000:] + cfg.stderr[-8000:]
    return TeBuild(tmp, mirror, m, qola_dir, tmp / "bld")
