"""``qola checkout``: clone (on demand), check out the pinned commit, sync submodules, apply the
patch set — without building (QoLA's command; qola's guarantees: :mod:`qola.checkout.sync`)."""

from __future__ import annotations

import argparse
import os
import sys

from qola.checkout.choice import choose
from qola.checkout.request import Asked, request
from qola.checkout.sync import ensure
from qola.commands.common import add_debug, add_flag
from qola.core import settings
from qola.core.errors import QolaError
from qola.plan import groups
from qola.plan import manifest as manifest_mod


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "checkout",
        help="clone/fetch the kernel tree, check out the pin, apply the patches",
        description="Bring the kernel tree to the manifest's (or --aiter-commit's) commit with its "
        "submodules and patch set, without building.",
    )
    p.add_argument(
        "--manifest",
        "-m",
        help="manifest whose [qola] aiter_commit, patches_dir, aiter_url and "
        "aiter_root are the defaults of the options below",
    )
    add_flag(
        p, settings.AITER_ROOT, typed=False, help="the tree (default: [qola].aiter_root, else the default checkout)"
    )
    p.add_argument(
        "--aiter-commit",
        metavar="REV",
        help="sha, tag or branch to check out (beats the manifest; default: the tree's HEAD, which must exist)",
    )
    p.add_argument(
        "--patches-dir",
        metavar="DIR",
        help="*.patch files applied in lexical order (beats [qola].patches_dir; an empty dir or /dev/null: none)",
    )
    add_flag(
        p,
        settings.AITER_URL,
        typed=False,
        metavar="URL",
        help="clone URL (beats [qola].aiter_url and QOLA_AITER_URL; default: https://github.com/ROCm/aiter.git)",
    )
    p.add_argument("--force", action="store_true", help="discard local changes of the tree (never without this)")
    add_flag(
        p,
        settings.GROUPS,
        typed=False,
        action="append",
        metavar="GROUP",
        help="check that the manifest declares these groups (';'-separated, repeatable) and list "
        "their modules; the checkout is the same for every group",
    )
    add_debug(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    env = dict(os.environ)
    manifest = None
    if args.manifest:
        manifest = manifest_mod.load(args.manifest)
    names = groups.wanted(args.groups, {})[0]
    if names:
        if manifest is None:
            raise QolaError("--group needs --manifest (the groups are the manifest's)")
        for group, mods in groups.check(manifest, names, "--group").items():
            print(f"group {group}: {', '.join(mods)}", file=sys.stderr)
    root = manifest.base_dir / manifest.qola.aiter_root if manifest is not None and manifest.qola.aiter_root else None
    choice = choose(args.aiter_root, root, env)
    if choice.from_env:  # as QoLA's CMake: a tree named by QOLA_/NVTE_AITER_SOURCE_DIR is used as it is
        print(f"qola: {choice.how} names the tree to build as it is; not checking it out", file=sys.stderr)
        print(f"AITER ready at {os.path.abspath(choice.path)}")
        return 0
    req = request(
        choice.path,
        manifest,
        env,
        Asked(commit=args.aiter_commit, patches_dir=args.patches_dir, url=args.aiter_url, force=args.force),
    )
    result = ensure(req)
    for note in result.notes:
        print(f"qola: {note}", file=sys.stderr)
    if result.patches and not result.changed:  # a fresh apply names them in its note already
        print(f"qola: patches applied ({len(result.patches)}): {', '.join(result.patches)}", file=sys.stderr)
    print(f"AITER ready at {result.root}")
    return 0
