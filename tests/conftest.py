from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"
KERNELS = EXAMPLES / "kernels"
sys.path.insert(0, str(Path(__file__).resolve().parent))


def _has_gpu() -> bool:
    if not shutil.which("nvidia-smi"):
        return False
    try:
        return subprocess.run(["nvidia-smi", "-L"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def _hipcc() -> str | None:
    path = shutil.which("hipcc") or ("/usr/bin/hipcc" if os.path.exists("/usr/bin/hipcc") else None)
    return path


def _rocm7() -> bool:
    """A hipcc whose HIP is 6.4 or newer (targets gfx942 and gfx950): the ROCm 7 environment."""
    hipcc = _hipcc()
    if hipcc is None:
        return False
    try:
        out = subprocess.run(
            [hipcc, "--version"], capture_output=True, text=True, timeout=60, env={**os.environ, "HIP_PLATFORM": "amd"}
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    from qola.toolchain.versions import hip_version_key, parse_hip_version

    parsed = parse_hip_version(out)
    return parsed is not None and hip_version_key(parsed[0]) >= (6, 4, 0, 0)


def pytest_collection_modifyitems(config, items):
    gpu = _has_gpu()
    hip = _hipcc() is not None
    rocm = any("rocm" in item.keywords for item in items) and _rocm7()
    no_aiter = os.environ.get("QOLA_TEST_NO_AITER") == "1"
    for item in items:
        if "gpu" in item.keywords and not gpu:
            item.add_marker(pytest.mark.skip(reason="needs a GPU (marker gpu)"))
        if "hip" in item.keywords and not hip:
            item.add_marker(pytest.mark.skip(reason="needs hipcc (apt-get install hipcc)"))
        if "rocm" in item.keywords and not rocm:
            item.add_marker(pytest.mark.skip(reason="needs ROCm 6.4+ hipcc (run: scripts/rocm7.sh run pytest -m rocm)"))
        if "aiter" in item.keywords and no_aiter:
            item.add_marker(pytest.mark.skip(reason="QOLA_TEST_NO_AITER=1"))


@pytest.fixture(scope="session")
def aiter_root() -> Path:
    """The real AITER tree from the amd-aiter sdist (cached across runs)."""
    from aiter_sdist import aiter_root as fetch

    return fetch()


@pytest.fixture(scope="session")
def kernels_root() -> Path:
    return KERNELS


def run_qola(*args: str, cwd: Path | None = None, env: dict | None = None, check: bool = False):
    """Run the CLI in a subprocess, as a user would."""
    full_env = dict(os.environ)
    if env:
        full_env.update(env)
    proc = subprocess.run([sys.executable, "-m", "qola", *args], capture_output=True, text=True, cwd=cwd, env=full_env)
    if check and proc.returncode != 0:
        raise AssertionError(f"qola {' '.join(args)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


def wait_for(cond, timeout: float = 60.0) -> bool:
    """Poll ``cond`` until it is true (True) or ``timeout`` seconds pass (False)."""
    import time

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.05)
    return False


def cmake_build(proj: Path, bld: Path, prefix: Path) -> None:
    """Configure ``proj`` with ``CMAKE_PREFIX_PATH=prefix`` into ``bld`` and build it (asserting both)."""
    cfg = subprocess.run(
        ["cmake", "-S", str(proj), "-B", str(bld), f"-DCMAKE_PREFIX_PATH={prefix}"], capture_output=True, text=True
    )
    assert cfg.returncode == 0, cfg.stdout + cfg.stderr
    made = subprocess.run(["cmake", "--build", str(bld)], capture_output=True, text=True)
    assert made.returncode == 0, made.stdout + made.stderr
