"""The ROCm 7 environment (scripts/rocm7.sh) works for a tool that builds a fake ROCm home from the
real one, as ROCm/ck-jit does (every entry of ``<rocm>`` linked, ``bin/hipcc`` replaced) and then
compiles with ``ROCM_PATH`` at the fake and ``-isystem <rocm>/include`` (ck-jit's runtime compile).
Debian's ROCm root is ``/usr``: its device libraries live in clang's resource dir, and
``-isystem /usr/include`` puts libc's headers before libstdc++'s (``#include_next <math.h>`` fails).
The environment gives a ROCm-layout root at /opt/rocm and names the device libraries."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.rocm

SOURCE = "#include <hip/hip_runtime.h>\n#include <cmath>\n__global__ void k(float* x) { x[0] = sinf(x[0]); }\n"


def fake_rocm(real: Path, where: Path) -> Path:
    fake = where / "rocm"
    (fake / "bin").mkdir(parents=True)
    for entry in real.iterdir():
        if entry.name == "bin":
            for tool in entry.iterdir():
                if tool.name != "hipcc":
                    (fake / "bin" / tool.name).symlink_to(tool)
        else:
            (fake / entry.name).symlink_to(entry)
    (fake / "bin" / "hipcc").symlink_to(real / "bin" / "hipcc")  # ck-jit's interceptor runs the real one
    return fake


def test_a_fake_rocm_home_built_from_the_environments_rocm_compiles(tmp_path: Path) -> None:
    real = Path("/opt/rocm")
    assert (real / "bin" / "hipcc").exists() and (real / "include" / "hip").is_dir()
    assert not (real / "include" / "math.h").exists()  # ROCm's headers alone, not libc's
    fake = fake_rocm(real, tmp_path)
    src = tmp_path / "k.hip"
    src.write_text(SOURCE)
    env = {**os.environ, "ROCM_PATH": str(fake), "ROCM_HOME": "", "HIP_PLATFORM": "amd"}
    cc = subprocess.run(
        [
            str(real / "bin" / "hipcc"),
            "--offload-arch=gfx942",
            "--offload-arch=gfx950",
            f"-isystem{real / 'include'}",
            "-std=c++20",
            "-fPIC",
            "-c",
            str(src),
            "-o",
            str(tmp_path / "k.o"),
        ],
        capture_output=True,
        text=True,
        env=env,
    )
    assert cc.returncode == 0, cc.stderr[-3000:]
    link = subprocess.run(
        [
            str(real / "bin" / "hipcc"),
            "-shared",
            str(tmp_path / "k.o"),
            f"-L{real / 'lib'}",
            "-lamdhip64",
            "-o",
            str(tmp_path / "libk.so"),
        ],
        capture_output=True,
        text=True,
        env=env,
    )
    assert link.returncode == 0, link.stderr[-3000:]


def test_the_tools_ck_jit_runs_are_there(tmp_path: Path) -> None:
    """ck-jit's `full` build applies its codegen-hint patch with `patch -p1 --forward` (a dry run
    first) before anything else: without the tool it stops with a traceback."""
    old = tmp_path / "a" / "f.py"
    old.parent.mkdir()
    old.write_text("x = 1\n")
    diff = "--- a/f.py\n+++ b/f.py\n@@ -1 +1,2 @@\n x = 1\n+y = 2\n"
    for extra in (["--dry-run"], []):
        done = subprocess.run(
            ["patch", "-p1", "--forward", *extra], cwd=old.parent, input=diff, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stdout + done.stderr
    assert old.read_text() == "x = 1\ny = 2\n"
