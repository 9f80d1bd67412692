"""What the shared link promises (docs/integration.md): a torch-free library with an undefined
symbol fails its link (``-Wl,--no-undefined``), naming the symbol; every shared object carries a
GNU build-id note (``-Wl,--build-id=sha1``); Python extension modules may leave libpython's
symbols to the interpreter."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from subprocess import CompletedProcess
from typing import cast

import pytest
from elftools.elf.elffile import ELFFile
from elftools.elf.sections import NoteSection
from support.common import KERNELS, run_qola

from qola.compile import link
from qola.core.errors import FailedProcessError
from qola.core.fsutil import write_if_changed
from qola.toolchain import Toolchain

CXX = shutil.which("g++") or shutil.which("c++") or ""
pytestmark = pytest.mark.skipif(not CXX, reason="needs a host C++ compiler")

GOOD = 'extern "C" __attribute__((visibility("default"))) int te_libgood_answer() { return 42; }\n'
BAD = (
    'extern "C" int qola_never_defined_anywhere(int);\n'
    'extern "C" __attribute__((visibility("default"))) int te_libbad_use(int x) '
    "{ return qola_never_defined_anywhere(x); }\n"
)


def build_id(path: Path) -> str | None:
    with path.open("rb") as f:
        sec = ELFFile(f).get_section_by_name(".note.gnu.build-id")
        if not isinstance(sec, NoteSection):
            return None
        note = next(n for n in sec.iter_notes() if n["n_type"] == "NT_GNU_BUILD_ID")
        return cast("str | None", note["n_desc"])


def objects(tmp: Path, name: str, text: str) -> Path:
    src, obj = tmp / f"{name}.cpp", tmp / f"{name}.o"
    src.write_text(text)
    subprocess.run([CXX, "-fPIC", "-O1", "-c", str(src), "-o", str(obj)], check=True)
    return write_if_changed(tmp / f"{name}.rsp", link.rsp_text([obj]))


def test_an_undefined_symbol_fails_the_library_link_naming_it(tmp_path: Path) -> None:
    rsp = objects(tmp_path, "bad", BAD)
    out = tmp_path / "te_libbad.so"
    vs = write_if_changed(tmp_path / "te.version", link.version_script("te"))
    with pytest.raises(FailedProcessError) as info:
        link.run_step(link.shared_link_argv(CXX, rsp, out, link.library_ldflags(vs, out.name)))
    assert "qola_never_defined_anywhere" in info.value.output and "undefined reference" in info.value.output
    assert not out.exists()
    # a Python extension module leaves such symbols to the interpreter (libpython)
    link.run_step(link.shared_link_argv(CXX, rsp, tmp_path / "mod.so", link.python_module_ldflags(None)))


def test_every_shared_object_has_a_reproducible_build_id(tmp_path: Path) -> None:
    tc = Toolchain("hip", "/x/hipcc", "6.4", "out", "ab" * 32, ("gfx942",), CXX, {})
    rsp = objects(tmp_path, "good", GOOD)
    ids = []
    for name in ("a.so", "b.so"):
        subprocess.run(
            tc.shared_link_argv(rsp, tmp_path / name, link.library_ldflags(None, "te_libgood.so")), check=True
        )
        ids.append(build_id(tmp_path / name))
    assert ids[0] and len(ids[0]) == 40 and ids[0] == ids[1]  # sha1 of the content: same input, same id


def _manifest(tmp: Path, *modules: tuple[str, str]) -> Path:
    body = '[qola]\nnamespace = "te"\n[build]\narchitectures = ["sm_90"]\n'
    for name, text in modules:
        src = tmp / f"{name}.cu"
        src.write_text(text)
        body += f'[[modules]]\nname = "{name}"\nmode = "cpp_itfs"\nsrcs = ["{src}"]\nis_python_module = false\n'
    path = tmp / "q.toml"
    path.write_text(body)
    return path


def _build(tmp: Path, manifest: Path, *more: str) -> tuple[CompletedProcess[str], Path]:
    out = tmp / "out"
    return run_qola("build", "--manifest", str(manifest), "--aiter-root", str(KERNELS), "-o", str(out), *more), out


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_qola_build_libraries_carry_a_build_id(tmp_path: Path) -> None:
    proc, out = _build(tmp_path, _manifest(tmp_path, ("libgood", GOOD)))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert build_id(out / "lib" / "te_libgood.so")


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_qola_build_fails_a_library_with_an_undefined_symbol(tmp_path: Path) -> None:
    m = _manifest(tmp_path, ("libgood", GOOD), ("libbad", BAD))
    proc, out = _build(tmp_path, m)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "qola_never_defined_anywhere" in proc.stdout + proc.stderr
    assert not (out / "lib").exists()  # a failed module: nothing published (issue 41)
    proc, out = _build(tmp_path, m, "--keep-going")
    assert proc.returncode == 1 and "qola_never_defined_anywhere" in proc.stdout + proc.stderr
    assert (out / "lib" / "te_libgood.so").exists() and not (out / "lib" / "te_libbad.so").exists()
