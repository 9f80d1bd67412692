from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from support.common import KERNELS
from support.once import made_once, run_base

if TYPE_CHECKING:
    from support.te_cmake import TeBuild

sys.path.insert(0, str(Path(__file__).resolve().parent))
pytest_plugins = ["support.cpu_report"]  # each test's CPU, the heaviest listed at the end


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


def _long_files_first(items: list[pytest.Item]) -> None:
    """Files with a test that needs the sdist (CK's listings: minutes), then those with a ``slow`` one,
    then the rest, each group in collection order: pytest-xdist hands files out in this order
    (``--dist loadfile``), so the run ends on short files instead of one worker's long tail. Every
    worker orders alike (it is computed from the items alone)."""
    rank: dict[str, int] = {}
    for item in items:
        file = item.nodeid.split("::", 1)[0]
        here = 0 if "aiter" in item.keywords else 1 if "slow" in item.keywords else 2
        rank[file] = min(rank.get(file, 2), here)
    order = {id(item): i for i, item in enumerate(items)}
    items.sort(key=lambda item: (rank[item.nodeid.split("::", 1)[0]], order[id(item)]))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _long_files_first(items)
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


@pytest.fixture(scope="session", autouse=True)
def compile_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path | None]:
    """One compile cache for the whole run, every worker's (qola's own, QOLA_CACHE_DIR): a unit the
    suite compiled once is taken from it by every later build, wherever its tree and build dir lie.
    Tests of the cache itself, and those that must see a compile, name a dir of their own or
    ``--no-cache``. A QOLA_CACHE_DIR the caller set is kept."""
    if os.environ.get("QOLA_CACHE_DIR"):
        yield None
        return
    path = run_base(tmp_path_factory) / "qola-compile-cache"
    path.mkdir(mode=0o700, exist_ok=True)
    os.environ["QOLA_CACHE_DIR"] = str(path)  # the test processes and every qola they start
    try:
        yield path
    finally:
        os.environ.pop("QOLA_CACHE_DIR", None)


@pytest.fixture(scope="session")
def aiter_root() -> Path:
    """The real AITER tree from the amd-aiter sdist (cached across runs)."""
    from support.aiter_sdist import aiter_root as fetch

    return fetch()


CK_FMHA = "aiter_meta/3rdparty/composable_kernel/example/ck_tile/01_fmha"  # CK's fMHA example in the sdist


@pytest.fixture(scope="session")
def ck_fmha_600(aiter_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every CK fMHA fwd and bwd instance of the sdist as its generate.py writes them for receipt 600
    (``fwd/``, ``bwd/``: thousands of files, half a minute of generating), written once per run, by
    whichever pytest-xdist worker asks first (tests/support/once.py), for the tests that read them
    (tests/jit/test_jit_stubs.py, tests/store/test_usage_ahead.py). Read-only (mode 0444): a test that
    would change a file copies it."""
    gen = aiter_root / CK_FMHA / "generate.py"

    def generate(out: Path) -> None:
        procs = [
            subprocess.Popen(
                [sys.executable, str(gen), "-d", d, "--receipt", "600", "-o", str(out / d)], stdout=subprocess.DEVNULL
            )
            for d in ("fwd", "bwd")
        ]
        assert all(p.wait() == 0 for p in procs)
        for f in out.rglob("*"):
            if f.is_file():
                f.chmod(0o444)

    return made_once(tmp_path_factory, "ck_fmha_600", generate)


@pytest.fixture(scope="session")
def kernels_root() -> Path:
    return KERNELS


@pytest.fixture(scope="session")
def te_build(aiter_root: Path, tmp_path_factory: pytest.TempPathFactory) -> TeBuild:
    """Transformer Engine's manifest narrowed to one forward and one backward kernel family
    (tests/support/rocm_aiter.py), built for real for gfx942 and gfx950 once a session, as TE's CMake
    builds it (tests/support/te_cmake.py): read by the ROCm tests that need real CK objects. Tests only
    read it (one that hides the build dir for a while puts it back; qola_add_modules() on it compiles
    nothing)."""
    from support.te_cmake import te_build as build

    return build(aiter_root, tmp_path_factory.mktemp("te"))


@pytest.fixture(scope="session")
def te(te_build: TeBuild) -> Path:
    """The ``te_build``'s output dir (its build dir beside it: OUT.build)."""
    return te_build.out
