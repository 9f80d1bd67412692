"""On a GPU: qola's fix ``asm-embedded-first`` (qola/plan/fixes.py) on a copy of the CUDA example whose
module_asm loads its code objects through a loader of the shape of AITER's at TE's pin
(tests/support/embed_tree.py, ``PIN_LOADER``: ``$AITER_ASM_DIR`` before the embedded map), built with
its code objects embedded, with the fixes (the default) and with ``fixes = "none"``. With
``AITER_ASM_DIR`` naming another build's code objects of the same names (a vec_add that subtracts:
another AITER's, as ``import aiter`` sets the variable), the fixed library runs its own embedded
kernel (a + b); upstream's runs the other one (a - b)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.common import run_qola
from support.embed_tree import MD_NAME, MODULE, NS, TYPES, other_code_objects, tree_with_pin_loader

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

CALL = r"""
import importlib.util, sys, torch
spec = importlib.util.spec_from_file_location(sys.argv[2], sys.argv[1])
mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
a = torch.randn(100003, device="cuda"); b = torch.randn(100003, device="cuda")
out = torch.full_like(a, float("nan"))
mod.vec_add(out.data_ptr(), a.data_ptr(), b.data_ptr(), a.numel(), "fp32", torch.cuda.current_stream().cuda_stream)
torch.cuda.synchronize()
print("sum" if torch.equal(out, a + b) else "difference" if torch.equal(out, a - b) else "neither")
"""


@pytest.fixture(scope="module")
def arch() -> str:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, arch: str) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("gpu_fixes")
    tree = tree_with_pin_loader(tmp, arch)
    libs = {"asm_dir": other_code_objects(tmp, arch)}
    for name, line in (("fixed", ""), ("upstream", 'fixes = "none"\n')):
        m = tmp / f"{name}.toml"
        m.write_text(
            f'[qola]\nnamespace = "{NS}"\n{line}[build]\narchitectures = ["{arch}"]\n\n'
            f'[[modules]]\nname = "{MODULE}"\nembed = {json.dumps(list(TYPES))}\n'
        )
        out = tmp / name
        proc = run_qola("build", "--manifest", str(m), "--aiter-root", str(tree), "-o", str(out), "-j", "4")
        assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
        fixes = {f["name"] for f in json.loads((out / "manifest.json").read_text())["fixes"]}
        assert ("asm-embedded-first" in fixes) == (name == "fixed")
        libs[name] = out / "lib" / f"{MD_NAME}.so"
    return libs


def _call(lib: Path, asm_dir: Path | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "AITER_ASM_DIR"}
    if asm_dir is not None:
        env["AITER_ASM_DIR"] = str(asm_dir)
    proc = subprocess.run([sys.executable, "-c", CALL, str(lib), MD_NAME], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_the_embedded_kernel_runs_with_aiter_asm_dir_naming_another_build(built: dict[str, Path]) -> None:
    assert _call(built["fixed"], built["asm_dir"]) == "sum"
    assert _call(built["fixed"], None) == "sum"


def test_without_the_fix_the_other_builds_kernel_runs(built: dict[str, Path]) -> None:
    assert _call(built["upstream"], built["asm_dir"]) == "difference"  # the collision the fix removes
    assert _call(built["upstream"], None) == "sum"
