"""Arguments and preparation shared by the subcommands that read a manifest and a tree."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping

from qola.spec import BuildSpec, Prepared


def add_debug(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show a traceback on errors")


def add_manifest_args(parser: argparse.ArgumentParser, *, mode: bool = True) -> None:
    parser.add_argument("--manifest", "-m", required=True, help="path of the qola.toml manifest")
    parser.add_argument(
        "--aiter-root", help="root of the kernel tree (default: [qola].aiter_root of the manifest)"
    )
    parser.add_argument(
        "--arch", action="append", dest="archs", metavar="ARCH",
        help="target architecture (repeatable; beats the manifest and GPU_ARCHS)",
    )
    if mode:
        parser.add_argument("--mode", choices=["pybind", "cpp_itfs"], help="default mode for modules without one")
    parser.add_argument(
        "--allow-unpinned", action="store_true", help="warn instead of failing when the tree's commit differs"
    )
    add_debug(parser)


def plan_spec(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> BuildSpec:
    """The :class:`BuildSpec` of a command that plans (no output dir)."""
    return BuildSpec(manifest=args.manifest, aiter_root=args.aiter_root, archs=tuple(args.archs or ()),
                     mode=getattr(args, "mode", None), allow_unpinned=args.allow_unpinned,
                     env=dict(os.environ) if env is None else dict(env))


def prepare(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> Prepared:
    """Manifest, tree and the plan as the tables give it (variants and the JIT split not resolved:
    :func:`qola.pipeline.plan` does that)."""
    from qola import spec  # noqa: PLC0415

    s = plan_spec(args, env)
    return spec.prepare(s, s.environ())


def warn(messages: list[str] | tuple[str, ...]) -> None:
    for msg in messages:
        print(f"warning: {msg}", file=sys.stderr)
