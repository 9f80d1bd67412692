"""Compile each thing once: the example built, then built again from another directory (the tree
copied elsewhere, new output and build dirs), through qola's compile cache and through sccache as a
``--launcher`` (each with a cache of its own, empty at the start: qola's compile cache and its
listings of the tree's generators).

Prints a markdown table: wall, CPU (the children's user + system), units compiled, and whether the
second build's libraries are byte-identical to the first's.

    python bench/cache.py [--arch sm_90] [-j N] [--work-dir DIR] [--manifest M] [--tree T] [--slice A|B|tiny]

A slice of TE's manifest on the amd-aiter sdist (bench/_slices.py; ``B``: gfx942 + gfx950) runs inside
the ROCm 7 environment: ``scripts/rocm7.sh run python bench/cache.py --slice B --skip-sccache``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _slices import SLICES, child_cpu, slice_manifest

REPO = Path(__file__).resolve().parent.parent


def _build(where: Path, manifest: Path, tree: Path, arch: str, jobs: int, env: dict[str, str], *extra: str) -> dict:
    """One build of a fresh copy of ``tree`` under ``where``; wall, CPU, what it compiled."""
    copy = where / "tree"
    shutil.copytree(tree, copy, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
    out = where / "out"
    argv = [sys.executable, "-m", "qola", "build", "-m", str(manifest), "-a", str(copy), "-o", str(out)]
    argv += ["--arch", arch, "-j", str(jobs), "--quiet", *extra]
    cpu0, t0 = child_cpu(), time.perf_counter()
    proc = subprocess.run(argv, env=env, capture_output=True, text=True)
    wall, cpu = time.perf_counter() - t0, child_cpu() - cpu0
    if proc.returncode != 0:
        raise SystemExit(f"build failed ({' '.join(argv)}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    tally = Path(str(out) + ".build") / "cache" / "tally"
    lines = tally.read_text().splitlines() if tally.exists() else []
    return {
        "wall": wall,
        "cpu": cpu,
        "compiled": sum(1 for ln in lines if not ln.startswith("hit")) if lines else None,
        "taken": sum(1 for ln in lines if ln.startswith("hit")) if lines else None,
        "libs": {p.name: p.read_bytes() for p in sorted((out / "lib").glob("*")) if p.is_file()},
    }


def _sccache_hits(env: dict[str, str]) -> tuple[int, int]:
    """(cache hits, cache misses) of sccache's server since its stats were zeroed."""
    proc = subprocess.run(
        ["sccache", "--show-stats", "--stats-format", "json"], env=env, capture_output=True, text=True
    )
    stats = json.loads(proc.stdout).get("stats", {})
    hits = sum((stats.get("cache_hits") or {}).get("counts", {}).values())
    misses = sum((stats.get("cache_misses") or {}).get("counts", {}).values())
    return int(hits), int(misses)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--manifest", type=Path, default=REPO / "examples" / "quickstart.toml")
    ap.add_argument("--tree", type=Path, default=REPO / "examples" / "kernels")
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("-j", type=int, default=2)
    ap.add_argument("--work-dir", type=Path, help="keep the builds here (default: a temp dir, removed)")
    ap.add_argument("--skip-sccache", action="store_true")
    ap.add_argument("--slice", choices=sorted(SLICES), help="a slice of TE's manifest on the amd-aiter sdist")
    args = ap.parse_args()
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="qola-bench-cache-"))
    work.mkdir(parents=True, exist_ok=True)
    if args.slice:  # TE's manifest shape narrowed (bench/_slices.py), the sdist the tests fetch
        args.manifest = slice_manifest(work / f"slice-{args.slice}.toml", args.slice)  # tests/ now on the path
        from support.aiter_sdist import aiter_root

        args.tree, args.arch = Path(aiter_root()), ";".join(SLICES[args.slice])
    base = {k: v for k, v in os.environ.items() if k not in ("QOLA_CACHE_DIR", "QOLA_NO_CACHE")}
    rows = []
    # qola's caches of its own, empty at the start: compiles (QOLA_CACHE_DIR) and generator listings (XDG)
    qenv = {**base, "QOLA_CACHE_DIR": str(work / "qola-cache"), "XDG_CACHE_HOME": str(work / "xdg")}
    first = _build(work / "qola-1", args.manifest, args.tree, args.arch, args.j, qenv)
    second = _build(work / "elsewhere" / "qola-2", args.manifest, args.tree, args.arch, args.j, qenv)
    rows.append(("qola's compile cache", first, second, f"{second['taken']} of {second['taken'] + second['compiled']}"))
    if not args.skip_sccache and shutil.which("sccache"):
        senv = {**base, "SCCACHE_DIR": str(work / "sccache"), "SCCACHE_SERVER_PORT": "4227"}
        subprocess.run(["sccache", "--stop-server"], env=senv, capture_output=True)
        subprocess.run(["sccache", "--start-server"], env=senv, capture_output=True, check=True)
        try:
            s1 = _build(work / "scc-1", args.manifest, args.tree, args.arch, args.j, senv, "--launcher", "sccache")
            subprocess.run(["sccache", "--zero-stats"], env=senv, capture_output=True)
            s2 = _build(
                work / "elsewhere" / "scc-2", args.manifest, args.tree, args.arch, args.j, senv, "--launcher", "sccache"
            )
            hits, misses = _sccache_hits(senv)
        finally:
            subprocess.run(["sccache", "--stop-server"], env=senv, capture_output=True)
        rows.append(
            ("sccache as --launcher (its server compiles: CPU not a child's)", s1, s2, f"{hits} of {hits + misses}")
        )
    print(f"\n{args.manifest.name} on {args.tree.name}, --arch {args.arch}, -j {args.j}\n")
    print(
        "| how | first build wall / CPU | second build, elsewhere: wall / CPU | taken from the cache | libraries identical |"
    )
    print("|---|---:|---:|---:|---|")
    for name, a, b, taken in rows:
        same = [n for n in a["libs"] if a["libs"][n] == b["libs"].get(n)]
        print(
            f"| {name} | {a['wall']:.1f} s / {a['cpu']:.1f} s | {b['wall']:.1f} s / {b['cpu']:.1f} s "
            f"({100 * b['cpu'] / a['cpu']:.0f} % of the first's CPU) | {taken} | {len(same)} of {len(a['libs'])} |"
        )
    if not args.work_dir:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
