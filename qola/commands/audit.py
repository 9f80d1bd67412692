"""``qola audit OUT``: check a whole output directory against the manifest.json qola wrote there.

Exit 0 when clean, 1 listing every problem, 2 when manifest.json is missing or unreadable.

The checks themselves are the library's (:mod:`qola.output.checks`); this command parses, calls
:func:`qola.output.checks.audit_output` (or :func:`qola.pipeline.reproduce.reproduce`) and prints.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from qola.commands.common import add_flag
from qola.core import settings
from qola.core.errors import BuildFailed
from qola.output import outdir
from qola.output.checks import audit_output, load_manifest, resolve_root
from qola.pipeline import reproduce


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "audit",
        help="check an output dir against its manifest.json: every file, checksums, exports",
        description="Check OUT against OUT/manifest.json: the layout, every file (nothing unrecorded, "
        "nothing missing, sizes and sha256), each built library's ELF exports (only qola::<ns>:: and "
        "<ns>_ symbols, exactly the recorded list), and that every module built.",
    )
    p.add_argument("output_dir", metavar="OUT", help="a qola output directory (holds manifest.json)")
    p.add_argument("--namespace", help="check against this namespace instead of the manifest's")
    p.add_argument(
        "--allow-failed", action="store_true", help="a module recorded as failed (and absent) is not a problem"
    )
    p.add_argument(
        "--reproduce",
        action="store_true",
        help="instead: rebuild OUT's build (its recorded manifest, tree, settings and compiler) in a "
        "temporary directory and compare every library's bytes with manifest.json's sha256",
    )
    add_flag(p, settings.JOBS, metavar="N", help="parallel jobs of the --reproduce rebuild")
    p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show a traceback on errors")
    p.set_defaults(func=run)


def run_reproduce(args: argparse.Namespace) -> int:
    """``--reproduce``: the rebuild's table; exit 1 when a library differs (:mod:`qola.pipeline.reproduce`)."""

    def start(tmp: Path) -> None:
        print(f"reproduce {args.output_dir}: rebuilding in {tmp} …", file=sys.stderr, flush=True)

    with outdir.reading(Path(args.output_dir)):  # the layout is the plain audit's concern
        root, _, _ = resolve_root(Path(args.output_dir))
        data = load_manifest(root)
        result = reproduce.reproduce(root, data, jobs=args.jobs, on_start=start)
    print(result.table())
    for note in result.notes:
        print(f"  note: {note}")
    bad = [f"{r.file}: {r.result}" for r in result.rows if not r.ok] + result.problems
    if bad:
        body = "\n".join(f"  {p}" for p in bad)
        raise BuildFailed(f"reproduce {args.output_dir}: {len(bad)} problem(s):\n{body}")
    print(
        f"reproduce {args.output_dir}: {len(result.rows)} librar{'y' if len(result.rows) == 1 else 'ies'} "
        "byte-identical"
    )
    return 0


def run(args: argparse.Namespace) -> int:
    if args.reproduce:
        return run_reproduce(args)
    checked, problems, notes = audit_output(Path(args.output_dir), args.namespace, allow_failed=args.allow_failed)
    if problems:
        body = "\n".join(f"  {p}" for p in problems)
        raise BuildFailed(f"audit of {args.output_dir}: {len(problems)} problem(s) in {checked} artifact(s):\n{body}")
    print(f"audit of {args.output_dir}: {checked} artifact(s) clean; " + "; ".join(notes))
    return 0
