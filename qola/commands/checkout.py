"""``qola checkout``: clone (on demand), check out the pinned commit, sync submodules, apply the
patch set — without building (QoLA's command; qola's guarantees: :mod:`qola.checkout.sync`)."""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from typing import TYPE_CHECKING

from qola.checkout.choice import choose
from qola.checkout.request import request
from qola.checkout.sync import ensure
from qola.commands.common import add_debug, add_settings, given_of
from qola.core import settings
from qola.core.errors import QolaError

if TYPE_CHECKING:
    from qola.plan.manifest import Manifest


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
    add_settings(p, settings.CHECKOUT)  # --aiter-root, --aiter-commit, --patches-dir, --aiter-url, --force, --group
    add_debug(p)
    p.set_defaults(func=run)


def _schema_checked(path: str | None) -> Manifest | None:
    """The manifest through its schema (its message first, before the tree changes) where this
    interpreter has the schema's package; without it (Transformer Engine's build requirements: ninja
    and pybind11) the checkout reads only what it needs, the ``[qola]`` settings, each checked by its
    declaration, and a build says what else it needs (:data:`qola.cli.COMMAND_NEEDS`)."""
    if path is None:
        return None
    try:
        if importlib.util.find_spec("pydantic") is None:
            return None
    except ImportError:  # a finder that refuses it
        return None
    from qola.plan import manifest as manifest_mod  # lazy: pydantic

    return manifest_mod.load(path)


def run(args: argparse.Namespace) -> int:
    env = dict(os.environ)
    manifest = _schema_checked(args.manifest)
    tables, base = settings.manifest_tables(args.manifest)
    values = settings.resolve_all(given_of(args), tables, env, base)  # every setting, once
    names = values[settings.GROUPS] if values.by_flag(settings.GROUPS) else ()  # the flag's alone
    if names:
        if args.manifest is None:
            raise QolaError("--group needs --manifest (the groups are the manifest's)")
        if manifest is None:
            raise QolaError(
                "--group reads the manifest's modules through its schema, which needs pydantic",
                hint=f"{sys.executable} -m pip install 'pydantic>=2.5', or leave out --group (the checkout is the same)",
            )
        from qola.plan import groups  # lazy: the schema's (pydantic)

        for group, mods in groups.check(manifest, names, "--group").items():
            print(f"group {group}: {', '.join(mods)}", file=sys.stderr)
    choice = choose(values, env)
    if choice.from_env:  # as QoLA's CMake: a tree named by QOLA_/NVTE_AITER_SOURCE_DIR is used as it is
        print(f"qola: {choice.how} names the tree to build as it is; not checking it out", file=sys.stderr)
        print(f"AITER ready at {os.path.abspath(choice.path)}")
        return 0
    result = ensure(request(choice.path, values, env, own=choice.managed))
    for note in result.notes:
        print(f"qola: {note}", file=sys.stderr)
    if result.patches and not result.changed:  # a fresh apply names them in its note already
        print(f"qola: patches applied ({len(result.patches)}): {', '.join(result.patches)}", file=sys.stderr)
    print(f"AITER ready at {result.root}")
    return 0
