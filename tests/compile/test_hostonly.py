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


@pytest.mark.hip
@pytest.mark.slow
def test_a_dispatch_unit_that_instantiates_a_kernel_fails_its_module_naming_it(tmp_path: Path) -> None:
    """CK's fwd dispatch (``fmha_fwd_api.cpp``, compiled for the host alone: its generator writes no
    kernel into it) here instantiates a kernel. The build fails that module before its link, and the
    error names the unit; its object is not published. Without the kernel the same tree builds."""
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
    assert report.compiled is not None and not report.ok
    (failed,) = [r for r in report.compiled.modules if not r.built]
    assert failed.name == "libmha_ck" and failed.error is not None
    assert failed.error.startswith("error: module libmha_ck: fmha_fwd_api.cpp, compiled for the host alone")
    assert "host stub of kernel void qola_kern<3>(float*)" in failed.error, failed.error
    assert "__hip_module_ctor" in (failed.detail or "") and "report it to qola" in (failed.detail or "")
    assert not (tmp_path / "out.build" / "lib" / "qk_libmha_ck.so").exists()  # the check comes before the link
    assert not (tmp_path / "out" / "lib" / "qk_libmha_ck.so").exists()
    gen.write_text(clean)
    again = pipeline.build(spec)
    assert again.ok, [(r.name, r.error) for r in again.compiled.modules] if again.compiled else again
    built = tmp_path / "out.build" / "obj" / "libmha_ck"
    assert len(list(built.glob("fmha_fwd_api-*.o.hostonly"))) == 1
