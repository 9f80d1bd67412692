"""Build benchmark: qola's one-graph build of the example tree vs module-by-module JIT builds.

Prints a markdown table: full build wall time, compile-phase core utilisation,
no-op rebuild time, and the same modules built one by one with
``torch.utils.cpp_extension.load`` (the pattern AITER's JIT follows).

    python bench/build.py [--arch sm_90] [-j N] [--skip-torch]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
KERNELS = REPO / "examples" / "kernels"
MODULES = (
    "module_rmsnorm",
    "module_softmax",
    "module_attn_fwd",
    "libattn_fwd",
    "module_asm",
)  # the whole example table


def child_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def qola(args: list[str]) -> tuple[float, float]:
    cpu0, t0 = child_cpu(), time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "qola", *args], capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"qola failed:\n{proc.stdout}\n{proc.stderr}")
    return wall, child_cpu() - cpu0


def compile_phase(build_dir: Path, jobs: int) -> tuple[float, float]:
    """(span of the compile edges in s, utilisation = busy edge-seconds / (span × jobs))."""
    rows = []
    for line in (build_dir / ".ninja_log").read_text().splitlines()[1:]:
        start, end, _, out, _ = line.split("\t")
        if out.endswith(".o"):
            rows.append((int(start) / 1000, int(end) / 1000))
    span = max(e for _, e in rows) - min(s for s, _ in rows)
    busy = sum(e - s for s, e in rows)
    return span, busy / (span * jobs)


def torch_one_by_one(build_dir: Path, arch: str, jobs: int, work: Path, manifest: Path) -> float:
    """Each module with torch.utils.cpp_extension.load, one after the other (sources incl. generated)."""
    work.mkdir(parents=True, exist_ok=True)
    plan = json.loads(
        subprocess.run(
            [sys.executable, "-m", "qola", "plan", "--manifest", str(manifest), "--aiter-root", str(KERNELS), "--json"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    script = work / "torch_load.py"
    script.write_text(f"""
import json, sys, time, os
from torch.utils import cpp_extension
mods = json.loads(open({str(work / "plan.json")!r}).read())
t0 = time.perf_counter()
for m in mods:
    cpp_extension.load(name=m["md_name"], sources=m["sources"], extra_include_paths=m["includes"],
                       extra_cuda_cflags=["-O3", "-gencode", "arch=compute_{arch[3:]},code={arch}"] + m["flags"],
                       build_directory=m["bdir"], verbose=False, is_python_module=False)
print(time.perf_counter() - t0)
""")
    mods = []
    for m in plan["modules"]:
        gen = build_dir / "gen" / m["name"] / "blob"
        srcs = list(m["sources"]) + sorted(str(p) for p in gen.glob("*.cu")) if gen.is_dir() else list(m["sources"])
        bdir = work / "torch" / m["name"]
        bdir.mkdir(parents=True, exist_ok=True)
        import pybind11

        mods.append(
            {
                "md_name": "t_" + m["name"],
                "sources": srcs,
                "bdir": str(bdir),
                "includes": [*list(m["include_dirs"]), str(gen), str(build_dir / "include"), pybind11.get_include()],
                "flags": list(m["flags_extra_hip"]),
            }
        )
    (work / "plan.json").write_text(json.dumps(mods))
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, str(script)], env={**os.environ, "MAX_JOBS": str(jobs)}, capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise SystemExit(f"torch cpp_extension build failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("-j", "--jobs", type=int, default=os.cpu_count())
    ap.add_argument("--skip-torch", action="store_true")
    ap.add_argument("--repeat", type=int, default=3, help="full builds per side (fresh dirs); medians reported")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="qola-bench-"))
    manifest = work / "bench.toml"
    manifest.write_text(
        f'[qola]\nnamespace = "bench"\n[build]\narchitectures = ["{args.arch}"]\n'
        + "".join(
            f'[[modules]]\nname = "{m}"\n' + ('mode = "cpp_itfs"\n' if m.startswith("lib") else "") for m in MODULES
        )
    )

    def full_build(i: int) -> tuple[float, float, Path, list[str]]:
        o, b = work / f"out{i}", work / f"build{i}"
        cmd = [
            "build",
            "--manifest",
            str(manifest),
            "--aiter-root",
            str(KERNELS),
            "-o",
            str(o),
            "--build-dir",
            str(b),
            "-j",
            str(args.jobs),
        ]
        wall, cpu = qola(cmd)
        return wall, cpu, b, cmd

    # warm-up into a scratch dir (page cache, compiler start-up), so neither side pays for a cold machine
    full_build(99)
    runs = [full_build(i) for i in range(args.repeat)]
    walls = sorted(r[0] for r in runs)
    full_wall = statistics.median(walls)
    full_wall_run = min(runs, key=lambda r: abs(r[0] - full_wall))
    _, full_cpu, bdir, common = full_wall_run
    _span, util = compile_phase(bdir, args.jobs)
    noop_wall = min(qola(common)[0] for _ in range(3))
    t0 = time.perf_counter()
    subprocess.run(["ninja", "-C", str(bdir)], capture_output=True)
    ninja_noop = time.perf_counter() - t0
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import qola.commands.build"], check=True)
    import_s = time.perf_counter() - t0
    rows = [
        ("modules", str(len(MODULES))),
        ("objects compiled", str(sum(1 for _ in (bdir / "obj").rglob("*.o")))),
        (
            f"qola full build, wall (median of {args.repeat}; min–max)",
            f"{full_wall:.1f} s ({walls[0]:.1f}–{walls[-1]:.1f})",
        ),
        ("qola full build, CPU time of children", f"{full_cpu:.1f} s"),
        ("compile-phase core utilisation (edge-seconds / (span × jobs))", f"{util * 100:.0f} %"),
        ("whole-build core utilisation (CPU / (wall × jobs))", f"{full_cpu / (full_wall * args.jobs) * 100:.0f} %"),
        ("qola no-op rebuild, wall (best of 3, whole CLI process)", f"{noop_wall:.2f} s"),
        ("  of which: Python start-up + imports", f"{import_s:.2f} s"),
        ("  of which: ninja's own no-op", f"{ninja_noop:.3f} s"),
    ]
    if not args.skip_torch:
        twalls = sorted(
            torch_one_by_one(bdir, args.arch, args.jobs, work / f"t{i}", manifest) for i in range(args.repeat)
        )
        torch_wall = statistics.median(twalls)
        rows += [
            (
                f"module by module, torch.utils.cpp_extension.load (median of {args.repeat}; min–max)",
                f"{torch_wall:.1f} s ({twalls[0]:.1f}–{twalls[-1]:.1f})",
            ),
            ("speed-up (module by module / qola)", f"{torch_wall / full_wall:.2f}×"),
        ]
    slow = sorted(
        ((int(ln.split("\t")[1]) - int(ln.split("\t")[0])) / 1000, ln.split("\t")[3])
        for ln in (bdir / ".ninja_log").read_text().splitlines()[1:]
        if ln.count("\t") >= 4
    )[-6:]
    print("slowest edges:", *(f"{t:.1f}s {o}" for t, o in reversed(slow)), sep="\n  ")
    print(f"\n| build benchmark ({args.arch}, -j {args.jobs}, {os.cpu_count()} cores) | value |\n|---|---|")
    for k, v in rows:
        print(f"| {k} | {v} |")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
