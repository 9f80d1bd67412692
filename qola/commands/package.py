"""``qola package OUT [--into DIR]``: a finished output as an archive named by its build key."""

from __future__ import annotations

import argparse
from pathlib import Path

from qola.commands.common import add_debug
from qola.store.prebuilt import package


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "package",
        help="archive a finished output dir by its build key (for --prebuilt)",
        description="Audit OUT (as qola audit does) and write its current version as "
        "<namespace>-<key[:16]>.tar.gz (deterministic), with .sha256 and .json beside it, into DIR: "
        "what qola build --prebuilt DIR|URL installs.",
    )
    p.add_argument("output_dir", metavar="OUT", help="the -o directory of a finished qola build")
    p.add_argument("--into", default=".", metavar="DIR", help="where the archive goes (default: the current dir)")
    add_debug(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:

    done = package(Path(args.output_dir), Path(args.into))
    print(f"{done.archive}\nsha256 {done.sha256}\nbuild key {done.key}")
    return 0
