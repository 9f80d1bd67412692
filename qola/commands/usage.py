"""``qola usage``: recorded usage → a manifest fragment (``merge``), and what records cover in a built
output (``cover``). docs/usage.md."""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

from qola.commands.common import add_debug, add_manifest_args, spec_of, warn
from qola.core.errors import QolaError
from qola.core.fsutil import atomic_write
from qola.hooks import jit as jitbuild
from qola.pipeline.begin import ask
from qola.pipeline.prepare import prepare
from qola.plan import variants
from qola.store.usage import apply, cover, fragment, records


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "usage",
        help="merge recorded usage into a manifest fragment; show what it covers",
        description="Recorded usage (QOLA_USAGE_DIR) -> the exact set of variants to build ahead.",
    )
    s = p.add_subparsers(dest="usage_command", metavar="ACTION", required=True)
    m = s.add_parser(
        "merge",
        help="merge record files/dirs into a [usage] fragment, checked against the tree",
        description="Merge usage records from many runs and machines into a [usage] fragment. Every "
        "variant is checked against its module's variant universe at the tree's commit.",
    )
    m.add_argument("records", nargs="+", help="record files, or QOLA_USAGE_DIR dirs (their qola-usage-*.rec files)")
    add_manifest_args(m)
    m.add_argument("-o", "--output", help="write the fragment here (default: stdout)")
    m.set_defaults(func=run_merge)
    c = s.add_parser(
        "cover",
        help="show what records cover in a built output dir",
        description="For each recorded variant: built ahead, deferred to the JIT, or absent from OUT.",
    )
    c.add_argument("records", nargs="+", help="record files, or QOLA_USAGE_DIR dirs")
    c.add_argument("--out", "-o", required=True, help="the output dir of a qola build")
    c.add_argument("--strict", action="store_true", help="exit 1 unless every recorded variant is built ahead")
    add_debug(c)
    c.set_defaults(func=run_cover)


def _read(paths: list[str]) -> records.ReadResult:

    res = records.read(records.record_files(paths))
    if res.bad_lines:
        warn([f"skipped {res.bad_lines} record line(s) that are torn, damaged or not records: "
              + "; ".join(res.problems)])  # fmt: skip
    if not res.records:
        raise QolaError(
            f"no usage records in {', '.join(paths)} ({res.files} file(s) read)",
            hint="run the workload with QOLA_USAGE_DIR=<dir> set (docs/usage.md)",
        )
    return res


def run_merge(args: argparse.Namespace) -> int:

    res = _read(args.records)
    spec = spec_of(args)
    env = spec.environ()
    prepared = prepare(spec, ask(spec, env), env)
    plan = jitbuild.plan_jit(variants.apply(prepared.plan, prepared.manifest, env), prepared.manifest, env)
    by_md = {m.md_name: m.name for m in plan.modules}
    wanted: dict[str, list[str]] = {}
    for r in res.records:
        module = r.module if r.module in {m.name for m in plan.modules} else by_md.get(r.md_name, r.module)
        wanted.setdefault(module, []).append(r.unit)
    try:
        apply.check(plan, wanted, env, where="usage records")
    except QolaError as exc:
        seen = next((f for (mod, unit), f in res.first_seen.items() if repr(unit) in exc.message), None)
        raise QolaError(exc.message + (f" (recorded at {seen})" if seen else ""), hint=exc.hint) from None
    keys = Counter(r.build_key or "(none)" for r in res.records)
    comments = [
        f"merged {len(res.records)} record(s) from {res.files} file(s) by `qola usage merge`",
        "build keys recorded: " + ", ".join(f"{k[:16]} x{n}" for k, n in keys.most_common()),
    ]
    text = fragment.render(((m, n) for m, names in wanted.items() for n in names), plan.tree_commit, comments)
    if args.output:
        atomic_write(Path(args.output), text.encode())
        total = len({(m, n) for m, names in wanted.items() for n in names})
        print(f"{args.output}: {total} variant(s) of {len(wanted)} module(s)", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def run_cover(args: argparse.Namespace) -> int:

    res = _read(args.records)
    rows, key = cover.cover(res.records, Path(args.out))
    counts = Counter(r.status for r in rows)
    for r in rows:
        print(
            f"{r.status:9} {r.module:24} {r.unit}  [{', '.join(r.events)}]"
            + ("" if r.same_build else "  (other build)")
        )
    compiled = [r for r in rows if "compile" in r.events]
    print(
        f"\n{len(rows)} variant(s) recorded: {counts[cover.AHEAD]} built ahead, {counts[cover.JIT]} deferred to "
        f"the JIT, {counts[cover.ABSENT]} absent from {args.out}, {counts[cover.NO_MODULE]} of modules it lacks; "
        f"{len(compiled)} compiled at run time by the recorded runs"
    )
    if key and not any(r.same_build for r in rows):
        print(f"note: no record names this output's build key {key[:16]}: the runs used another build")
    return 1 if args.strict and counts[cover.AHEAD] != len(rows) else 0
