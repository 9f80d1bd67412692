"""ROCm/ck-jit's call form (``ck_jit_build.py full --with-qola``), replayed on the example tree for
gfx90a: ``sys.executable -m qola.cli build --manifest M --aiter-root A --output-dir O --arch "<archs>"
--skip-checkout`` run with ``cwd=<qola checkout>`` and no PYTHONPATH, ``ROCM_PATH`` pointing at a fake
ROCm whose ``bin/hipcc`` records every call and runs the real one (ck-jit's interceptor; every other
entry a link to the real ROCm's, as ck-jit makes it). qola must take that hipcc, not PATH's."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support.cmake_clients import MANIFEST, mirror_tree, plain_checkout, sh
from support.common import KERNELS

pytestmark = [pytest.mark.hip, pytest.mark.slow]


def fake_rocm(where: Path, log: Path) -> Path:
    """ck-jit's fake ROCm home: bin/hipcc records its argv into ``log`` and runs the real hipcc."""
    real_hipcc = Path(os.path.realpath(shutil.which("hipcc")))
    real = real_hipcc.parent.parent  # /opt/rocm, or /usr for a distribution's hipcc
    fake = where / "rocm"
    (fake / "bin").mkdir(parents=True)
    hipcc = fake / "bin" / "hipcc"
    hipcc.write_text(f'#!/bin/sh\nprintf "%s\\n" "$*" >> "{log}"\nexec "{real_hipcc}" "$@"\n')
    hipcc.chmod(0o755)
    for entry in real.iterdir():
        if entry.name == "bin":
            for tool in entry.iterdir():
                if tool.name != "hipcc" and not (fake / "bin" / tool.name).exists():
                    (fake / "bin" / tool.name).symlink_to(tool)
        elif not (fake / entry.name).exists():
            (fake / entry.name).symlink_to(entry)
    return fake


def test_ckjit_call_form_uses_the_interceptor(tmp_path):
    mirror = mirror_tree(KERNELS, tmp_path)
    tree = tmp_path / "aiter"
    sh("git", "clone", "-q", mirror.bare, tree)  # ck-jit's caller checks the tree out before
    m = tmp_path / "qola_manifest.toml"
    m.write_text(MANIFEST.format(commit=mirror.commit).replace('"sm_90"', '"gfx90a"'))
    qola_dir = plain_checkout(tmp_path)
    log = tmp_path / "hipcc-calls.log"
    rocm = fake_rocm(tmp_path, log)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "HIPCC", "ROCM_HOME", "HIP_PATH")}
    env.update(ROCM_PATH=str(rocm), HIP_PLATFORM="amd")
    out = tmp_path / "jit" / "qola"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "qola.cli",
            "build",
            "--manifest",
            str(m),
            "--aiter-root",
            str(tree),
            "--output-dir",
            str(out),
            "--arch",
            "gfx90a",
            "--skip-checkout",
            "-j",
            "2",
        ],
        cwd=qola_dir,
        env=env,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads((out / "manifest.json").read_text())
    assert data["toolchain"]["kind"] == "hip" and data["archs"] == ["gfx90a"]
    assert [x["status"] for x in data["modules"]] == ["built"]
    calls = log.read_text().splitlines()
    compiles = [c for c in calls if " -c " in f" {c} " and "--offload-arch=gfx90a" in c]
    assert any("attn_fwd_d64_fp32_batch" in c for c in compiles), calls  # the generated instance
    assert any("attn_fwd_api" in c for c in compiles), calls  # the dispatch file
    assert str(rocm / "bin" / "hipcc") in json.dumps(data["toolchain"])  # recorded as the compiler used
