"""Prebuilt outputs: what installing by build key costs next to building.

On the bundled example tree (``--modules``, default two pybind modules, ``--arch`` sm_90), in a temp
dir: a cold ``qola build`` (-j N), ``qola plan --key``, ``qola package``, then ``qola build
--prebuilt`` into a fresh output dir from the store as a directory and over HTTP (a loopback
``http.server``), and ``qola audit --reproduce`` of the first output. Prints one table (seconds,
wall, one run each).

    python bench/prebuilt.py [--modules module_softmax,module_rmsnorm] [--arch sm_90] [-j 2] [--keep DIR]
"""

from __future__ import annotations

import argparse
import functools
import http.server
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
KERNELS = REPO / "examples" / "kernels"


class Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


def qola(*args: str) -> float:
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "qola", *args], capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"qola {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}")
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--modules", default="module_softmax,module_rmsnorm")
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("-j", "--jobs", default="2")
    ap.add_argument("--keep", help="work here instead of a temp dir (kept)")
    args = ap.parse_args()
    work = Path(args.keep or tempfile.mkdtemp(prefix="qola-bench-prebuilt-"))
    work.mkdir(parents=True, exist_ok=True)
    m = work / "q.toml"
    m.write_text(
        f'[qola]\nnamespace = "qk"\n[build]\narchitectures = ["{args.arch}"]\n'
        + "".join(f'[[modules]]\nname = "{n}"\n' for n in args.modules.split(","))
    )
    common = ["--manifest", str(m), "--aiter-root", str(KERNELS)]
    store = work / "store"
    rows = [
        ("cold build", qola("build", *common, "-o", str(work / "o1"), "-j", args.jobs)),
        ("qola plan --key", qola("plan", *common, "--key")),
        ("qola package", qola("package", str(work / "o1"), "--into", str(store))),
    ]
    archive = next(store.glob("*.tar.gz"))
    rows.append(
        ("--prebuilt DIR (fresh output dir)", qola("build", *common, "-o", str(work / "o2"), "--prebuilt", str(store)))
    )
    handler = functools.partial(Quiet, directory=str(store))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    rows.append(("--prebuilt URL (loopback HTTP)", qola("build", *common, "-o", str(work / "o3"), "--prebuilt", url)))
    server.shutdown()
    rows.append(("qola audit --reproduce", qola("audit", str(work / "o1"), "--reproduce", "-j", args.jobs)))
    print(f"\nmodules {args.modules} ({args.arch}), archive {archive.name}: {archive.stat().st_size / 1e6:.2f} MB")
    print("| step | wall (s) |\n|---|---:|")
    for name, secs in rows:
        print(f"| {name} | {secs:.2f} |")


if __name__ == "__main__":
    main()
