"""CUDA units without device code, compiled host-only: each unit qola's graph compiles host-only
(rule ``cc_host``: the entry sources, qola's wrappers) compiled twice from its own line, once as
the graph compiles it (the host compiler, ``-x c++``) and once with nvcc's device passes (``-x
cu``, as every unit was compiled before), each ``--repeat`` times; the CPU is the children's user +
system, the median kept.

    python bench/hostonly.py [--manifest examples/quickstart.toml] [--tree examples/kernels] [--repeat 3]

Prints a markdown table: unit, host-only CPU, device-pass CPU, their ratio.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from qola.compile.passes import host_and_device

REPO = Path(__file__).resolve().parent.parent


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _timed(command: str, cwd: Path) -> float:
    before = _cpu()
    subprocess.run(command, shell=True, cwd=cwd, check=True, capture_output=True)
    return _cpu() - before


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--manifest", type=Path, default=REPO / "examples" / "quickstart.toml")
    ap.add_argument("--tree", type=Path, default=REPO / "examples" / "kernels")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="qola-bench-hostonly-") as tmp:
        out = Path(tmp) / "out"
        argv = [sys.executable, "-m", "qola", "build", "-m", str(args.manifest), "-a", str(args.tree)]
        subprocess.run([*argv, "-o", str(out), "--dry-run", "--quiet"], check=True, capture_output=True)
        build = Path(f"{out}.build")
        ninja = os.path.join(__import__("ninja").BIN_DIR, "ninja")
        graph = (build / "build.ninja").read_text()
        objs = re.findall(r"^build (\S+): cc_host ", graph, re.M)
        rows = []
        for obj in objs:
            command = subprocess.run(
                [ninja, "-C", str(build), "-t", "commands", "-s", obj], capture_output=True, text=True, check=True
            ).stdout.strip()
            lines = host_and_device(command)
            if lines is None:
                raise SystemExit(f"not a host-only edge's command: {command[:300]}")
            (build / obj).parent.mkdir(parents=True, exist_ok=True)
            host = statistics.median(_timed(lines[0], build) for _ in range(args.repeat))
            device = statistics.median(_timed(lines[1], build) for _ in range(args.repeat))
            unit = command.split(" -c ")[1].split()[0]
            rows.append((Path(unit).name, host, device))
    print(f"\n{args.manifest.name} on {args.tree.name}: units compiled host-only, median of {args.repeat}\n")
    print("| unit | host-only CPU | with nvcc's device passes | ratio |")
    print("|---|---:|---:|---:|")
    for name, host, device in rows:
        print(f"| {name} | {host:.1f} s | {device:.1f} s | {host / device:.2f} |")
    total_h, total_d = sum(r[1] for r in rows), sum(r[2] for r in rows)
    print(f"| **all {len(rows)}** | {total_h:.1f} s | {total_d:.1f} s | {total_h / total_d:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
