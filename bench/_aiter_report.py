"""bench/vs_aiter.py's results, as tables: the pairs' CPU and wall, the kernels of every pair compared by
name and by machine code (``bench/_kernels.py``). Reads only what a run left in its work dir
(``results.json`` and the libraries it names), so ``vs_aiter.py --report-only`` re-renders a run."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

from _kernels import text_rows

SIDES = ("qola", "aiter")

HEAD = (
    "| slice | pair | order | load (1 min) qola; AITER, before→after | units qola / AITER "
    "| CPU s qola / AITER compile+link (+ generators, flag checks) | CPU ratio to AITER's compile+link "
    "| CPU ratio to all of AITER | wall s qola / all of AITER | wall ratio (all) |\n"
    "|---|---|---|---|---:|---:|---:|---:|---:|---:|"
)


def compare(qk: dict[str, Any], ak: dict[str, Any]) -> tuple[bool, dict[str, int], str]:
    """(same kernel names per module and arch, kernels per arch over the modules, what differs)."""
    diff, per_arch = [], dict[str, int]()
    for mod in sorted(set(qk) | set(ak)):
        for arch in sorted(set(qk.get(mod, {})) | set(ak.get(mod, {}))):
            q, a = set(qk.get(mod, {}).get(arch, ())), set(ak.get(mod, {}).get(arch, ()))
            per_arch[arch] = per_arch.get(arch, 0) + len(q)
            if q != a:
                diff.append(f"{mod} {arch}: qola-only {len(q - a)}, AITER-only {len(a - q)}")
    return not diff, per_arch, "; ".join(diff)


def pair_checks(modules: tuple[str, ...], runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """For every pair: kernel names per module and arch, library sizes, and each kernel's ``.text``."""
    from qola.output.kernels import device_code_objects

    checks = []
    for pair in sorted({r["pair"] for r in runs}):
        q, a = (next(r for r in runs if r["pair"] == pair and r["side"] == s) for s in SIDES)
        ql, al = ({m: Path(p) for m, p in r["libs"].items()} for r in (q, a))
        qk, ak = ({m: device_code_objects(p) for m, p in libs.items()} for libs in (ql, al))
        same, per_arch, diff = compare(qk, ak)
        sizes = {m: (ql[m].stat().st_size, al[m].stat().st_size) for m in modules}
        text = [asdict(t) for t in text_rows({m: (ql[m], al[m]) for m in modules})]
        checks.append({"pair": pair, "same": same, "per_arch": per_arch, "diff": diff, "sizes": sizes,
                       "kernels": {"qola": qk, "aiter": ak}, "text": text})  # fmt: skip
    return checks


def pair_rows(name: str, archs: tuple[str, ...], runs: list[dict[str, Any]]) -> str:
    """One row per pair (in its run order) and the mean of the pair ratios."""
    rows, ratios = [], []
    for pair in sorted({r["pair"] for r in runs}):
        mine = [r for r in runs if r["pair"] == pair]
        q, a = (next(r for r in mine if r["side"] == s) for s in SIDES)
        order = ", ".join("qola" if r["side"] == "qola" else "AITER" for r in mine)
        ratio = (q["cpu"] / a["cpu"], q["cpu"] / a["all_cpu"], q["wall"] / a["all_wall"])
        ratios.append((q["cpu"], a["cpu"], a["gen_cpu"], *ratio, q["wall"], a["all_wall"]))
        load = "; ".join(f"{r['load'][0]:.1f}→{r['load'][1]:.1f}" for r in (q, a))
        rows.append(
            f"| {name} | {pair} | {order} | {load} | {len(q['units'])} / {len(a['units'])} "
            f"| {q['cpu']:.0f} / {a['cpu']:.0f} (+ {a['gen_cpu']:.0f}) | {ratio[0]:.2f}× | {ratio[1]:.2f}× "
            f"| {q['wall']:.0f} / {a['all_wall']:.0f} | {ratio[2]:.2f}× |"
        )
    n = len(ratios)
    qc, ac, ag, r0, r1, r2, qw, aw = (sum(col) / n for col in zip(*ratios))  # the means, column by column
    rows.append(
        f"| {name} | mean of {n} ({'+'.join(archs)}) | | | | {qc:.0f} / {ac:.0f} (+ {ag:.0f}) | **{r0:.2f}×** "
        f"| **{r1:.2f}×** | {qw:.0f} / {aw:.0f} | {r2:.2f}× |"
    )
    return "\n".join(rows)


def text_table(results: list[dict[str, Any]]) -> str:
    """Per slice, library and arch: the kernels whose ``.text`` is identical on both sides, every pair."""
    out = ["| slice | library | arch | kernels .text identical, qola / AITER | differ |", "|---|---|---|---|---|"]
    for r in results:
        by_key: dict[tuple[str, str], list[tuple[int, Mapping[str, Any]]]] = {}
        for c in r["checks"]:
            for t in c.get("text", ()):
                by_key.setdefault((t["library"], t["arch"]), []).append((c["pair"], t))
        for (lib, arch), ts in sorted(by_key.items()):
            counts = {f"{t['identical']} of {t['total']}" for _, t in ts}
            pairs = ", ".join(str(p) for p, _ in ts)
            said = f"{counts.pop()} (pairs {pairs})" if len(counts) == 1 else "; ".join(
                f"pair {p}: {t['identical']} of {t['total']}" for p, t in ts)  # fmt: skip
            differ = "; ".join(f"pair {p}: {', '.join(t['differ'][:3])}" for p, t in ts if t["differ"])
            out.append(f"| {r['slice']} | {lib} | {arch} | {said} | {differ} |")
    return "\n".join(out)


def table(results: list[dict[str, Any]]) -> str:
    out = [HEAD] + [pair_rows(r["slice"], tuple(r["archs"]), r["runs"]) for r in results]
    for r in results:
        last = r["checks"][-1]
        same = all(c["same"] for c in r["checks"])
        kern = ", ".join(f"{arch}: {n}" for arch, n in last["per_arch"].items())
        differ = " / ".join(f"pair {c['pair']}: {c['diff']}" for c in r["checks"] if not c["same"])
        kern += "; same names on both sides in every pair" if same else f"; **DIFFER**: {differ}"
        sizes = "; ".join(f"{m} {q:,} / {a:,}" for m, (q, a) in last["sizes"].items())
        out.append(
            f"\nSlice {r['slice']}: cold `qola plan` {r['plan']['cpu']:.0f} s CPU ({r['plan']['wall']:.0f} s wall; "
            f"part of each qola run). HIP kernels per arch: {kern}. .so bytes qola / AITER: {sizes}."
        )
    if any(c.get("text") for r in results for c in r["checks"]):
        out += ["", "Kernel machine code (each kernel's `.text` bytes, per library and arch):", "", text_table(results)]
    return "\n".join(out)


def report(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The results of a run with every pair's checks redone from the libraries it kept."""
    out = []
    for r in results:
        modules = tuple(next(iter(r["runs"]))["libs"])
        out.append({**r, "checks": pair_checks(modules, r["runs"])})
    return out
