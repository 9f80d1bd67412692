"""One model's usage set against the full Transformer Engine manifest: compile units and CPU-hours.

Nothing is compiled. ``qola plan --json`` lists every CK file the TE manifest generates (both archs);
a model's usage set is chosen from those names as its records would name them, written as usage
records, merged with ``qola usage merge`` and planned again with ``--usage`` (the same commands a
user runs); the units of both plans are classed as bench/farm.py classes them and priced with its
measured CPU seconds per unit (docs/benchmarks.md). The set: bf16, head size 128, batch mode,
causal and no mask, with and without dropout, forward and backward, every padding/tile kernel of
those (what the CK dispatch may pick for varying sequence lengths: an upper bound for one model).

    python bench/usage.py --aiter-root SDIST [--manifest examples/te-manifest.toml]
                          [--arch "gfx942;gfx950"] [--fragment OUT.toml]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from farm import TE  # noqa: E402

from qola.store.usage import records  # noqa: E402

SECONDS = {label: secs for label, _, secs in TE["units"]}
FIXED = [u for u in TE["units"] if u[0].startswith("AITER")]  # AITER's own sources and generators: always built


def qola(*args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, "-m", "qola", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(HERE.parent)},
    )
    if proc.returncode != 0:
        raise SystemExit(f"qola {' '.join(args)} failed:\n{proc.stderr}")
    return proc


def files(plan_json: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for m in json.loads(plan_json)["modules"]:
        for g in m["generators"]:
            if g.get("files") and not g["dispatch_only"]:
                out.setdefault(m["name"], []).extend(n for n in g["files"] if not n.endswith("_api"))
    return out


def dispatch_seconds(kernels: int, small: tuple[int, float], large: tuple[int, float]) -> float:
    """CPU seconds of a CK dispatch file over ``kernels`` files: the line through two measured ones."""
    slope = (large[1] - small[1]) / (large[0] - small[0])
    return max(1.0, small[1] + slope * (kernels - small[0]))


# measured dispatch compiles (docs/benchmarks.md; user CPU, hipcc, both archs): (CK files, seconds)
FWD_DISPATCH = ((28, 9.4), (416, 15.3))
BWD_DISPATCH = ((130, 13.1), (2088, 130.0))


def classes(f: dict[str, list[str]]) -> list[tuple[str, int, float]]:
    """bench/farm.py's unit classes; a dispatch file priced by its kernel count (between the two
    measured sizes of each, docs/benchmarks.md)."""
    fwd = len(f.get("libmha_fwd", []))
    bwd = f.get("libmha_bwd", [])
    pre = sum(1 for n in bwd if n.startswith(("fmha_bwd_dot_do_o_", "fmha_bwd_convert_dq_")))
    main = len(bwd) - pre
    units = [
        ("fwd instances", fwd, SECONDS["fwd instances"]),
        ("bwd dq_dk_dv instances", main, SECONDS["bwd dq_dk_dv instances"]),
        ("bwd pre/post (convert_dq, dot_do_o)", pre, SECONDS["bwd pre/post (convert_dq, dot_do_o)"]),
        ("fmha_fwd_api.cpp", 1, dispatch_seconds(fwd, *FWD_DISPATCH)),
        ("fmha_bwd_api.cpp", 1, dispatch_seconds(len(bwd), *BWD_DISPATCH)),
        *FIXED,
    ]
    return units


def used(name: str) -> bool:
    return "_d128_bf16_" in name and "_batch_" in name


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--aiter-root", required=True)
    ap.add_argument("--manifest", default=str(HERE.parent / "examples" / "te-manifest.toml"))
    ap.add_argument("--arch", default="gfx942;gfx950")
    ap.add_argument("--fragment", help="also write the merged usage fragment here")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        m = Path(tmp) / "te.toml"  # this sdist's table lists no srcs for libmha_fwd: drop_srcs has nothing to drop
        m.write_text(
            "".join(ln for ln in Path(args.manifest).read_text().splitlines(True) if not ln.startswith("drop_srcs"))
        )
        base = ["-m", str(m), "-a", args.aiter_root, "--allow-unpinned", "--arch", args.arch]
        full = files(qola("plan", "--json", *base).stdout)
        pick = {mod: [n for n in names if used(n)] for mod, names in full.items()}
        rec = Path(tmp) / "rec" / f"qola-usage-bench-1-0{records.fmt.USAGE_SUFFIX}"
        rec.parent.mkdir()
        rec.write_text(
            "".join(
                records.render(records.Record("compile", mod, f"te_{mod}", n, args.arch, "", "b", 1, 0))
                for mod, names in pick.items()
                for n in names
            )
        )
        frag = Path(tmp) / "usage.toml"
        qola("usage", "merge", str(rec.parent), *base, "-o", str(frag))
        got = files(qola("plan", "--json", *base, "--usage", str(frag)).stdout)
        if args.fragment:
            Path(args.fragment).write_text(frag.read_text())
    assert {k: sorted(v) for k, v in got.items()} == {k: sorted(v) for k, v in pick.items()}, "plan != records"
    print(f"| build ({args.arch}) | CK fwd | CK bwd dq_dk_dv | CK bwd pre/post | all units | CPU-h |")
    print("|---|---:|---:|---:|---:|---:|")
    for label, f in (("full TE manifest", full), ("usage set (bf16, d128, batch, mask/nmask, dropout/ndropout)", got)):
        u = classes(f)
        cpu = sum(n * s for _, n, s in u)
        print(f"| {label} | {u[0][1]:,} | {u[1][1]:,} | {u[2][1]:,} | {sum(n for _, n, _ in u):,} | {cpu / 3600:.1f} |")


if __name__ == "__main__":
    main()
