"""Arguments and preparation shared by the subcommands that read a manifest and a tree."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any

from qola.core import settings
from qola.core.settings import Setting
from qola.pipeline import spec as pipeline_spec
from qola.pipeline.spec import BuildSpec, Prepared


def add_debug(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show a traceback on errors")


def add_manifest_args(parser: argparse.ArgumentParser, *, mode: bool = True) -> None:
    parser.add_argument("--manifest", "-m", required=True, help="path of the qola.toml manifest")
    add_flag(parser, settings.AITER_ROOT, typed=False)
    add_flag(parser, settings.ARCHS, action="append", metavar="ARCH", typed=False)
    add_flag(parser, settings.GROUPS, action="append", metavar="GROUP", typed=False)
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
        add_flag(parser, settings.MODE, typed=False, choices=settings.MODES)
    parser.add_argument(
        "--allow-unpinned", action="store_true", help="warn instead of failing when the tree's commit differs"
    )
    add_debug(parser)


def jit_switch(value: str | None) -> bool | None:
    """``--jit on|off`` as the :class:`BuildSpec` holds it (None: not given)."""
    return None if value is None else value == "on"


def add_flag(parser: argparse.ArgumentParser, setting: Setting[Any], *, typed: bool = True, **kw: Any) -> None:
    """``setting``'s flag(s) (:mod:`qola.core.settings`), its value checked by the setting's one
    validator (``typed``: as argparse parses it; else when it is resolved, as ``--arch ""`` must
    reach the resolver)."""
    if typed:
        kw.setdefault("type", settings.arg_type(setting))
    kw.setdefault("help", setting.help)
    parser.add_argument(*setting.flags, dest=setting.name, **kw)


# BuildSpec fields the command line spells differently (each else is the argparse dest of its name)
_SPELLED: dict[str, Callable[[dict[str, Any]], object]] = {
    "isolate": lambda a: not a.get("no_isolation", False),
    "jit": lambda a: jit_switch(a.get("jit")),
    "remote_options": lambda a: {
        k: a[dest]
        for k, dest in (
            ("instance", "remote_instance"),
            ("ca", "remote_ca"),
            ("cert", "remote_client_cert"),
            ("key", "remote_client_key"),
            ("token", "remote_token"),
        )
        if a.get(dest)
    },
}


# the arguments that change how a build is shown or waited for, never what it builds
PRESENTATION = frozenset({"verbose", "quiet", "wait", "debug", "func", "argv"})


def build_key_args(given: Mapping[str, Any]) -> tuple[str, ...]:
    """The no-op fast path's key of a command line: every parsed argument but :data:`PRESENTATION`, as
    ``dest=value`` (JSON) in name order, a URL's credentials masked. Two spellings of one build (``-v``
    or not, ``-j2`` or ``-j 2``, options in another order, an abbreviated option) share it."""
    from qola.core.secret import redact  # lazy: paid only by the build command

    return tuple(
        f"{k}={redact(json.dumps(_as_parsed(k, v), sort_keys=True, default=str))}"
        for k, v in sorted(given.items())
        if k not in PRESENTATION
    )


def _as_parsed(dest: str, value: object) -> object:
    """A declared setting's value as its one parser reads it (``--arch a --arch b`` and ``--arch "a;b"``
    are one list); a value it refuses is kept as given (the build refuses it before any record)."""
    setting = next((s for s in settings.ALL if s.name == dest), None)
    if setting is None or value is None:
        return value
    try:
        return setting.parse(value)
    except ValueError:
        return value


def spec_of(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> BuildSpec:
    """The command line's arguments as a :class:`BuildSpec`: the one place a command's Namespace is
    read (the pipeline, and every stage after it, never sees it). A field the command has no flag
    for keeps its default; ``env``: the environment (default: this process's, read once here)."""
    given = vars(args)
    values: dict[str, Any] = {}
    for f in dataclasses.fields(BuildSpec):
        if f.name in _SPELLED:
            values[f.name] = _SPELLED[f.name](given)
        elif f.name != "env" and given.get(f.name) is not None:
            value = given[f.name]
            values[f.name] = tuple(value) if isinstance(value, list) else value
    if given.get("argv"):
        values["key_args"] = build_key_args(given)
    return BuildSpec(**values, env=dict(os.environ if env is None else env))


def prepare(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> Prepared:
    """Manifest, tree and the plan as the tables give it (variants and the JIT split not resolved:
    :func:`qola.pipeline.run.plan` does that)."""
    s = spec_of(args, env)
    return pipeline_spec.prepare(s, s.environ())


def warn(messages: list[str] | tuple[str, ...]) -> None:
    for msg in messages:
        print(f"warning: {msg}", file=sys.stderr)
