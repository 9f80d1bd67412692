"""Plan time against the size of the tree's ``aiter/jit/core.py`` (issue 23).

A copy of the example tree (examples/kernels) gets N lines ``X_i = os.getenv('…', 'v<i>')`` appended
to its core.py (the names qola reads statically for the module table), and one table flag uses the
last of them. Columns: N, core.py size, ``qola plan --json`` wall seconds and peak RSS (of the
child, from ``resource.getrusage``), and the ratio of wall time to the previous row's (linear: about
the ratio of N; quadratic: its square).

    python bench/tree.py [--sizes 10000,40000,150000] [--qola-src SRC] [--timeout 600]

``--qola-src``: the directory holding the ``qola`` package to measure (first on PYTHONPATH; default:
this checkout). Standard library only (plus qola, in the child processes).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
KERNELS = REPO / "examples" / "kernels"
CORE = "aiter/jit/core.py"
TABLE = "aiter/jit/optCompilerConfig.json"
MANIFEST = '[qola]\nnamespace = "qk"\n[build]\narchitectures = ["sm_90"]\n[[modules]]\nname = "module_rmsnorm"\n'


def make_tree(dest: Path, n: int) -> int:
    shutil.copytree(KERNELS, dest, ignore=shutil.ignore_patterns("__pycache__", "*.co"))
    core = dest / CORE
    with core.open("a") as fh:
        fh.writelines(f"X_{i} = os.getenv('QB{i}', 'v{i}')\n" for i in range(n))
    table = json.loads((dest / TABLE).read_text())
    table["module_rmsnorm"]["flags_extra_cc"] = [f"f'-DLAST={{X_{n - 1}}}'"]
    (dest / TABLE).write_text(json.dumps(table))
    return core.stat().st_size


def plan(tree: Path, manifest: Path, src: Path, timeout: int) -> tuple[float | None, int]:
    env = {**os.environ, "PYTHONPATH": str(src)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    start = time.perf_counter()
    try:
        out = subprocess.run(
            [sys.executable, "-m", "qola", "plan", "-m", str(manifest), "-a", str(tree), "--json"],
            capture_output=True,
            text=True,
            env=env,
            timeout=timeout,
            check=False,
            cwd=tree.parent,
        )  # not this checkout: ``-m`` puts the cwd before PYTHONPATH
    except subprocess.TimeoutExpired:
        return None, 0
    wall = time.perf_counter() - start
    if out.returncode != 0 or "-DLAST=v" not in out.stdout:
        sys.exit(f"qola plan failed:\n{out.stderr[-2000:]}")
    return wall, max(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, before)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="10000,40000,150000")
    ap.add_argument("--qola-src", type=Path, default=REPO)
    ap.add_argument("--timeout", type=int, default=600)
    args = ap.parse_args()
    print(f"{'N':>8} {'core.py':>10} {'plan s':>8} {'RSS MiB':>8} {'x prev':>7}")
    prev = None
    with tempfile.TemporaryDirectory(prefix="qola-bench-tree-") as tmp:
        manifest = Path(tmp) / "m.toml"
        manifest.write_text(MANIFEST)
        for n in map(int, args.sizes.split(",")):
            tree = Path(tmp) / f"tree-{n}"
            size = make_tree(tree, n)
            wall, rss = plan(tree, manifest, args.qola_src.resolve(), args.timeout)
            shown = f"{wall:8.1f}" if wall is not None else f">{args.timeout:7d}"
            ratio = f"{wall / prev:7.1f}" if wall is not None and prev else "      -"
            print(f"{n:8d} {size / 2**20:9.1f}M {shown} {rss / 1024:8.0f} {ratio}", flush=True)
            prev = wall
            shutil.rmtree(tree)


if __name__ == "__main__":
    main()
