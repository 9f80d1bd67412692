"""Arguments and preparation shared by the subcommands that read a manifest and a tree."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from typing import TYPE_CHECKING

from qola.errors import QolaError

if TYPE_CHECKING:  # the heavy modules are imported where they are used (keeps `qola build`'s no-op fast)
    from qola.manifest import Manifest
    from qola.plan import Plan
    from qola.tree.aiter import AiterTree


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


@dataclass(frozen=True)
class Prepared:
    manifest: Manifest
    tree: AiterTree
    plan: Plan


def tree_root(args: argparse.Namespace, manifest: Manifest) -> Path:
    if args.aiter_root:
        return Path(args.aiter_root)
    if manifest.qola.aiter_root:
        return manifest.base_dir / manifest.qola.aiter_root
    raise QolaError(
        "no kernel tree given", hint="pass --aiter-root DIR or set [qola].aiter_root in the manifest"
    )


def hip_version(env: Mapping[str, str], manifest: Manifest) -> str | None:
    """The HIP version that answers ``torch.version.hip``: the installed HIP compiler's (found and
    read as the build finds and reads it), else the manifest's first accepted ROCm version."""
    from qola.toolchain.hip import installed_version  # noqa: PLC0415 (the build's own probe)

    return installed_version(env) or (manifest.qola.rocm_versions or [None])[0]


def prepare(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> Prepared:
    from qola import manifest as manifest_mod  # noqa: PLC0415
    from qola.plan import check_pin, choose_archs, make_plan  # noqa: PLC0415
    from qola.tree.aiter import open_tree  # noqa: PLC0415

    env = dict(os.environ) if env is None else env
    manifest = manifest_mod.load(args.manifest)
    tree = open_tree(tree_root(args, manifest))
    archs = choose_archs(args.archs, manifest, env)
    commit, notes = check_pin(manifest, tree, args.allow_unpinned)
    hipv = hip_version(env, manifest) if manifest_mod.vendor(archs[0]) == "hip" else None
    plan = make_plan(
        manifest, tree, archs=archs, cli_mode=getattr(args, "mode", None), env=env,
        hip_version=hipv, tree_commit=commit, warnings=notes,
    )
    return Prepared(manifest, tree, plan)


def warn(messages: list[str] | tuple[str, ...]) -> None:
    for msg in messages:
        print(f"warning: {msg}", file=sys.stderr)
