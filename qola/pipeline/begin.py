"""Stage 0 of every command that reads a manifest: every setting resolved once (:func:`ask`: the
command line's values, the manifest's raw tables read once, the environment, into one frozen
:class:`~qola.pipeline.spec.Given` with the tree choice made there), and for a build what is known
before the lock and the no-op check (:func:`start`: the environment read once, the directories,
whether to check the tree out).

Light at import (the no-op fast path runs after :func:`start`, before anything heavy is loaded).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING

from qola.checkout.choice import VARIABLES as CHOICE_VARIABLES
from qola.checkout.choice import choose
from qola.compile.layout import BuildLayout
from qola.core import knobs
from qola.core import settings as declared
from qola.core.errors import QolaError
from qola.core.proc import ChildEnv
from qola.core.setting import manifest_tables, resolve_all
from qola.pipeline import preflight
from qola.pipeline.record import CommandRecord
from qola.pipeline.spec import BuildSpec, Given
from qola.pipeline.views import child_env, recorded

if TYPE_CHECKING:
    from qola.store.fastpath import RecordedEnv


def ask(spec: BuildSpec, env: Mapping[str, str]) -> Given:
    """Every declared setting of ``spec`` resolved once (:func:`qola.core.settings.resolve_all`:
    command line > manifest > environment > default; the manifest's tables read once, its paths
    relative to its dir) and the tree they choose (:func:`qola.checkout.choice.choose`)."""
    tables, base = manifest_tables(spec.manifest)
    every = declared.declared()
    read = {k: env[k] for s in every for k in s.env if k in env}  # the declared variables, nothing else
    values = resolve_all(every, spec.given, tables, read, base)
    return Given(values, choose(values, {k: env[k] for k in CHOICE_VARIABLES if k in env}))


def layout_of(spec: BuildSpec) -> BuildLayout:
    """The output dir and the build dir (--build-dir > <output dir>.build), checked
    (:func:`qola.pipeline.preflight.output_dirs`)."""
    if not spec.output_dir:
        raise QolaError("no output dir given", hint="pass -o/--output-dir DIR")
    out, build_dir = preflight.output_dirs(spec.output_dir, spec.build_dir)
    return BuildLayout(build_dir, out)


@dataclass(frozen=True)
class Start:
    """Stage 0 of a build: what is known before the manifest's schema loads. ``env`` is the build's
    environment, read once (read-only); only the pipeline reads it further (:func:`recorded_env`,
    :func:`qola.pipeline.prepare.resolve_build`). ``given``: every setting, resolved once."""

    env: Mapping[str, str] = field(repr=False)
    layout: BuildLayout
    given: Given
    checkout: bool  # whether the build checks its tree out first (:func:`qola.pipeline.run._checkout`)
    child: ChildEnv = field(repr=False)  # the environment children run under (the incremental path's ninja)
    asked: CommandRecord = field(default_factory=CommandRecord)  # manifest.json's ``build``: the command line's part
    wait: float | None = None  # for another build holding the dirs: --wait > QOLA_WAIT > None (fail at once)


def start(spec: BuildSpec) -> Start:
    """The build's environment (read once), every ``QOLA_*`` knob checked, every setting resolved
    (:func:`ask`: ``-j``, ``[build].jobs`` and ``MAX_JOBS`` each checked), the directories
    (:func:`layout_of`) and whether the tree is checked out first."""
    env = MappingProxyType(dict(os.environ if spec.env is None else spec.env))  # read once (BuildSpec.environ)
    # every QOLA_* knob, before any work (a library caller's environment too: issue 41 item 6)
    knobs.check_environment({k: v for k, v in env.items() if k.startswith(knobs.PREFIX)})
    given = ask(spec, env)
    given.values.check()  # every setting, before any work: -j 2 does not hide a broken MAX_JOBS
    layout = layout_of(spec)
    choice, values = given.choice, given.values
    # QoLA's build checks out without --skip-checkout: qola's default checkout always; a tree the user
    # named only when --aiter-commit or --patches-dir asks for it; one named by QOLA_/NVTE_AITER_SOURCE_DIR never
    wanted = choice.managed or values.by_flag(declared.AITER_COMMIT) or values.by_flag(declared.PATCHES_DIR)
    checkout = wanted and not (spec.skip_checkout or choice.from_env or spec.dry_run)
    asked = command_record(spec)
    return Start(env, layout, given, checkout, child_env(env), asked, given[declared.WAIT])


def recorded_env(begun: Start, keys: Iterable[str]) -> RecordedEnv:
    """The variables of ``keys`` (what a no-op record names) and ``AITER_CONFIG_*``, from the
    build's environment: what :func:`qola.store.fastpath.unchanged` digests."""
    return recorded(begun.env, keys)


def command_record(spec: BuildSpec) -> CommandRecord:
    """What manifest.json's ``build`` entry records of the command line (:func:`settings_record`)."""
    groups = spec.given.get(declared.GROUPS.name)
    return CommandRecord(
        isolate=bool(spec.isolate),
        allow_unpinned=bool(spec.allow_unpinned),
        groups=tuple(str(g) for g in groups) if isinstance(groups, (list, tuple)) else (),
        skip_checkout=bool(spec.skip_checkout),
        usage_files=tuple(os.path.abspath(f) for f in spec.usage_files),
    )
