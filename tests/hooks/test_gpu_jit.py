"""On a GPU: a qola-built library with [jit] runs a deferred variant correctly. libattn_fwd (cpp_itfs,
bf16 only) builds the no-mask half ahead and defers the causal half; a child process (torch +
ctypes on the C ABI) calls a deferred causal variant: compiled once, matches a torch reference; a
second process uses the cache (no compile) and gets the same result; an AOT variant never compiles."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.attn_abi import attn_manifest, child_call, child_preamble
from support.common import KERNELS, run_qola
from support.jit_lib import NVCC, counting_nvcc

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

MANIFEST = attn_manifest(
    "qg",
    """[jit]
[[jit.aot.variants]]
module = "libattn_fwd"
pattern = "attn_fwd_*_{mask}_*"
options = {mask = false}
tokens = {mask = {true = "mask", false = "nmask"}}
""",
)

CHILD = (
    child_call("qg")
    + r"""
err = (o.float() - ref).abs().max().item()
lerr = (lse - torch.logsumexp(s, -1)).abs().max().item()
print(r, f"{err:.5f}", f"{lerr:.6f}", lib.qg_qola_jit_last_error().decode())
"""
)


@pytest.mark.skipif(NVCC is None, reason="needs nvcc")
def test_deferred_variant_on_gpu_compiles_once_and_matches_torch(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    m = tmp_path / "q.toml"
    m.write_text(MANIFEST)
    out = tmp_path / "out"
    proc = run_qola("build", "--manifest", str(m), "--aiter-root", str(KERNELS), "-o", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rec = json.loads((out / "manifest.json").read_text())["modules"][0]
    assert rec["jit"]["aot"]["count"] == 8 and rec["jit"]["deferred"]["count"] == 8
    assert all("_mask_" in n for n in rec["jit"]["deferred"]["names"])
    assert run_qola("audit", str(out)).returncode == 0

    cc, count = counting_nvcc(tmp_path)
    (tmp_path / "child.py").write_text(child_preamble() + CHILD)
    env = {**os.environ, "QOLA_JIT_CACHE_DIR": str(tmp_path / "cache"), "QOLA_JIT_COMPILER": str(cc)}

    def call(causal: int) -> list[str]:
        p = subprocess.run(
            [sys.executable, str(tmp_path / "child.py"), str(out / "lib/qg_libattn_fwd.so"), str(causal)],
            capture_output=True,
            text=True,
            env=env,
            timeout=600,
        )
        assert p.returncode == 0, p.stdout + p.stderr
        return p.stdout.split()

    def compiles() -> int:
        return len(count.read_text().split()) if count.exists() else 0

    r, err, lerr, *msg = call(0)  # AOT (no mask): no compile
    assert r == "0" and float(err) < 5e-2 and float(lerr) < 1e-3 and compiles() == 0, msg
    first = call(1)  # deferred (causal): compiled on first use
    assert first[0] == "0" and float(first[1]) < 5e-2 and float(first[2]) < 1e-3, first
    assert compiles() == 1
    second = call(1)  # a new process: from the cache, same result
    assert second[:3] == first[:3] and compiles() == 1
    assert len([p for p in (tmp_path / "cache").glob("*.so") if not p.name.startswith(".")]) == 1
