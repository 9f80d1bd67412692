"""``qola cache``: show and clean qola's local compile cache (:mod:`qola.store.ccache`).

The cache dir is the build's: ``QOLA_CACHE_DIR``, else ``$XDG_CACHE_HOME/qola/cc``, else
``~/.cache/qola/cc``, with the same checks (a directory of yours, not writable by others).
"""

from __future__ import annotations

import argparse
import json
import os

from qola.store import ccache


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "cache",
        help="show or clean the local compile cache (show, clean)",
        description="qola build takes an object from its compile cache when every file its compile read "
        "is as it was (QOLA_CACHE_DIR, else ~/.cache/qola/cc; --no-cache builds without it).",
    )
    sub = p.add_subparsers(dest="cache_command", metavar="ACTION", required=True)
    show = sub.add_parser("show", help="where the cache is and what it holds")
    show.add_argument("--json", action="store_true", help="as JSON")
    show.set_defaults(func=run_show)
    clean = sub.add_parser("clean", help="remove every entry")
    clean.set_defaults(func=run_clean)


def run_show(args: argparse.Namespace) -> int:
    path = ccache.default_dir(os.environ)
    held = ccache.contents(path)
    cap = ccache.max_bytes(os.environ)
    if args.json:
        print(json.dumps({**held.to_json(), "max_bytes": cap}, indent=1))
        return 0
    print(
        f"compile cache {path}: {held.objects} object(s), {held.actions} compile(s) recorded, "
        f"{held.bytes / (1 << 20):,.1f} MiB of at most {cap / (1 << 30):,.1f} GiB"
        + (f"; {held.wrappers} compiler wrapper(s) it steps aside for" if held.wrappers else "")
    )
    return 0


def run_clean(args: argparse.Namespace) -> int:
    path = ccache.default_dir(os.environ)
    if not path.exists():
        print(f"compile cache {path}: nothing to clean")
        return 0
    held = ccache.clean(path)
    print(f"compile cache {path}: removed {held.objects} object(s), {held.bytes / (1 << 20):,.1f} MiB")
    return 0
