"""``qola plan``: print what would be built, module by module."""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from qola.commands.common import add_manifest_args, spec_of, warn
from qola.core.errors import QolaError
from qola.core.secret import shown
from qola.pipeline.run import build_key
from qola.pipeline.run import plan as whole_plan
from qola.plan import genrules
from qola.plan.model import ModulePlan, Plan
from qola.plan.variants import GeneratorEnv, list_blobs


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "plan",
        help="resolve the manifest against the tree and print the build plan",
        description="Resolve the manifest against the kernel tree and print the plan.",
    )
    add_manifest_args(p)
    p.add_argument(
        "--json",
        action="store_true",
        help='print the plan as JSON: {"modules": [...], "settings": {...}, "sources": {...}} with generator '
        "filters, the JIT split, the build's settings as the command line, the manifest and the environment "
        "give them, and where each declared setting came from",
    )
    p.add_argument(
        "--key",
        action="store_true",
        help="probe the toolchain and print the build key (what --prebuilt looks up); with --json, "
        "every input of the key and each part's digest (to see why two keys differ)",
    )
    p.add_argument("--no-isolation", action="store_true", help="the key of a build run with --no-isolation")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.key:
        key = build_key(spec_of(args))  # --no-isolation: the key of a build run with it
        print(json.dumps(shown(key.explain()), indent=2, sort_keys=True) if args.json else key.key)
        return 0
    spec = spec_of(args)
    prepared = whole_plan(spec, with_settings=args.json)
    plan = prepared.plan
    warn(plan.warnings)
    files = generated_files(plan, spec.environ())
    if args.json:
        data = plan.to_json()
        data["settings"] = None if prepared.settings is None else prepared.settings.to_json()
        data["sources"] = None if prepared.given is None else prepared.given.values.to_json()  # value + where
        for mod, raw in zip(plan.modules, data["modules"], strict=True):
            for i, gen in enumerate(raw["generators"]):
                gen["files"] = files.get((mod.name, i))
        print(json.dumps(shown(data), indent=2, sort_keys=True))
        return 0
    print(
        f"namespace {plan.namespace}  archs {', '.join(plan.archs)}  tree {plan.tree_root}"
        f"  commit {plan.tree_commit or '(not a git checkout)'}"
    )
    for m in plan.modules:
        print(f"\n{m.name} -> {m.md_name}  [{m.mode}, {'python module' if m.is_python_module else m.link}]")
        print(f"  sources     {len(m.sources)}")
        for s in m.sources:
            print(f"    {s}")
        for i, g in enumerate(m.generators):
            print(f"  generator   {g.command}" + ("  (qola's registry)" if g.origin == "registry" else ""))
            if g.filter is not None:
                print(f"    filter    {g.filter}" + (f"  (through {g.wrapper})" if g.wrapper else ""))
            if g.qola_receipt:
                print(f"    receipt   {g.qola_receipt}, applied by qola (the generator does not know it)")
            if g.targets:
                print(f"    archs     {', '.join(g.targets)}")
            listed = files.get((m.name, i))
            if listed is not None:
                print(f"    files     {_summary(listed, plan.archs)}")
        for src, names in m.gates:
            print(f"  switches    {Path(src).name} gates kernel code on {', '.join(names)}")
        if m.api is not None:  # the C++ API read from the tree, re-declared in qola::<ns>:: (qola.plan.itfs)
            print(f"  api         {m.api.public_header}, from the tree's {m.api.header}")
            for d in (*m.api.decls, *m.api.provided):
                where = "qola's" if d.body is not None else "the tree's"
                cond = f"  [#if {' && '.join(d.conditions)}]" if d.conditions else ""
                print(f"    {d.signature()}  ({where}){cond}")
        if m.jit is not None:
            print(
                f"  jit         {len(m.jit.ahead)} instance(s) ahead, every other generated one deferred"
                f" (stubs: {m.jit.style})"
            )
        if m.record_ahead:
            print("  record      instances built ahead record their first call (record_ahead)")
        if m.flags_extra_hip:
            print(f"  hip flags   {' '.join(m.flags_extra_hip)}")
        if m.flags_extra_cc:
            print(f"  cc flags    {' '.join(m.flags_extra_cc)}")
        _print_tail(plan, m)
    return 0


def _print_tail(plan: Plan, m: ModulePlan) -> None:
    """The module's last lines: its include dirs, then qola's fixes of the tree (qola.plan.fixes) that
    concern it, each with its status and its file."""
    print(f"  includes    {len(m.include_dirs)}")
    for u in (u for u in plan.fixes if m.name in u.modules):
        print(f"  fix         {u.name}: {u.status}, {u.file}" + (f"  ({u.note})" if u.status == "changed" else ""))


def generated_files(plan: Plan, env: Mapping[str, str]) -> dict[tuple[str, int], dict[str, list[str]] | None]:
    """(module, generator index) -> {file stem: the plan archs it holds device code for}, from the
    generator's own ``--list_blobs`` (CK's fMHA generator; others cannot list their files: absent).
    A listing that fails is None (the build will run the generator and say why)."""

    out: dict[tuple[str, int], dict[str, list[str]] | None] = {}
    genv = GeneratorEnv.of(env).for_plan(plan)  # the environment the generation gets
    for mod in plan.modules:
        for i, gen in enumerate(mod.generators):
            if genrules.flavor_of(gen.script) != "ck":
                continue
            try:
                stems = list_blobs(gen, genv, gen.filter)
            except QolaError:
                out[(mod.name, i)] = None
                continue
            out[(mod.name, i)] = {s: list(a) for s, a in genrules.file_archs(stems, plan.archs).items()}
    return out


def _summary(files: dict[str, list[str]] | None, archs: Sequence[str]) -> str:
    if files is None:
        return "(the generator could not list them)"
    counts: dict[str, int] = {}
    for served in files.values():
        key = ", ".join(served) if served else "no arch of this build"
        counts[key] = counts.get(key, 0) + 1
    return "; ".join(f"{n} for {k}" for k, n in sorted(counts.items()))
