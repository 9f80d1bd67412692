"""Helpers shared by test files (first written in test_refused_before_work.py)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from support.common import KERNELS

FAKE_NVCC = r"""#!/bin/sh
# fake nvcc for qola's tests ({tag}): answers the toolchain probes, compiles plain C++ with g++
for a in "$@"; do
  case "$a" in
    --version) printf 'nvcc: NVIDIA (R) Cuda compiler driver\nCuda compilation tools, release {release}, V{release}.88\nBuild {tag}\n'; exit 0 ;;
    --list-gpu-code) echo sm_90; exit 0 ;;
    --dryrun) printf '#$ TOP=/usr/local/cuda\n#$ _TARGET_DIR_=targets/x86_64-linux\n'; exit 0 ;;
  esac
done
out= dep= src= mt=
while [ $# -gt 0 ]; do
  case "$1" in -o) out=$2; shift ;; -MF) dep=$2; shift ;; -MT) mt=$2; shift ;; -c) src=$2; shift ;; esac
  shift
done
if [ -n "$FAKE_NVCC_SLEEP" ]; then sleep "$FAKE_NVCC_SLEEP"; fi
# nvcc's -MD without -MF: the depfile is -o's path with its suffix replaced by .d
[ -n "$dep" ] || dep=${out%.*}.d
exec g++ -x c++ -fPIC -fvisibility=hidden -c "$src" -o "$out" -MD -MF "$dep" -MT "${mt:-$out}"
"""


TINY = 'extern "C" __attribute__((visibility("default"))) int tiny_answer() { return %d; }\n'


pytestmark = pytest.mark.skipif(
    not shutil.which("g++")
    or (
        not os.path.exists("/usr/local/cuda/lib64/libcudart_static.a")
        and not Path("/usr/local/cuda/targets/x86_64-linux/lib/libcudart_static.a").exists()
    ),
    reason="needs g++ and a CUDA toolkit's libcudart_static.a (the fake nvcc links it)",
)


def fake_nvcc(path: Path, tag: str = "fake-1", release: str = "13.0") -> Path:
    path.write_text(FAKE_NVCC.replace("{tag}", tag).replace("{release}", release))
    path.chmod(0o755)
    return path


def make_tree(root: Path, answer: int = 42) -> Path:
    shutil.copytree(KERNELS, root, ignore=shutil.ignore_patterns("hsa", "__pycache__"))
    (root / "csrc" / "tiny").mkdir()
    (root / "csrc" / "tiny" / "tiny.cu").write_text(TINY % answer)
    return root
