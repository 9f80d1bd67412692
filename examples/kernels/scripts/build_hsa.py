#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Build the example tree's code objects from csrc/hsa_src/*.cu.

    build_hsa.py --arch sm_90 [--arch gfx90a ...] [--output DIR] [--force] [-v]

For each arch and kernel type this writes::

    <output>/<arch>/<kernel_type>/<name>.co     one code object per variant
    <output>/<arch>/<kernel_type>/<kernel_type>.csv

sm_* arches are compiled with ``nvcc -cubin -arch=<arch>``, gfx* arches with
``hipcc --genco --offload-arch=<arch> --no-gpu-bundle-output`` (HIP_PLATFORM=amd is set for that child
only). Kernels are ``extern "C"`` so ``knl_name`` in the CSV is the symbol to load.

Idempotent and make-like: a code object is rebuilt only when it is missing or
older than its source, a header in csrc/include, or this script (which holds the
flags); outputs are written through a temp file and renamed. ``--force`` rebuilds
everything. Stale .co files of the kernel types below are removed.
Standard library only.
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

TREE = Path(__file__).resolve().parent.parent  # examples/kernels
SRC_DIR = TREE / "csrc" / "hsa_src"
INCLUDE_DIR = TREE / "csrc" / "include"

C_TYPES = {"fp32": "float", "fp16": "qk_fp16_t", "bf16": "qk_bf16_t"}

# kernel_type -> (source, CSV columns before knl_name/co_name, variants)
KERNEL_TYPES: dict[str, tuple[str, tuple[str, ...], list[dict[str, object]]]] = {
    "vec_add": (
        "vec_add.cu",
        ("dtype",),
        [{"dtype": "fp32"}, {"dtype": "fp16"}, {"dtype": "bf16"}],
    ),
    "vec_scale": (
        "vec_scale.cu",
        ("dtype", "vec"),
        [{"dtype": "fp32", "vec": 1}, {"dtype": "fp32", "vec": 4}],
    ),
}

ARCH_RE = re.compile(r"^(sm_\d+[a-z]?|gfx[0-9a-f]+)$")


@dataclass(frozen=True)
class Variant:
    kernel_type: str
    source: Path
    params: tuple[tuple[str, object], ...]

    @property
    def name(self) -> str:
        p = dict(self.params)
        vec = int(p.get("vec", 1))
        return f"{self.kernel_type}_{p['dtype']}" + (f"x{vec}" if vec > 1 else "")

    def defines(self) -> list[str]:
        p = dict(self.params)
        out = [f"-DQK_KERNEL_NAME={self.name}", f"-DQK_DTYPE={C_TYPES[str(p['dtype'])]}"]
        if "vec" in p:
            out.append(f"-DQK_VEC={p['vec']}")
        return out


class BuildError(Exception):
    pass


def variants() -> list[Variant]:
    return [
        Variant(kt, SRC_DIR / src, tuple((c, v[c]) for c in cols))
        for kt, (src, cols, vs) in KERNEL_TYPES.items()
        for v in vs
    ]


def find_compiler(arch: str, nvcc: str | None, hipcc: str | None) -> str:
    if arch.startswith("sm_"):
        cands = [nvcc, os.environ.get("NVCC"), shutil.which("nvcc")]
        home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
        if home:
            cands.append(os.path.join(home, "bin", "nvcc"))
        cands.append("/usr/local/cuda/bin/nvcc")
        what = "nvcc (give --nvcc, or put it on PATH / set CUDA_HOME)"
    else:
        cands = [hipcc, os.environ.get("HIPCC"), shutil.which("hipcc")]
        rocm = os.environ.get("ROCM_PATH") or os.environ.get("ROCM_HOME")
        if rocm:
            cands.append(os.path.join(rocm, "bin", "hipcc"))
        cands.append("/opt/rocm/bin/hipcc")
        what = "hipcc (give --hipcc, or put it on PATH / set ROCM_PATH)"
    for c in cands:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    raise BuildError(f"no compiler for {arch}: need {what}")


def command(compiler: str, arch: str, v: Variant, out: Path) -> tuple[list[str], dict[str, str] | None]:
    common = ["-std=c++17", "-O3", f"-I{INCLUDE_DIR}", *v.defines()]
    if arch.startswith("sm_"):
        return [compiler, "-cubin", f"-arch={arch}", *common, "-o", str(out), str(v.source)], None
    env = dict(os.environ, HIP_PLATFORM="amd")
    # --no-gpu-bundle-output: a plain AMDGPU ELF (hsaco) like AITER's .co files,
    # not a clang offload bundle.
    cmd = [compiler, "--genco", f"--offload-arch={arch}", "--no-gpu-bundle-output", *common]
    return [*cmd, "-o", str(out), str(v.source)], env


def newest_input(v: Variant) -> float:
    files = [v.source, Path(__file__).resolve(), *INCLUDE_DIR.glob("*.h")]
    return max(f.stat().st_mtime for f in files)


def update_file(path: Path, text: str) -> None:
    if path.exists() and path.read_text() == text:
        return
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def build_one(compiler: str, arch: str, v: Variant, out: Path, force: bool, verbose: bool) -> bool:
    if not force and out.exists() and out.stat().st_mtime >= newest_input(v):
        return False
    tmp = out.with_name(f".{out.name}.tmp{os.getpid()}")
    cmd, env = command(compiler, arch, v, tmp)
    if verbose:
        print(" ".join(cmd), flush=True)
    try:
        proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if proc.returncode != 0 or not tmp.is_file():
            body = "\n".join("    " + line for line in proc.stdout.rstrip().splitlines())
            raise BuildError(
                f"compiling {v.name} for {arch} failed (rc={proc.returncode})\n"
                f"  command: {' '.join(cmd)}\n  output:\n{body}"
            )
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            tmp.unlink()
    return True


def csv_text(kernel_type: str, vs: list[Variant]) -> str:
    cols = list(KERNEL_TYPES[kernel_type][1])
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow([*cols, "knl_name", "co_name"])
    for v in vs:
        p = dict(v.params)
        w.writerow([*(p[c] for c in cols), v.name, f"{v.name}.co"])
    return buf.getvalue()


def build(archs: list[str], output: Path, nvcc: str | None, hipcc: str | None, force: bool, verbose: bool) -> list[Path]:
    built = []
    all_vs = variants()
    for arch in archs:
        compiler = find_compiler(arch, nvcc, hipcc)
        for kt in KERNEL_TYPES:
            vs = [v for v in all_vs if v.kernel_type == kt]
            d = output / arch / kt
            d.mkdir(parents=True, exist_ok=True)
            wanted = {f"{v.name}.co" for v in vs}
            for stale in d.glob("*.co"):
                if stale.name not in wanted:
                    stale.unlink()
            for v in vs:
                out = d / f"{v.name}.co"
                if build_one(compiler, arch, v, out, force, verbose):
                    built.append(out)
                    print(f"built {out}", flush=True)
            update_file(d / f"{kt}.csv", csv_text(kt, vs))
    return built


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="build_hsa.py", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--arch",
        action="append",
        required=True,
        help="target: sm_XX (nvcc) or gfxXXX (hipcc); repeat or separate by ','",
    )
    p.add_argument("--output", default=str(TREE / "hsa"), help="output root (default: <tree>/hsa)")
    p.add_argument("--nvcc", help="nvcc to use")
    p.add_argument("--hipcc", help="hipcc to use")
    p.add_argument("--force", action="store_true", help="rebuild even when up to date")
    p.add_argument("-v", "--verbose", action="store_true", help="print compile commands")
    args = p.parse_args(argv)

    archs = [a.strip() for item in args.arch for a in item.split(",") if a.strip()]
    bad = [a for a in archs if not ARCH_RE.match(a)]
    if bad:
        p.error(f"unknown arch {', '.join(bad)}: expected sm_XX or gfxXXX")
    try:
        build(archs, Path(args.output), args.nvcc, args.hipcc, args.force, args.verbose)
    except BuildError as e:
        print(f"build_hsa.py: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
