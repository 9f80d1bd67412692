"""Scale on paper: wall time of a build on 1, 8 and 64 build servers, from measured compile times.

Nothing is compiled here. The translation units of a build are grouped in classes (how many, CPU
seconds each); every number below was measured and is cited in docs/benchmarks.md ("Real AITER on
a ROCm 7 compiler" and "Beyond one machine"). ninja's work is then list-scheduled, longest first
(qola gives ninja each object's expected time as its priority), onto ``servers x cores`` slots:

    wall = serial before (plan + generators, on the client)
         + max(compile makespan, client preprocessing / client cores, upload / bandwidth)
         + serial after (link, audit, publish)

The client rows matter for a farm: sccache preprocesses every compile on the client and uploads
the preprocessed source (a CK instance: 1.0 s CPU, 21 MB, measured). The longest single unit (a
2.9 MB dispatch file, a big kernel) bounds the makespan however many servers there are.

    python bench/farm.py [--servers 1,8,64] [--cores 16] [--client-cores 16] [--gbit 10]

With REAPI (``qola build --remote``, docs/distributed.md) HIP is distributed too, and the inputs go
to the service's content-addressed store once: a CK instance's headers are uploaded by the first
action that reads them, each later action sends its own small source, so the upload term is the
per-action overhead measured on loopback, not the preprocessed bytes; the client's share is the
dependency scan (``hipcc -M``, at most the ``-E`` cost above):

    python bench/farm.py --reapi [--servers 8,64,256] [--overhead S]   # S: measured, see --measure
    scripts/rocm7.sh run python bench/farm.py --measure                # BuildGrid + a buildbox worker on loopback
"""

from __future__ import annotations

import argparse
import heapq
import json
from typing import Any

# (label, count, CPU seconds each); measured on the 2-core box with clang 21, AITER's flags without
# -amdgpu-early-inline-all (docs/benchmarks.md): contended wall times are halved to CPU where the
# table says the run was shared (~50 % of a core)
TE: dict[str, Any] = {
    "name": "Transformer Engine manifest (gfx942+gfx950)",
    "units": [
        # CK's files split by kind as `qola plan --json` lists them (bench/usage.py, issue 25): of CK's 2,088
        # bwd files 240 are its pre/post kernels (22 s, not 75 s as counted before: 48 -> 45 CPU-h)
        ("bwd dq_dk_dv instances", 1848, 75.0),  # d32: 108/115 s wall at ~1.5x contention
        ("fwd instances", 416, 36.0),  # d32: 52/54 s wall at ~1.5x contention
        ("bwd pre/post (convert_dq, dot_do_o)", 240, 22.0),  # 19-38 s wall
        ("AITER bwd pre/post (fmha_bwd_pre_post_kernel_generate.py)", 96, 22.0),
        ("fmha_bwd_api.cpp (dispatch of 2,088 kernels, 2.9 MB)", 1, 130.0),  # 152 s wall, 130 s user
        ("fmha_fwd_api.cpp (dispatch, 0.4 MB)", 1, 15.0),  # 16.8 s wall
        ("AITER API + qola wrappers + asm v3", 8, 30.0),  # 17-39 s wall
    ],
    "before": 41.0,  # qola build --dry-run of the TE manifest: plan + both generators, 41 s wall
    "after": 5.0,  # two links + audit + publish (0.1-0.2 s per link of 2 kernels; assumed 5 s for 2,600)
}
# One model's usage set (issue 25; bench/usage.py: `qola usage merge` of its records, then `qola plan
# --usage`): bf16, head size 128, batch mode, causal and no mask, with and without dropout, fwd + bwd,
# every padding/tile kernel of those, both archs. Unit counts from the plan; seconds as above; its two
# dispatch files measured (docs/benchmarks.md); AITER's own sources and generators unchanged.
USAGE = {
    "name": "one model's usage set of the TE manifest (gfx942+gfx950)",
    "units": [
        ("bwd dq_dk_dv instances", 114, 75.0),
        ("fwd instances", 28, 36.0),
        ("bwd pre/post (convert_dq, dot_do_o)", 16, 22.0),
        ("AITER bwd pre/post (fmha_bwd_pre_post_kernel_generate.py)", 96, 22.0),  # not CK's: unchanged
        ("fmha_bwd_api.cpp (dispatch of 130 kernels, 0.23 MB)", 1, 13.1),  # measured: 13.1 s user
        ("fmha_fwd_api.cpp (dispatch of 28 kernels)", 1, 9.4),  # measured: 9.4 s user
        ("AITER API + qola wrappers + asm v3", 8, 30.0),
    ],
    "before": 16.8,  # qola build --dry-run --usage: plan, the [usage] check, generators (measured, 16.3 s user)
    "after": 2.0,
}
AITER: dict[str, Any] = {
    "name": "AITER's whole table, CK fMHA files (gfx942+gfx950)",
    "units": [
        ("CK fMHA instances", 64334, 60.0),  # --list_blobs count; ~60 s each (d32: 35-75 s)
        ("plain sources (177) and dispatch files", 200, 40.0),
        ("largest dispatch file", 1, 900.0),  # assumed: ~30x the TE bwd dispatch's kernels
    ],
    "before": 600.0,  # assumed: ~40 generators writing ~65k files at TE's rate (~10 ms a file)
    "after": 60.0,
}
PREPROCESS_CPU = 1.0  # s per unit on the client (hipcc -E of a CK bwd instance, both archs)
PREPROCESSED_MB = 21.0  # MB uploaded per unit (its preprocessed source, before compression)


def makespan(units: list[tuple[str, int, float]], slots: int) -> tuple[float, float]:
    """(longest-first list schedule's end, the longest unit) of ``units`` on ``slots`` slots."""
    heap = [0.0] * min(slots, sum(n for _, n, _ in units))
    heapq.heapify(heap)
    longest = 0.0
    for _, count, secs in sorted(units, key=lambda u: -u[2]):
        longest = max(longest, secs)
        for _ in range(count):
            heapq.heappush(heap, heapq.heappop(heap) + secs)
    return max(heap), longest


def hours(s: float) -> str:
    return f"{s / 3600:.1f} h" if s >= 3600 else f"{s / 60:.1f} min"


# seconds added to each action on loopback (client upload + queue + worker fetch/upload + download),
# measured by --measure (docs/benchmarks.md, "Remote execution (REAPI)")
REAPI_OVERHEAD = 1.24
DEPS_SCAN_CPU = PREPROCESS_CPU  # hipcc -M of a CK instance: bounded by hipcc -E's 1.0 s


def reapi(args: argparse.Namespace, servers: list[int]) -> None:
    """TE and AITER re-projected with every compile (HIP included) an REAPI action."""
    for build in (TE, USAGE, AITER):
        units = [(label, n, secs + args.overhead) for label, n, secs in build["units"]]
        total = sum(n for _, n, _ in units)
        print(f"\n{build['name']} over REAPI: {total:,} actions, +{args.overhead:.2f} s overhead each")
        print("| workers | cores | compile makespan | client dependency scan | wall | bound by |")
        print("|---:|---:|---:|---:|---:|---|")
        scan = total * DEPS_SCAN_CPU / args.client_cores
        for n in servers:
            span, longest = makespan(units, n * args.cores)
            middle = max(span, scan)
            wall = build["before"] + middle + build["after"]
            bound = (
                "client dependency scan"
                if middle == scan
                else "the longest unit"
                if span <= longest * 1.05
                else "compiles"
            )
            print(f"| {n} | {n * args.cores:,} | {hours(span)} | {hours(scan)} | {hours(wall)} | {bound} |")


def measure() -> None:
    """Loopback: BuildGrid + one buildbox worker (tests/support/remote_stack.py), the example tree's HIP
    modules built remotely twice (a cold client, then a clean second one: all cached); per action:
    the client's dependency scan, the trexe call, and the service's durations."""
    import os
    import shutil
    import statistics
    import sys
    import tempfile
    import time
    from pathlib import Path

    repo = Path(__file__).resolve().parent.parent
    sys.path[:0] = [str(repo), str(repo / "tests")]
    from support import remote_stack

    from qola.pipeline import run as pipeline
    from qola.store import remote
    from qola.toolchain import find_toolchain

    arch = "gfx942"
    with tempfile.TemporaryDirectory(prefix="qola-farm-") as tmp_:
        tmp = Path(tmp_)
        m = tmp / "q.toml"
        m.write_text(
            f'[qola]\nnamespace = "qk"\n[build]\narchitectures = ["{arch}"]\n\n'
            '[[modules]]\nname = "module_softmax"\n\n[[modules]]\nname = "libattn_fwd"\nmode = "cpp_itfs"\n'
            'blob_gen_cmd = ["csrc/attn/generate.py -d fwd --filter attn_fwd_*_fp16_batch* --output_dir {}"]\n'
        )
        env = dict(os.environ)
        tc = find_toolchain([arch], env=env, accepted_versions=None, cache_dir=tmp / "probe")
        with remote_stack.running(tmp / "svc") as svc:
            svc.worker("w1", remote.toolchain_id(tc, env), jobs=2)
            rows = []
            for client in ("cold", "second"):
                tree = tmp / client / "kernels"
                shutil.copytree(
                    repo / "examples" / "kernels", tree, ignore=shutil.ignore_patterns("hsa", "__pycache__")
                )
                t = time.monotonic()
                rep = pipeline.build(
                    pipeline.BuildSpec.make(
                        manifest=str(m),
                        aiter_root=str(tree),
                        output_dir=str(tmp / f"o-{client}"),
                        build_dir=str(tmp / f"b-{client}"),
                        jobs=2,
                        remote=svc.url,
                    )
                )
                wall = time.monotonic() - t
                assert rep.ok, [r.detail for r in rep.modules if r.status != "built"]
                lines = (tmp / f"b-{client}" / "remote" / "tally").read_text().splitlines()
                recs = [(ln.split(" ", 2)[0], json.loads(ln.split(" ", 2)[2])) for ln in lines]
                rows.append((client, wall, recs))
        print(f"service start-up {svc.startup:.1f} s; {tc.kind} {tc.version}, {arch}")
        print(
            "| client | actions | where | build wall | dependency scan | trexe call | queue | worker fetch | "
            "compile | worker upload | overhead (trexe - compile) |"
        )
        print("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        for client, wall, recs in rows:

            def med(k: str, recs: list = recs) -> str:
                vals = [r[k] for _, r in recs if r.get(k) is not None]
                return f"{statistics.median(vals):.3f} s" if vals else "-"

            where = ", ".join(f"{w} {sum(1 for x, _ in recs if x == w)}" for w in sorted({x for x, _ in recs}))
            over = [r["trexe"] - (r.get("exec") or 0) for w, r in recs if w == "remote"]
            print(
                f"| {client} | {len(recs)} | {where} | {wall:.1f} s | {med('deps')} | {med('trexe')} | "
                f"{med('queue') if client == 'cold' else '-'} | {med('fetch') if client == 'cold' else '-'} | "
                f"{med('exec') if client == 'cold' else '-'} | {med('upload') if client == 'cold' else '-'} | "
                f"{f'{statistics.median(over):.3f} s' if over else '-'} |"
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--servers", default=None, help="build servers / workers (default 1,8,64; --reapi: 8,64,256)")
    ap.add_argument("--reapi", action="store_true", help="project remote execution: HIP distributed, CAS uploads")
    ap.add_argument("--overhead", type=float, default=REAPI_OVERHEAD, help="seconds added to each action (--reapi)")
    ap.add_argument("--measure", action="store_true", help="measure the per-action overhead on a loopback service")
    ap.add_argument("--cores", type=int, default=16, help="cores per build server")
    ap.add_argument("--client-cores", type=int, default=16)
    ap.add_argument("--gbit", type=float, default=10.0, help="client upload bandwidth, Gbit/s")
    args = ap.parse_args()
    if args.measure:
        measure()
        return
    servers = [int(s) for s in (args.servers or ("8,64,256" if args.reapi else "1,8,64")).split(",")]
    if args.reapi:
        reapi(args, servers)
        return
    for build in (TE, USAGE, AITER):
        units = build["units"]
        total = sum(n for _, n, _ in units)
        cpu = sum(n * s for _, n, s in units)
        print(
            f"\n{build['name']}: {total:,} units, {cpu / 3600:,.0f} CPU-h; serial {build['before']:.0f} s before, "
            f"{build['after']:.0f} s after"
        )
        print("| servers | cores | compile makespan | client preprocess | upload | wall | bound by |")
        print("|---:|---:|---:|---:|---:|---:|---|")
        pre = total * PREPROCESS_CPU / args.client_cores
        upload = total * PREPROCESSED_MB * 8 / 1000 / args.gbit
        for n in servers:
            span, longest = makespan(units, n * args.cores)
            local = n == 1  # one machine: no farm, nothing preprocessed apart or uploaded
            middle = span if local else max(span, pre, upload)
            wall = build["before"] + middle + build["after"]
            bound = (
                "compiles"
                if middle == span and span > longest * 1.05
                else "the longest unit"
                if middle == span
                else "client preprocessing"
                if middle == pre
                else "upload"
            )
            print(
                f"| {n} | {n * args.cores} | {hours(span)} | {'-' if local else hours(pre)} | "
                f"{'-' if local else hours(upload)} | {hours(wall)} | {bound} |"
            )


if __name__ == "__main__":
    main()
