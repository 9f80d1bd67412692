"""TE's CK_JIT mode from qola alone (issue 35), on the amd-aiter sdist in the ROCm 7 environment.

examples/te-ckjit-manifest.toml's ``[jit]`` on TE's manifest narrowed to one forward and one backward
kernel (tests/support/rocm_aiter.py), for gfx942: every CK instance is a stub in the libraries (no CK
device code in them), what is built ahead is in full (AITER's own API, the CK dispatch, the asm v3
dispatch and its code objects byte for byte), and ``qola jit prebuild`` of one deferred kernel
compiles it (its code object for gfx942 in the cache entry) and ``qola jit verify`` accepts the entry.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from support.common import EXAMPLES, run_qola
from support.libdata import embedded_blobs, kernels_by_arch
from support.rocm_aiter import NS, build, manifest

from qola.hooks import embed

pytestmark = [pytest.mark.rocm, pytest.mark.aiter, pytest.mark.slow, pytest.mark.ck]

# the documented manifest's own [jit] section, so that the test builds what docs/coming-from-qola.md shows
JIT = "\n[jit]" + (EXAMPLES / "te-ckjit-manifest.toml").read_text().split("\n[jit]", 1)[1]
KINDS = {"libmha_fwd": ("fmha_v3_fwd", "FmhaFwdKernel"), "libmha_bwd": ("fmha_v3_bwd", "FmhaBwd")}


def test_te_ckjit_manifest_defers_every_ck_kernel_and_prebuilds_one(aiter_root: Path, tmp_path: Path) -> None:
    assert 'modules = ["libmha_fwd", "libmha_bwd"]' in JIT and "[[jit.aot" not in JIT
    m = manifest(tmp_path / "te.toml", NS, ("gfx942",), bwd=True, extra=JIT)
    proc, out = build(tmp_path, aiter_root, m)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-6000:]
    mods = {r["name"]: r for r in json.loads((out / "manifest.json").read_text())["modules"]}
    deferred_total = 0
    for name, (kind, kernel) in KINDS.items():
        jit = mods[name]["jit"]
        ck = re.compile(r"fmha_(fwd|bwd)_.*_gfx9$")  # CK's instances (the *_api dispatch files end otherwise)
        assert [n for n in jit["aot"]["names"] if ck.match(n)] == [], jit["aot"]["names"]
        assert jit["deferred"]["count"] > 0 and all(ck.match(n) for n in jit["deferred"]["names"]), jit["deferred"]
        deferred_total += jit["deferred"]["count"]
        assert name.replace("lib", "") in jit["aot"]["names"]  # AITER's own mha_fwd / mha_bwd, ahead
        lib = out / "lib" / f"{NS}_{name}.so"
        # stubs only: no CK kernel's device code in the library ...
        assert not [k for ks in kernels_by_arch(lib).values() for k in ks if kernel in k]
        # ... and the asm v3 code objects in full, byte for byte
        found, _ = embedded_blobs(lib, embed.symbol_prefix(NS, name), embed.ALIGN)
        want = {b.key: Path(b.path) for b in embed.collect(aiter_root / "aiter_meta" / "hsa", ["gfx942"], [kind])}
        assert want and {k: found.get(k) for k in want} == {k: p.read_bytes() for k, p in want.items()}
    assert run_qola("audit", str(out)).returncode == 0

    cache = tmp_path / "cache"
    jit = ["jit", "--cache-dir", str(cache)]
    ls = run_qola(*jit, "ls", str(out))
    assert ls.returncode == 0 and f"0 of {deferred_total} units ready" in ls.stdout, ls.stdout + ls.stderr
    unit = mods["libmha_fwd"]["jit"]["deferred"]["names"][0]
    pre = run_qola(*jit, "prebuild", str(out), "--filter", unit)
    assert pre.returncode == 0 and "1 built, 0 already present, 0 failed" in pre.stdout, pre.stdout + pre.stderr[-4000:]
    assert run_qola(*jit, "verify").returncode == 0
    ls = run_qola(*jit, "ls", str(out))
    assert f"1 of {deferred_total} units ready" in ls.stdout and re.search(rf"{unit}\s+\w+\s+ready in ", ls.stdout), (
        ls.stdout
    )
    (entry,) = [p for p in cache.glob("*.so") if not p.name.startswith(".")]
    assert any("FmhaFwdKernel" in k for k in kernels_by_arch(entry)["gfx942"])  # compiled: the kernel is there
