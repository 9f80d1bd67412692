"""CUDA units without device code compile host-only, proven by the object (issue 50 item 2): a plain
pybind11 entry source (the example's rmsnorm entry: its header reads qk_types.h, which tests no
``__CUDACC__``) goes to the host compiler (``-x c++``: no cudafe++, cicc or ptxas), its object
holds no fatbin, no registration and no kernel stub, and the library loads and answers; an entry
source that defines a kernel keeps nvcc's device passes and its kernel."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile
from support.common import KERNELS

from qola.compile import hostonly
from qola.compile.elf import object_symbols
from qola.pipeline import run as pipeline
from qola.pipeline.run import BuildSpec

pytestmark = pytest.mark.slow

# the host compiler, the toolkit's cuda_runtime.h by its absolute path (not one of the build dir's)
HOST_LINE = re.compile(r" -x c\+\+ -include /\S+/include/cuda_runtime\.h ")
# two entry sources whose kernel is spelled through a macro their flags define (their text shows no
# device code): one compiles for the host (an object with the kernel as a host function, marked), the
# other does not (threadIdx is the device compiler's)
HIDDEN = "#include <cuda_runtime.h>\nQOLA_KERNEL void qola_hidden_kernel(float* p) { p[0] = 2.0f; }\n"
FAILING = "#include <cuda_runtime.h>\nQOLA_KERNEL void qola_failing_kernel(float* p) { p[threadIdx.x] = 3.0f; }\n"

KERNEL = (
    "\n__global__ void qola_entry_kernel(float* p) { p[threadIdx.x] = 1.0f; }\n"
    "void qola_entry_launch(float* p) { qola_entry_kernel<<<1, 32>>>(p); }\n"
)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("hostonly_cuda")
    tree = tmp / "kernels"
    shutil.copytree(KERNELS, tree, ignore=shutil.ignore_patterns("hsa"))
    entry = tree / "csrc" / "pybind" / "softmax_pybind.cu"
    entry.write_text(entry.read_text() + KERNEL)
    (entry.parent / "hidden_kernel.cu").write_text(HIDDEN)
    (entry.parent / "failing_kernel.cu").write_text(FAILING)
    table_path = tree / "aiter" / "jit" / "optCompilerConfig.json"
    table = json.loads(table_path.read_text())
    for name in ("hidden_kernel", "failing_kernel"):
        table["module_softmax"]["srcs"].append(f"f'{{AITER_CSRC_DIR}}/pybind/{name}.cu'")
    table["module_softmax"]["flags_extra_hip"].append("'-DQOLA_KERNEL=__global__'")
    table_path.write_text(json.dumps(table, indent=1))
    m = tmp / "q.toml"
    m.write_text(
        '[qola]\nnamespace = "qk"\n[build]\narchitectures = ["sm_90"]\n'
        '[[modules]]\nname = "module_rmsnorm"\n[[modules]]\nname = "module_softmax"\n'
    )
    spec = BuildSpec.make(manifest=str(m), aiter_root=str(tree), output_dir=str(tmp / "out"), jobs=2)
    report = pipeline.build(spec)
    assert report.ok, [r.detail for r in report.modules]
    return tmp


def _commands(build_dir: Path) -> dict[str, str]:
    """Each compiled source's name -> its compile line (``ninja -t commands``)."""
    lines = subprocess.run(
        ["ninja", "-C", str(build_dir), "-t", "commands"], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    return {Path(ln.split(" -c ", 1)[1].split()[0]).name: ln for ln in lines if " -c " in ln and "nvcc" in ln}


def _object(build_dir: Path, module: str, stem: str) -> Path:
    (obj,) = (build_dir / "obj" / module).glob(f"{stem}-*.o")
    return obj


def test_the_plain_entry_source_compiles_host_only_and_its_object_holds_no_device_code(built: Path) -> None:
    bdir = built / "out.build"
    lines = _commands(bdir)
    assert HOST_LINE.search(lines["rmsnorm_pybind.cu"]), lines["rmsnorm_pybind.cu"]
    assert " -x cu -c " in lines["rmsnorm.cu"] and " -x c++ " not in lines["rmsnorm.cu"]
    obj = _object(bdir, "module_rmsnorm", "rmsnorm_pybind")
    syms = object_symbols(obj)
    assert syms is not None and not {".nv_fatbin", "__nv_relfatbin", ".qola_cuda_global"} & syms.sections
    names = syms.defined | syms.undefined
    assert not [n for n in names if "__cudaRegisterFatBinary" in n or "__fatbinwrap" in n or "__device_stub__" in n]
    assert hostonly.findings(obj) == ()
    assert Path(f"{obj}.hostonly").read_text() == "no device code\n"
    # its kernel source keeps the device passes: the library's kernels are there
    kern = object_symbols(_object(bdir, "module_rmsnorm", "rmsnorm"))
    assert kern is not None and ".nv_fatbin" in kern.sections


def test_the_library_with_a_host_only_entry_loads_and_answers(built: Path) -> None:
    so = built / "out" / "lib" / "qk_module_rmsnorm.so"
    code = (
        "import importlib.util as u, sys; s = u.spec_from_file_location(sys.argv[2], sys.argv[1]); "
        "m = u.module_from_spec(s); s.loader.exec_module(m); print(m.tuned_config()); print(m.rmsnorm.__doc__)"
    )
    proc = subprocess.run([sys.executable, "-c", code, str(so), "qk_module_rmsnorm"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    first, *rest = proc.stdout.splitlines()
    assert first.endswith("rmsnorm_tuned.csv") and "rmsnorm(" in "\n".join(rest)


def test_an_entry_source_that_defines_a_kernel_keeps_its_device_passes(built: Path) -> None:
    bdir = built / "out.build"
    line = _commands(bdir)["softmax_pybind.cu"]
    assert " -x cu -c " in line and " -x c++ " not in line
    obj = _object(bdir, "module_softmax", "softmax_pybind")
    syms = object_symbols(obj)
    assert syms is not None and ".nv_fatbin" in syms.sections
    assert "_Z17qola_entry_kernelPf" in syms.defined  # the kernel's handle, and its host stub
    assert "_Z37__device_stub__Z17qola_entry_kernelPfPf" in syms.defined
    with obj.open("rb") as f:  # the kernel's sm_90 code is in the object's fatbin (its cubin names it)
        fatbin = ELFFile(f).get_section_by_name(".nv_fatbin")
        assert fatbin is not None and b"_Z17qola_entry_kernelPf" in fatbin.data()
    assert not Path(f"{obj}.hostonly").exists()  # not host-only: no check edge


def test_a_host_only_unit_whose_object_holds_a_kernel_is_compiled_again_with_device_passes(built: Path) -> None:
    """Its text names no kernel (the macro comes from its flags): compiled host-only, the check edge
    finds the kernel qola's host-only line marked, compiles the unit again with nvcc's device passes
    and says so in the module's log; the library holds the kernel's GPU code."""
    bdir = built / "out.build"
    line = _commands(bdir)["hidden_kernel.cu"]
    assert HOST_LINE.search(line), line  # judged host-only from its text
    obj = _object(bdir, "module_softmax", "hidden_kernel")
    stamp = Path(f"{obj}.hostonly").read_text()
    assert stamp.startswith("device code: compiled again with device passes") and ".qola_cuda_global" in stamp
    log = (built / "out" / "logs" / "module_softmax.log").read_text()
    assert "hidden_kernel.cu was compiled for the host alone, but its object holds device code" in log, log
    syms = object_symbols(obj)
    assert syms is not None and ".nv_fatbin" in syms.sections and ".qola_cuda_global" not in syms.sections
    assert "_Z18qola_hidden_kernelPf" in syms.defined
    with obj.open("rb") as f:
        fatbin = ELFFile(f).get_section_by_name(".nv_fatbin")
        assert fatbin is not None and b"_Z18qola_hidden_kernelPf" in fatbin.data()


def test_a_host_only_unit_that_the_host_compiler_refuses_is_compiled_with_device_passes(built: Path) -> None:
    """Its text names no kernel, and its kernel reads ``threadIdx``, which only the device compiler
    declares: the host-only compile fails, the edge says so and compiles it with nvcc's device passes;
    the check edge finds GPU code there and compiles nothing more."""
    bdir = built / "out.build"
    line = _commands(bdir)["failing_kernel.cu"]
    assert HOST_LINE.search(line) and "|| { printf " in line, line
    obj = _object(bdir, "module_softmax", "failing_kernel")
    log = (built / "out" / "logs" / "module_softmax.log").read_text()
    assert "failing_kernel.cu: its host-only compile failed: compiled again with device passes" in log, log
    assert "threadIdx" not in log  # the host-only attempt's errors are not the unit's
    stamp = Path(f"{obj}.hostonly").read_text()
    assert stamp.startswith("device code: compiled with device passes (") and ".nv_fatbin" in stamp, stamp
    with obj.open("rb") as f:
        fatbin = ELFFile(f).get_section_by_name(".nv_fatbin")
        assert fatbin is not None and b"_Z19qola_failing_kernelPf" in fatbin.data()
