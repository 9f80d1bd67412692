"""On a GPU: module_asm built by ``qola build`` with its code objects embedded
(``embed = ["vec_add", "vec_scale"]``) runs them from the embedded map, with the tree's hsa/
deleted after the build, and matches torch."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from support.embed_tree import MD_NAME, qola_build, tree_with_code_objects

pytestmark = [pytest.mark.gpu, pytest.mark.slow]


@pytest.fixture(scope="module")
def torch() -> Any:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    return torch


@pytest.fixture(scope="module")
def arch(torch: Any) -> str:
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}"  # sm_90 on the H100


@pytest.fixture(scope="module")
def asm(tmp_path_factory: pytest.TempPathFactory, arch: str) -> ModuleType:
    tmp = tmp_path_factory.mktemp("gpu_embed")
    tree = tree_with_code_objects(tmp, arch)
    proc, out = qola_build(tmp, tree, arch)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    shutil.rmtree(tree / "hsa")  # from here on the code objects exist only inside the module
    path = out / "lib" / f"{MD_NAME}.so"
    spec = importlib.util.spec_from_file_location(MD_NAME, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    sys.modules[MD_NAME] = mod
    return mod


DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


def test_embedded_set_and_arch(asm: ModuleType, arch: str) -> None:
    assert asm.device_arch() == arch
    assert asm.embedded_keys() == sorted(
        f"hsa/{arch}/{t}"
        for t in (
            "vec_add/vec_add_bf16.co",
            "vec_add/vec_add_fp16.co",
            "vec_add/vec_add_fp32.co",
            "vec_scale/vec_scale_fp32.co",
            "vec_scale/vec_scale_fp32x4.co",
        )
    )


@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("n", [1, 1000003])
def test_vec_add_matches_torch(asm: ModuleType, torch: Any, dtype: str, n: int) -> None:
    tdt = getattr(torch, DTYPES[dtype])
    a = torch.randn(n, device="cuda", dtype=tdt)
    b = torch.randn(n, device="cuda", dtype=tdt)
    out = torch.full_like(a, float("nan"))
    stream = torch.cuda.current_stream().cuda_stream
    asm.vec_add(out.data_ptr(), a.data_ptr(), b.data_ptr(), n, dtype, stream)  # no asm_dir: embedded only
    torch.cuda.synchronize()
    ref = (a.float() + b.float()).to(tdt)  # the kernel adds in fp32 and rounds to nearest, as torch does
    torch.testing.assert_close(out, ref, atol=0, rtol=0)


@pytest.mark.parametrize("offset", [0, 1])  # 0: 16-byte aligned -> the x4 code object; 1: the scalar one
def test_vec_scale_matches_torch(asm: ModuleType, torch: Any, offset: int) -> None:
    n = 1000003
    x = torch.randn(n + 1, device="cuda")[offset : offset + n]
    out = torch.empty(n + 1, device="cuda")[offset : offset + n]
    asm.vec_scale(out.data_ptr(), x.data_ptr(), -1.5, n, torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    torch.testing.assert_close(out, x * -1.5, atol=0, rtol=0)


def test_bad_dtype_and_embedded_first(asm: ModuleType, torch: Any, tmp_path: Path) -> None:
    x = torch.zeros(4, device="cuda", dtype=torch.float64)
    with pytest.raises(ValueError):
        asm.vec_add(x.data_ptr(), x.data_ptr(), x.data_ptr(), 4, "fp64")
    empty = tmp_path / "empty"
    empty.mkdir()
    # embedded first: an empty asm_dir changes nothing for an embedded object
    y = torch.ones(8, device="cuda")
    asm.vec_add(y.data_ptr(), y.data_ptr(), y.data_ptr(), 8, "fp32", 0, str(empty))
    torch.cuda.synchronize()
    assert y.tolist() == [2.0] * 8
