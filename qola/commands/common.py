"""Arguments and preparation shared by the subcommands that read a manifest and a tree."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping

from qola.pipeline.spec import BuildSpec, Prepared


def add_debug(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show a traceback on errors")


def add_manifest_args(parser: argparse.ArgumentParser, *, mode: bool = True) -> None:
    parser.add_argument("--manifest", "-m", required=True, help="path of the qola.toml manifest")
    parser.add_argument(
        "--aiter-root",
        "-a",
        help="root of the kernel tree (default: [qola].aiter_root of the manifest, else "
        "QOLA_AITER_SOURCE_DIR / NVTE_AITER_SOURCE_DIR, else the default checkout: docs/manifest.md)",
    )
    parser.add_argument(
        "--arch",
        action="append",
        dest="archs",
        metavar="ARCH",
        help="target architecture(s), ';'-separated (repeatable; beats the manifest and GPU_ARCHS)",
    )
    parser.add_argument(
        "--group",
        action="append",
        dest="groups",
        metavar="GROUP",
        help="build only the [[modules]] of these groups, ';'-separated (repeatable; default: QOLA_BUILD_GROUPS, "
        "else every module)",
    )
    parser.add_argument(
        "--skip-checkout",
        action="store_true",
        help="use the tree as it is: never check it out or patch it; a pin mismatch is a warning recorded in "
        "manifest.json",
    )
    parser.add_argument(
        "--aiter-commit",
        metavar="REV",
        help="the commit (sha, tag or branch) to check out and to expect (beats [qola].aiter_commit)",
    )
    parser.add_argument(
        "--usage",
        action="append",
        dest="usage_files",
        metavar="FRAGMENT",
        help="a usage fragment (qola usage merge): build exactly its variants ahead, with the manifest's "
        "[usage] (repeatable; docs/usage.md)",
    )
    parser.add_argument(
        "--record-ahead",
        action="store_true",
        help="variants built ahead record their first call in each process, as deferred ones do "
        "(as [usage] record_ahead = true; docs/usage.md)",
    )
    parser.add_argument(
        "--jit",
        choices=["on", "off"],
        help="on: defer every generated instance to the on-demand JIT (the manifest's [jit], or an empty one); "
        "off: build everything ahead ([jit] enabled = false); default: as the manifest says (docs/manifest.md)",
    )
    if mode:
        parser.add_argument("--mode", choices=["pybind", "cpp_itfs"], help="default mode for modules without one")
    parser.add_argument(
        "--allow-unpinned", action="store_true", help="warn instead of failing when the tree's commit differs"
    )
    add_debug(parser)


def jit_switch(value: str | None) -> bool | None:
    """``--jit on|off`` as the :class:`BuildSpec` holds it (None: not given)."""
    return None if value is None else value == "on"


def plan_spec(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> BuildSpec:
    """The :class:`BuildSpec` of a command that plans (no output dir)."""
    return BuildSpec(
        manifest=args.manifest,
        aiter_root=args.aiter_root,
        archs=tuple(args.archs or ()),
        mode=getattr(args, "mode", None),
        allow_unpinned=args.allow_unpinned,
        env=dict(os.environ) if env is None else dict(env),
        # the group and checkout options a command may lack: their defaults
        groups=tuple(getattr(args, "groups", None) or ()),
        skip_checkout=bool(getattr(args, "skip_checkout", False)),
        aiter_commit=getattr(args, "aiter_commit", None),
        patches_dir=getattr(args, "patches_dir", None),
        aiter_url=getattr(args, "aiter_url", None),
        force_checkout=bool(getattr(args, "force_checkout", False)),
        usage_files=tuple(getattr(args, "usage_files", None) or ()),
        record_ahead=bool(getattr(args, "record_ahead", False)),
        jit=jit_switch(getattr(args, "jit", None)),
    )


def prepare(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> Prepared:
    """Manifest, tree and the plan as the tables give it (variants and the JIT split not resolved:
    :func:`qola.pipeline.run.plan` does that)."""
    from qola.pipeline import spec  # lazy: start-up of the CLI and of the no-op path

    s = plan_spec(args, env)
    return spec.prepare(s, s.environ())


def warn(messages: list[str] | tuple[str, ...]) -> None:
    for msg in messages:
        print(f"warning: {msg}", file=sys.stderr)
