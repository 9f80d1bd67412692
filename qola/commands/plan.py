"""``qola plan``: print what would be built, module by module."""

from __future__ import annotations

import argparse
import json

from qola.commands.common import add_manifest_args, plan_spec, warn
from qola.pipeline import plan as whole_plan


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plan", help="resolve the manifest against the tree and print the build plan",
                       description="Resolve the manifest against the kernel tree and print the plan.")
    add_manifest_args(p)
    p.add_argument("--json", action="store_true",
                   help='print the plan as JSON: {"modules": [...]} with generator filters and the JIT split')
    p.add_argument("--key", action="store_true",
                   help="probe the toolchain and print the build key (what --prebuilt looks up); with --json, "
                   "every input of the key and each part's digest (to see why two keys differ)")
    p.add_argument("--no-isolation", action="store_true", help="the key of a build run with --no-isolation")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.key:
        from dataclasses import replace  # noqa: PLC0415

        from qola.pipeline import build_key  # noqa: PLC0415

        key = build_key(replace(plan_spec(args), isolate=not args.no_isolation))
        print(json.dumps(key.explain(), indent=2, sort_keys=True) if args.json else key.key)
        return 0
    plan = whole_plan(plan_spec(args)).plan
    warn(plan.warnings)
    if args.json:
        print(json.dumps(plan.to_json(), indent=2, sort_keys=True))
        return 0
    print(f"namespace {plan.namespace}  archs {', '.join(plan.archs)}  tree {plan.tree_root}"
          f"  commit {plan.tree_commit or '(not a git checkout)'}")
    for m in plan.modules:
        print(f"\n{m.name} -> {m.md_name}  [{m.mode}, {'python module' if m.is_python_module else m.link}]")
        print(f"  sources     {len(m.sources)}")
        for s in m.sources:
            print(f"    {s}")
        for g in m.generators:
            print(f"  generator   {g.command}")
            if g.filter is not None:
                print(f"    filter    {g.filter}" + (f"  (through {g.wrapper})" if g.wrapper else ""))
        if m.jit is not None:
            print(f"  jit         {len(m.jit.ahead)} instance(s) ahead, every other generated one deferred"
                  f" (stubs: {m.jit.style})")
        if m.flags_extra_hip:
            print(f"  hip flags   {' '.join(m.flags_extra_hip)}")
        if m.flags_extra_cc:
            print(f"  cc flags    {' '.join(m.flags_extra_cc)}")
        print(f"  includes    {len(m.include_dirs)}")
    return 0
