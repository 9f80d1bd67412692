"""ck-jit's replay of real CK kernels with the ROCm 7 compiler (issue 39), on the session's real build of
Transformer Engine's narrowed manifest (the ``te_build`` fixture, built as TE's CMake builds it: the
amd-aiter sdist, gfx942 and gfx950).
Each forward CK instance's compile line, as qola ran it, is recorded as ck-jit's interceptor records it
and installed as its build installs it; then qola's build dir is hidden and one kernel is compiled as
ck-jit's runtime does at first use (``ck_jit_compile.sh``), its gfx950 twin as TE's CI prebuild does
(``ck_jit_prebuild.py build``, from an empty directory). Each library must export the ``fmha_fwd_<…>``
specialisation the runtime resolves and hold the kernel's code object for the arch its file is for.
(tests/clients/test_ckjit_client.py runs the whole life on a fixture tree with every step of the
interceptor; this one proves it on CK's own headers and qola's probed HIP flags.)"""

from __future__ import annotations

import json
import os
import shlex
import shutil
from pathlib import Path

import pytest
from support.ckjit_replay import archs_named, defined_functions, install, prebuild_compile, runtime_compile
from support.ckjit_rule import SYMBOL_PREFIX, as_the_compiler_sees, classify, compile_parts, extract_flags
from support.common import compile_commands
from support.libdata import kernels_by_arch
from support.te_cmake import TeBuild

pytestmark = [pytest.mark.rocm, pytest.mark.aiter, pytest.mark.slow, pytest.mark.ck]


def test_real_ck_kernels_compile_from_what_ck_jit_records(te_build: TeBuild, tmp_path: Path) -> None:
    tree = te_build.tree  # the checkout the session's build compiled (its paths are in the lines)
    build = Path(f"{te_build.out}.build")
    ndjson = tmp_path / "ck_jit_tmp" / "manifest.json.ndjson"
    ndjson.parent.mkdir()
    lines = []
    for u in compile_commands(build):
        argv = as_the_compiler_sees(shlex.split(u["command"]))
        call = classify(argv, u["directory"])
        name = os.path.basename(call.source or "")
        if call.kind == "blob" and name.startswith("fmha_fwd_d") and call.output:
            source, _ = compile_parts(argv)
            assert source is not None
            flags = extract_flags(argv, source, call.output, u["directory"], str(tree))
            lines.append(json.dumps({"source": call.source, "argv": flags, "kind": "blob"}))
    ndjson.write_text("\n".join(lines) + "\n")
    jit_dir = tmp_path / "install" / "ck_jit"
    kernels = sorted(install(ndjson, tree, jit_dir), key=lambda k: k.name)
    assert [k.name.rsplit("_", 1)[1] for k in kernels] == ["gfx9.cpp", "gfx950.cpp"], [k.name for k in kernels]
    assert [archs_named(k) for k in kernels] == [["gfx942"], ["gfx950"]]

    hipcc = shutil.which("hipcc") or "/usr/bin/hipcc"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CK_JIT")}
    gfx9, gfx950 = kernels
    empty = tmp_path / "empty"
    empty.mkdir()
    hidden = tmp_path / "gone"
    build.rename(hidden)  # qola's build dir (objects, generated sources) no longer exists ...
    try:
        rt = runtime_compile(gfx9, jit_dir, tmp_path / "runtime" / "gfx9.so", hipcc, env)
        pre, pre_lib = prebuild_compile(gfx950, jit_dir, tmp_path / "cache", empty, hipcc, env)
    finally:
        hidden.rename(build)  # ... until the kernels are compiled (other tests read it)
    assert rt.returncode == 0, rt.stderr[-4000:] + "\nflags: " + " ".join(gfx9.argv)
    assert pre.returncode == 0, pre.stderr[-4000:] + "\nflags: " + " ".join(gfx950.argv)
    for lib, arch in ((tmp_path / "runtime" / "gfx9.so", "gfx942"), (pre_lib, "gfx950")):
        assert [s for s in defined_functions(lib) if s.startswith(SYMBOL_PREFIX["fwd"])], lib
        assert any("FmhaFwdKernel" in k for k in kernels_by_arch(lib).get(arch, set())), (lib, kernels_by_arch(lib))
