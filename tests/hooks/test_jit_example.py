"""The example tree's attn_fwd family with every instance deferred: the library holds the
real dispatch (attn_fwd_api.cu) + stubs + table + runtime; the first attn_fwd() call compiles
the instance with nvcc (sm_90). No GPU needed: batch = 0 returns before any launch, and a bad
head size returns ATTN_FWD_BAD_ARGS (-2) — values only the real instance produces (a stub
that cannot get its function returns ATTN_FWD_NO_INSTANCE, -1)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support.jit_lib import DATA, NVCC, build_runtime, fake_compiler, sh, write_config

from qola.jit import key as jkey
from qola.jit import layout

KERNELS = Path(__file__).resolve().parents[2] / "examples/kernels/csrc"

CALLER = r"""#include <cstdio>
#include <cstdlib>
#include "attn_fwd.h"
extern "C" const char* qt_qola_jit_last_error(void);
int main(int argc, char** argv)
{
    attn_fwd_traits t{64, "fp16", false, false, false};
    attn_fwd_args a{};
    a.batch = 0; a.seqlen_q = 0; a.seqlen_k = 0; a.nhead_q = 1; a.nhead_k = 1;
    a.hdim = atoi(argv[1]);
    a.scale = 0.125f;
    float r = attn_fwd(t, a, nullptr);
    printf("%g\n", r);
    if(r == ATTN_FWD_NO_INSTANCE) fprintf(stderr, "%s\n", qt_qola_jit_last_error());
    return 0;
}
"""


@pytest.mark.slow
@pytest.mark.skipif(NVCC is None, reason="needs nvcc")
def test_example_attn_fwd_all_deferred(tmp_path: Path) -> None:
    gen = tmp_path / "gen"
    only = "attn_fwd_d64_fp16_batch_*_nmask_nlse"
    subprocess.run(
        [sys.executable, str(KERNELS / "attn/generate.py"), "--receipt", "1", "--filter", only, "-o", str(gen)],
        check=True,
    )
    units = [(p.stem, p) for p in sorted(gen.glob("attn_fwd_d*.cu"))]
    assert len(units) == 1
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "QOLA_JIT_CACHE_DIR": str(tmp_path / "cache")}
    assert NVCC is not None
    cc = fake_compiler(tmp_path, NVCC)
    spec = layout.JitModuleSpec(
        module="attn_fwd",
        lang="cuda",
        arch="sm_90",
        compiler=jkey.probe_compiler(str(cc), env),
        flags=(*layout.shared_object_flags("cuda", ["sm_90"]), "-O1", "-std=c++17"),
        include_dirs=(KERNELS / "include", KERNELS / "attn"),
        style="example_attn",
    )
    out = layout.write_jit_module(spec, units, out_jit=tmp_path / "out/jit", stub_dir=tmp_path / "build", batch=8)
    assert len(out.stub_sources) == 1 and out.stub_sources[0].suffix == ".cu"
    write_config(tmp_path / "build/include")
    incs: list[object] = ["-I", tmp_path / "build/include", "-I", DATA, "-I", DATA / "jit"]
    incs += ["-I", KERNELS / "include", "-I", KERNELS / "attn"]
    runtime = build_runtime(tmp_path / "rt")
    objs = []
    for src in (gen / "attn_fwd_api.cu", *out.stub_sources):
        obj = tmp_path / "build" / (src.stem + ".o")
        sh([NVCC, "-std=c++17", "-O1", "-arch=sm_90", "-Xcompiler", "-fPIC", *incs, "-c", src, "-o", obj])
        objs.append(obj)
    sh(["g++", "-std=c++17", "-O1", "-fPIC", *incs, "-c", out.table_source, "-o", tmp_path / "build/table.o"])
    lib = tmp_path / "out/lib/libqt.so"
    lib.parent.mkdir(parents=True)
    sh([NVCC, "-shared", "-o", lib, *objs, tmp_path / "build/table.o", *runtime, "-ldl"])
    (tmp_path / "caller.cu").write_text(CALLER)
    caller = tmp_path / "caller"
    link_args = ["-L", lib.parent, "-lqt", f"-Xlinker=-rpath,{lib.parent}", "-o", caller]
    sh([NVCC, "-O1", "-I", KERNELS / "include", tmp_path / "caller.cu", *link_args])

    def call(hdim: int, extra: dict[str, Any] | None = None) -> str:
        proc = subprocess.run([str(caller), str(hdim)], capture_output=True, text=True, env={**env, **(extra or {})})
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.strip() + ("\n" + proc.stderr if proc.stderr else "")

    def compiles() -> int:
        return len((tmp_path / "count").read_text().split()) if (tmp_path / "count").exists() else 0

    first = call(64, {"QOLA_JIT": "0"})
    assert first.startswith("-1\n") and "QOLA_JIT=0 forbids" in first and compiles() == 0  # the stub's -1
    assert call(64) == "0" and compiles() == 1  # compiled, ran: ATTN_FWD_OK
    assert call(100) == "-2" and compiles() == 1  # cached in a new process: the real checks ran
