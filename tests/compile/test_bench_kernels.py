"""bench/_kernels.py: each kernel's machine code (its ``.text`` bytes) hashed per arch and compared across two
builds, on synthetic maps and on two real HIP libraries that differ in one kernel's body."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from types import ModuleType

import pytest
import support.bench as bench_support


def load() -> ModuleType:
    return bench_support.load("_kernels")


def test_compare_text_counts_the_kernels_with_the_same_code_per_arch() -> None:
    k = load()
    ours = {"gfx942": {"a": ["h1"], "b": ["h2"], "c": ["h3", "h4"]}, "gfx950": {"a": ["h5"]}}
    theirs = {"gfx942": {"a": ["h1"], "b": ["hX"], "c": ["h4", "h3"], "d": ["h6"]}, "gfx950": {"a": ["h5"]}}
    rows = k.compare_text("libmha_fwd", ours, theirs)
    assert [(r.arch, r.identical, r.total, r.differ) for r in rows] == [
        ("gfx942", 2, 4, ("b", "d")),  # b: other code; d: one side only; c: the same two objects' code
        ("gfx950", 1, 1, ()),
    ]
    assert rows[0].text() == "kernels .text identical: 2 of 4; differ: b, d" and not rows[0].same
    assert rows[1].text() == "kernels .text identical: 1 of 1" and rows[1].same
    only_ours = k.compare_text("m", {"gfx90a": {"a": ["h"]}}, {})
    assert [(r.arch, r.identical, r.total) for r in only_ours] == [("gfx90a", 0, 1)]


def test_a_library_without_device_code_or_missing_has_no_kernels(tmp_path: Path) -> None:
    k = load()
    assert k.library_text(tmp_path / "missing.so") == {}
    assert k.kernel_text(b"not an ELF") == {}


KERNELS = """#include <hip/hip_runtime.h>
__global__ void k_same(float* x) { x[threadIdx.x] *= 2.0f; }
__global__ void k_other(float* x) { x[threadIdx.x] += ADD; }
"""


@pytest.mark.hip
def test_two_libraries_differing_in_one_kernel_body_differ_in_that_kernel_only(tmp_path: Path) -> None:
    k = load()
    hipcc = shutil.which("hipcc") or "/usr/bin/hipcc"
    (tmp_path / "k.hip").write_text(KERNELS)
    libs = {}
    for name, add in (("one", "1.0f"), ("two", "3.0f"), ("again", "1.0f")):
        libs[name] = tmp_path / f"{name}.so"
        cmd = [hipcc, "--offload-arch=gfx90a", "-fPIC", "-shared", "-O1", f"-DADD={add}", str(tmp_path / "k.hip")]
        done = subprocess.run([*cmd, "-o", str(libs[name])], capture_output=True, text=True,
                              env={**os.environ, "HIP_PLATFORM": "amd"})  # fmt: skip
        assert done.returncode == 0, done.stderr
    text = k.library_text(libs["one"])
    assert set(text) == {"gfx90a"} and set(text["gfx90a"]) == {"_Z6k_samePf", "_Z7k_otherPf"}
    assert all(len(h) == 1 and len(h[0]) == 64 for h in text["gfx90a"].values())
    assert text["gfx90a"]["_Z6k_samePf"] != text["gfx90a"]["_Z7k_otherPf"]
    (row,) = k.text_rows({"m": (libs["one"], libs["two"])})
    assert (row.library, row.arch, row.identical, row.total, row.differ) == ("m", "gfx90a", 1, 2, ("_Z7k_otherPf",))
    (same,) = k.text_rows({"m": (libs["one"], libs["again"])})
    assert same.same and same.text() == "kernels .text identical: 2 of 2"
