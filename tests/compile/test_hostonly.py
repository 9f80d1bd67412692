"""Every host-only object is proven by its symbols (issue 42 item 1): a unit compiled with
``--cuda-host-only`` that holds a kernel fails its module, naming the unit, before the link. What the
check looks for is what Debian's hipcc (clang 15) really emits for such a unit."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from support.ck_tree import ck_tree, module

from qola.compile import hostonly
from qola.compile.elf import object_symbols
from qola.pipeline import run as pipeline
from qola.pipeline.run import BuildSpec

KERNEL = (
    "#include <hip/hip_runtime.h>\n"
    "template <int N> __global__ void qola_kern(float* p) { p[threadIdx.x] *= N; }\n"
    "template __global__ void qola_kern<3>(float*);\n"
)
DISPATCH = "template <int N> float qola_launch(int);\nfloat qola_dispatch(int x) { return qola_launch<3>(x); }\n"
DEVICE_VAR = "#include <hip/hip_runtime.h>\n__device__ int qola_counter;\nint qola_host() { return 2; }\n"


def _host_only(tmp: Path, name: str, text: str) -> Path:
    """``text`` compiled by the host's hipcc for the host alone (gfx90a named, as qola's lines do)."""
    src, obj = tmp / f"{name}.cpp", tmp / f"{name}.o"
    src.write_text(text)
    hipcc = shutil.which("hipcc") or "/usr/bin/hipcc"
    argv = [hipcc, "-x", "hip", "-c", str(src), "-o", str(obj), "--offload-arch=gfx90a", "--cuda-host-only"]
    subprocess.run(argv, check=True, env={**os.environ, "HIP_PLATFORM": "amd"}, timeout=300)
    return obj


@pytest.mark.hip
def test_what_a_host_only_compile_of_a_kernel_leaves(tmp_path: Path) -> None:
    """A ``__global__`` template instantiated in a host-only unit: clang still emits the kernel's host
    stub, its handle, the module constructor and a reference to the code object it would register
    (``__hip_fatbin``, which no device pass made). A dispatch calling a launcher declared elsewhere
    holds none of it; a ``__device__`` variable is registered like a kernel."""
    found = hostonly.findings(_host_only(tmp_path, "kernel", KERNEL))
    text = "; ".join(found)
    assert "host stub of kernel" in text and "qola_kern<3>" in text and "1 kernel handle(s)" in text
    assert "__hip_module_ctor" in text and "__hip_fatbin" in text
    assert hostonly.findings(_host_only(tmp_path, "dispatch", DISPATCH)) == ()
    var = "; ".join(hostonly.findings(_host_only(tmp_path, "var", DEVICE_VAR)))
    assert "__hip_module_ctor" in var and "__hip_fatbin" in var and "host stub" not in var


def test_the_kernel_handle_of_a_stub() -> None:
    assert hostonly.kernel_of("_Z19__device_stub__kernILi3EEvPf") == "_Z4kernILi3EEvPf"
    assert hostonly.kernel_of("_ZN2ns20__device_stub__kern2EPf") == "_ZN2ns5kern2EPf"
    assert hostonly.kernel_of("__device_stub__k") == "k"


def test_an_empty_object_passes_and_one_that_is_not_elf_cannot(tmp_path: Path) -> None:
    """A compiler wrapper's empty stub holds no code (ck-jit compiles it later); bytes that are not an
    ELF object prove nothing, so they fail."""
    (tmp_path / "empty.o").write_bytes(b"")
    (tmp_path / "junk.o").write_bytes(b"BC\xc0\xde not elf")
    assert hostonly.findings(tmp_path / "empty.o") == ()
    assert hostonly.findings(tmp_path / "missing.o") == ()
    assert "nothing qola can read" in hostonly.findings(tmp_path / "junk.o")[0]


def _ninja_runs(build_dir: Path) -> int:
    return len((build_dir / ".ninja_log").read_text().splitlines())


@pytest.mark.hip
@pytest.mark.slow
def test_a_dispatch_unit_that_instantiates_a_kernel_is_compiled_again_with_device_passes(tmp_path: Path) -> None:
    """CK's fwd dispatch (``fmha_fwd_api.cpp``, compiled for the host alone: its generator writes no
    kernel into it) here instantiates a kernel (issue 51 item 4). Its object shows it; the check edge
    compiles the unit again with device passes and the module's log says so: the module builds, its
    object holds the kernel's code object, and a second build runs no edge (no flip-flop between the
    two compiles). Without the kernel the same unit is host-only again."""
    tree = ck_tree(tmp_path / "tree", calls=("fwd",))
    gen = tree / "3rdparty/ck/example/ck_tile/01_fmha/generate.py"
    clean = gen.read_text()
    gen.write_text(
        clean + f"\napi = out / ('fmha_' + a.direction + '_api.cpp')\napi.write_text({KERNEL!r} + api.read_text())\n"
    )
    m = tmp_path / "q.toml"
    m.write_text(
        '[qola]\nnamespace = "qk"\n[build]\narchitectures = ["gfx90a"]\nmode = "cpp_itfs"\n'
        + module(directions=("fwd",))
    )
    spec = BuildSpec.make(
        manifest=str(m), aiter_root=str(tree), output_dir=str(tmp_path / "out"), jobs=2, env=dict(os.environ)
    )
    report = pipeline.build(spec)
    assert report.ok, [(r.name, r.error) for r in report.compiled.modules] if report.compiled else report
    log = (tmp_path / "out" / "logs" / "libmha_ck.log").read_text()
    assert "fmha_fwd_api.cpp was compiled for the host alone, but its object holds device code" in log, log
    assert "host stub of kernel void qola_kern<3>(float*)" in log and "compiled again with device passes" in log
    built = tmp_path / "out.build" / "obj" / "libmha_ck"
    (obj,) = built.glob("fmha_fwd_api-*.o")
    syms = object_symbols(obj)
    assert syms is not None and ".hip_fatbin" in syms.sections  # the code object a device pass made
    assert "_Z24__device_stub__qola_kernILi3EEvPf" in syms.defined
    (stamp,) = built.glob("fmha_fwd_api-*.o.hostonly")
    assert stamp.read_text().startswith("device code: compiled again with device passes")
    assert (tmp_path / "out" / "lib" / "qk_libmha_ck.so").is_file()
    runs = _ninja_runs(tmp_path / "out.build")
    assert pipeline.build(spec).ok and _ninja_runs(tmp_path / "out.build") == runs  # nothing rebuilt
    gen.write_text(clean)
    again = pipeline.build(spec)
    assert again.ok, [(r.name, r.error) for r in again.compiled.modules] if again.compiled else again
    assert stamp.read_text() == "no device code\n"
    assert hostonly.findings(obj) == ()
