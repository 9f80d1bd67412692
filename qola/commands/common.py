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
from qola.core.setting import add_argument
from qola.core.settings import Setting
from qola.pipeline.begin import ask
from qola.pipeline.prepare import prepare as pipeline_prepare
from qola.pipeline.spec import BuildSpec, Prepared


def add_debug(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show a traceback on errors")


def add_manifest_args(parser: argparse.ArgumentParser, command: str = settings.PLAN) -> None:
    """The arguments of a command that reads a manifest: ``--manifest``, every declared setting whose
    declaration names ``command`` (:func:`add_settings`), ``--skip-checkout``, ``--usage``,
    ``--allow-unpinned``."""
    parser.add_argument("--manifest", "-m", required=True, help="path of the qola.toml manifest")
    add_settings(parser, command)
    parser.add_argument(
        "--skip-checkout",
        action="store_true",
        help="use the tree as it is: never check it out or patch it; a pin mismatch is a warning recorded in "
        "manifest.json",
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
        "--allow-unpinned", action="store_true", help="warn instead of failing when the tree's commit differs"
    )
    add_debug(parser)


def add_settings(parser: argparse.ArgumentParser, command: str) -> None:
    """The flag of every declared setting (:data:`qola.core.settings.ALL`) that ``command`` takes, in
    the shape its declaration gives (:func:`qola.core.setting.add_argument`)."""
    for s in settings.for_command(command):
        add_argument(parser, s, command)


def given_of(args: argparse.Namespace) -> dict[str, object]:
    """The declared settings' command-line values of ``args`` by name (a list as a tuple; absent or
    None: not given)."""
    parsed = vars(args)
    given: dict[str, object] = {}
    for s in settings.declared():
        value = parsed.get(s.name)
        if value is not None:
            given[s.name] = tuple(value) if isinstance(value, list) else value
    return given


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
    setting = next((s for s in settings.declared() if s.name == dest), None)
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
        elif f.name not in ("env", "given") and given.get(f.name) is not None:
            value = given[f.name]
            values[f.name] = tuple(value) if isinstance(value, list) else value
    if given.get("argv"):
        values["key_args"] = build_key_args(given)
    return BuildSpec(**values, given=given_of(args), env=dict(os.environ if env is None else env))


def prepare(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> Prepared:
    """Manifest, tree and the plan as the tables give it (variants and the JIT split not resolved:
    :func:`qola.pipeline.run.plan` does that)."""
    s = spec_of(args, env)
    environ = s.environ()
    return pipeline_prepare(s, ask(s, environ), environ)


def warn(messages: list[str] | tuple[str, ...]) -> None:
    for msg in messages:
        print(f"warning: {msg}", file=sys.stderr)
