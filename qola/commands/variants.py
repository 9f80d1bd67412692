"""``qola variants``: declared variants → generator filters → the instances they select."""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from qola.commands.common import add_manifest_args, prepare, warn
from qola.core.secret import shown
from qola.plan import variants as V
from qola.plan.manifest import Manifest
from qola.plan.model import Plan


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "variants",
        help="show the generator filters the manifest's variants give, and what they select",
        description="Resolve [[mha_fwd_variants]], [[mha_bwd_variants]] and [[variants]] into "
        "generator --filter patterns and count the instances each selects (from --list_blobs).",
    )
    add_manifest_args(p)
    p.add_argument("--json", action="store_true", help='print {"variants": [...], "totals": {...}} as JSON')
    p.set_defaults(func=run)


def report(plan: Plan, manifest: Manifest, env: Mapping[str, str]) -> dict[str, Any]:
    """The data ``qola variants`` prints: per selection its instances, per generator the totals."""
    res = V.resolve(plan, manifest, env)
    mods = {m.name: m for m in plan.modules}
    jobs = [
        (mods[s.module].generators[s.generator], res.filter(mods[s.module], s.generator, [s])) for s in res.selections
    ]
    gens = res.generators()
    jobs += [(mod.generators[i], res.filter(mod, i, sels)) for mod, i, sels in gens]
    with ThreadPoolExecutor(max_workers=2) as pool:
        genv = V.GeneratorEnv.of(env).for_plan(plan)  # the environment the generation gets
        found = list(pool.map(lambda j: [n for n in V.list_blobs(j[0], genv, j[1]) if not V.is_api(n)], jobs))
    rows = []
    for sel, names, (_, job_filter) in zip(res.selections, found, jobs, strict=False):
        gen = mods[sel.module].generators[sel.generator]
        rows.append(
            {
                "module": sel.module,
                "direction": gen.direction or gen.script,
                "source": sel.source,
                "options": dict(sel.options),
                "filter": job_filter,
                "instances": sorted(names),
            }
        )
    totals: dict[str, Any] = {}
    for (mod, i, sels), names in zip(gens, found[len(res.selections) :], strict=True):
        gen = mod.generators[i]
        full = [n for n in res.listings[(mod.name, i)] if not V.is_api(n)]
        totals.setdefault(mod.name, {})[gen.direction or gen.script] = {
            "command": gen.command,
            "filter": res.filter(mod, i, sels),
            "unfiltered": len(full),
            "selected": len(names),
            "reduction": round(len(full) / len(names), 1) if names else None,
        }
    return {"variants": rows, "totals": totals}


def run(args: argparse.Namespace) -> int:
    prepared = prepare(args)
    warn(prepared.plan.warnings)
    data = report(prepared.plan, prepared.manifest, dict(os.environ))
    if args.json:
        print(json.dumps(shown(data), indent=2, sort_keys=True))
        return 0
    if not data["variants"] and not data["totals"]:
        print(
            f"{args.manifest} declares no variants: each module's generators build every instance they list "
            "(declare [[mha_fwd_variants]] / [[mha_bwd_variants]] to narrow them: docs/manifest.md, Variants)"
        )
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title="declared variants → generator filters", show_lines=False)
    for col in ("module", "direction", "variant", "filter", "instances", "of"):
        table.add_column(col, overflow="fold", justify="right" if col in ("instances", "of") else "left")
    for row in data["variants"]:
        tot = data["totals"][row["module"]][row["direction"]]
        opts = ", ".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in row["options"].items())
        table.add_row(
            row["module"], row["direction"], opts, row["filter"], str(len(row["instances"])), str(tot["unfiltered"])
        )
    for mod, dirs in data["totals"].items():
        for direction, tot in dirs.items():
            table.add_row(
                mod,
                direction,
                "[bold]all declared[/bold]",
                tot["filter"],
                f"[bold]{tot['selected']}[/bold]",
                f"{tot['unfiltered']} ({tot['reduction']}x)",
            )
    Console().print(table)
    return 0
