"""What a build is asked (:class:`BuildSpec`), every setting resolved once from it (:class:`Given`:
the one frozen value of :func:`qola.core.settings.resolve_all` and the tree choice made from it), and
what the build then runs with (:class:`Settings`, :class:`Prepared`). The jobs around them have their
own modules: :mod:`qola.pipeline.begin` (stage 0: the one resolve), :mod:`qola.pipeline.prepare`
(stage 1: manifest, tree, plan), :mod:`qola.pipeline.machine` (the launcher, ``--dist``, ``--remote``),
:mod:`qola.pipeline.views` (what each stage reads of the environment).

Light at import (the no-op fast path reads a BuildSpec before anything heavy is loaded).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from qola.core import settings as declared
from qola.core.proc import ChildEnv

if TYPE_CHECKING:  # the heavy modules are imported where they are used
    from qola.checkout.choice import TreeChoice
    from qola.compile.dist import Farm
    from qola.compile.executor import Executor
    from qola.compile.layout import BuildLayout
    from qola.core.setting import Values
    from qola.plan.manifest import Manifest
    from qola.plan.model import Plan
    from qola.plan.tree.aiter import AiterTree
    from qola.plan.variants import GeneratorEnv
    from qola.store.remote import Endpoint
    from qola.toolchain.env import ToolchainEnv


@dataclass(frozen=True)
class BuildSpec:
    """What the caller asks for: the command line's values, or a test's. A declared setting's
    command-line value is in ``given`` by its name (:data:`qola.core.settings.ALL`; absent: the
    manifest, the environment or its default decides); :meth:`make` takes both kinds by name."""

    manifest: str  # --manifest
    output_dir: str | None = None  # -o (a build needs it; planning does not)
    allow_unpinned: bool = False
    build_dir: str | None = None  # --build-dir > <output dir>.build
    dist: bool = False  # --dist: compile through sccache on its sccache-dist farm (qola.compile.dist)
    remote_options: Mapping[str, str] = field(default_factory=dict)  # instance, ca, cert, key, token
    remote_fallback: bool = False  # --remote-fallback: the service failing, compile locally (counted)
    dry_run: bool = False
    verbose: bool = False
    isolate: bool = True  # --no-isolation: False
    prebuilt: str | None = None  # --prebuilt DIR|URL: install the archive of the build key when there is one
    publish_to: str | None = None  # --publish DIR: package the finished output into DIR by its build key
    keep_going: bool = False  # --keep-going: a module failing, publish the others (default: publish nothing)
    argv: tuple[str, ...] = ()  # the command line as given (the lock shows it; () = none: no fast path)
    # what the no-op fast path keys on: the parsed arguments less how the build is shown or waited for
    # (commands.common.build_key_args); () = the command line as given
    key_args: tuple[str, ...] = ()
    skip_checkout: bool = False  # --skip-checkout: the tree is built as it is; a pin mismatch is a warning
    usage_files: tuple[str, ...] = ()  # --usage: fragments whose [usage] variants join the manifest's
    given: Mapping[str, object] = field(default_factory=dict)  # each declared setting's flag value, by name
    env: Mapping[str, str] | None = field(default=None, compare=False)  # None: os.environ when used

    @classmethod
    def make(cls, manifest: str, **kw: object) -> BuildSpec:
        """A BuildSpec from keywords: a declared setting's name (``jobs=4``, ``archs=("gfx942",)``)
        goes into ``given``, any other is the field of that name."""
        return cls(manifest).changed(**kw)

    def changed(self, **kw: object) -> BuildSpec:
        """This spec with the keywords changed (a declared setting's into ``given``)."""
        names = {s.name for s in declared.declared()}
        given = {**self.given, **{k: v for k, v in kw.items() if k in names}}
        change: Callable[..., BuildSpec] = dataclasses.replace  # each field's type: checked by its user
        return change(self, given=given, **{k: v for k, v in kw.items() if k not in names})

    def environ(self) -> dict[str, str]:
        """The environment of this build (a copy; never changed)."""
        return dict(os.environ if self.env is None else self.env)


@dataclass(frozen=True)
class Given:
    """Every setting of a command, resolved once (:func:`qola.pipeline.begin.ask`): the values and
    where each came from, and the tree they choose (made once, reused by every stage after)."""

    values: Values
    choice: TreeChoice

    def __getitem__(self, setting: declared.Setting[declared.T]) -> declared.T:
        return self.values[setting]


@dataclass(frozen=True)
class Settings:
    """Every setting of one build, resolved once (see :class:`BuildSpec` for each chain):
    :func:`requested` by the chains alone (what ``qola plan --json`` prints), :func:`settings` with
    the machine asked (the launcher found on PATH, the --dist farm)."""

    layout: BuildLayout | None  # None: planning (no output dir)
    jobs: int
    launcher: str | None  # requested: as named; resolved: the launcher's path
    dry_run: bool
    verbose: bool
    isolate: bool
    record_ahead: bool = False  # --record-ahead or [usage] record_ahead (docs/usage.md)
    farm: Farm | None = None  # --dist: the sccache-dist farm that answered
    remote: Endpoint | None = None  # --remote: the REAPI service every compile goes to
    notes: tuple[str, ...] = ()  # what resolving the settings decided on its own (a HIP --dist compiles locally)
    executor: Executor | None = field(default=None, repr=False, compare=False)  # where compiles run (None: planning)
    # the views of the build's environment, resolved once (:func:`views`; the raw environment is not
    # kept): the children's environment, the toolchain's and the generators' variables
    child: ChildEnv = field(kw_only=True, repr=False, compare=False)
    toolchain_env: ToolchainEnv = field(kw_only=True, repr=False, compare=False)
    generator_env: GeneratorEnv = field(kw_only=True, repr=False, compare=False)

    def to_json(self) -> dict[str, object]:
        farm = (
            None
            if self.farm is None
            else {"scheduler": self.farm.scheduler, "servers": self.farm.servers, "cpus": self.farm.cpus}
        )
        return {
            "jobs": self.jobs,
            "launcher": self.launcher,
            "dry_run": self.dry_run,
            "verbose": self.verbose,
            "isolate": self.isolate,
            "record_ahead": self.record_ahead,
            "farm": farm,
            "notes": list(self.notes),
            "remote": None if self.remote is None else {"url": self.remote.url, "instance": self.remote.instance},
            "output_dir": None if self.layout is None else str(self.layout.out),
            "build_dir": None if self.layout is None else str(self.layout.root),
        }


@dataclass(frozen=True)
class Prepared:
    manifest: Manifest
    tree: AiterTree
    plan: Plan
    settings: Settings | None = None  # qola plan: the requested settings (:func:`qola.pipeline.machine.requested`)
    given: Given | None = None  # every setting as resolved once, with its source
