"""What a build is asked to do (:class:`BuildSpec`) and every setting it then runs with
(:class:`Settings`), each resolved by the one precedence chain of :mod:`qola.core.settings`
(command line > manifest > environment > default; a setting's sources and its check are declared
there once). Also the first stage of every command that reads a manifest: :func:`prepare` (manifest,
tree, plan).

A build resolves its settings here, in two calls from :func:`qola.pipeline.run.build`:
:func:`start` (stage 0, before the lock and the no-op check: the environment read once, the
directories, the tree choice, whether to check out, the children's environment) and
:func:`resolve_build` (stage 1, after them: manifest, tree, plan, :class:`Settings`, the typed
views). What the stages after that get are the views, never the :class:`BuildSpec`, the
:class:`Start` or the raw environment: :class:`~qola.toolchain.env.ToolchainEnv`,
:class:`~qola.core.proc.ChildEnv`, :class:`~qola.plan.variants.GeneratorEnv`, :func:`tree_env`,
:class:`~qola.checkout.git.GitEnv`, :class:`~qola.store.fastpath.RecordedEnv`.

Light at import (the no-op fast path reads a BuildSpec before anything heavy is loaded).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import shutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING

from qola.checkout.choice import VARIABLES as CHOICE_VARIABLES
from qola.checkout.choice import choose, named_by_env
from qola.compile.layout import BuildLayout
from qola.core import deadlines, inputs, owner
from qola.core import settings as declared
from qola.core.errors import QolaError
from qola.core.proc import ChildEnv
from qola.pipeline import preflight
from qola.pipeline.record import BuildRecord, CommandRecord, settings_record
from qola.store.fastpath import ENV_PREFIXES, RecordedEnv, env_keys_of

if TYPE_CHECKING:  # the heavy modules are imported where they are used
    from qola.checkout.choice import TreeChoice
    from qola.checkout.git import GitEnv
    from qola.compile.dist import Farm
    from qola.compile.executor import Executor
    from qola.plan.manifest import Manifest
    from qola.plan.model import Plan
    from qola.plan.tree.aiter import AiterTree
    from qola.plan.variants import GeneratorEnv
    from qola.store.remote import Endpoint
    from qola.toolchain.env import ToolchainEnv


@dataclass(frozen=True)
class BuildSpec:
    """What the caller asks for: the command line's values, or a test's. None / empty / False: not
    given, the manifest, the environment or a default decides (:func:`settings`)."""

    manifest: str  # --manifest
    output_dir: str | None = None  # -o (a build needs it; planning does not)
    aiter_root: str | None = None  # --aiter-root > [qola].aiter_root
    archs: tuple[str, ...] = ()  # --arch > [build].architectures > GPU_ARCHS
    mode: str | None = None  # --mode > [build].mode > pybind (modules' own mode beats all)
    allow_unpinned: bool = False
    jobs: int | None = None  # -j > [build].jobs > MAX_JOBS > AITER's cpu/memory rule
    build_dir: str | None = None  # --build-dir > <output dir>.build
    launcher: str | None = None  # --launcher > [build].launcher > none
    dist: bool = False  # --dist: compile through sccache on its sccache-dist farm (qola.compile.dist)
    remote: str | None = None  # --remote URL > [build].remote: every compile an REAPI action (qola.store.remote)
    remote_options: Mapping[str, str] = field(default_factory=dict)  # instance, ca, cert, key, token
    remote_fallback: bool = False  # --remote-fallback: the service failing, compile locally (counted)
    dry_run: bool = False
    verbose: bool = False
    isolate: bool = True  # --no-isolation: False
    wait: float | None = None  # --wait: for another build holding the same dirs
    prebuilt: str | None = None  # --prebuilt DIR|URL: install the archive of the build key when there is one
    publish_to: str | None = None  # --publish DIR: package the finished output into DIR by its build key
    keep_going: bool = False  # --keep-going: a module failing, publish the others (default: publish nothing)
    argv: tuple[str, ...] = ()  # the command line as given (the lock shows it; () = none: no fast path)
    # what the no-op fast path keys on: the parsed arguments less how the build is shown or waited for
    # (commands.common.build_key_args); () = the command line as given
    key_args: tuple[str, ...] = ()
    groups: tuple[str, ...] = ()  # --group (each ;-separated) > QOLA_BUILD_GROUPS > every module (qola.plan.groups)
    skip_checkout: bool = False  # --skip-checkout: the tree is built as it is; a pin mismatch is a warning
    aiter_commit: str | None = None  # --aiter-commit > [qola].aiter_commit: what the checkout checks out
    patches_dir: str | None = None  # --patches-dir > [qola].patches_dir: the patch set of the checkout
    aiter_url: str | None = None  # --aiter-url > [qola].aiter_url > QOLA_AITER_URL > ROCm/aiter
    force_checkout: bool = False  # --force-checkout: a checkout may discard local changes of the tree
    usage_files: tuple[str, ...] = ()  # --usage: fragments whose [usage] variants join the manifest's
    record_ahead: bool = False  # --record-ahead > [usage] record_ahead: ahead variants record their first call
    jit: bool | None = None  # --jit on|off > [jit] enabled (None: as the manifest says)
    env: Mapping[str, str] | None = field(default=None, compare=False)  # None: os.environ when used

    def environ(self) -> dict[str, str]:
        """The environment of this build (a copy; never changed)."""
        return dict(os.environ if self.env is None else self.env)


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
    settings: Settings | None = None  # qola plan: the requested settings (:func:`requested`)


def tree_choice(spec: BuildSpec, manifest: Manifest, env: Mapping[str, str] | None = None) -> TreeChoice:
    """Which tree (:mod:`qola.checkout.choice`): --aiter-root > [qola].aiter_root (relative to the
    manifest's dir) > QOLA_AITER_SOURCE_DIR > NVTE_AITER_SOURCE_DIR > the default checkout."""
    root = manifest.base_dir / manifest.qola.aiter_root if manifest.qola.aiter_root else None
    return choose(spec.aiter_root, root, only(spec.environ() if env is None else env, CHOICE_VARIABLES))


def tree_root(spec: BuildSpec, manifest: Manifest, env: Mapping[str, str] | None = None) -> Path:
    """The tree's root (:func:`tree_choice`); the default checkout must exist."""
    choice = tree_choice(spec, manifest, env)
    if choice.managed and not choice.path.exists():
        raise QolaError(
            f"no kernel tree given, and the default checkout {choice.path} does not exist",
            hint="pass --aiter-root DIR, set [qola].aiter_root in the manifest, or clone it: "
            f"qola checkout --manifest {spec.manifest}",
        )
    if choice.managed:  # qola's own clone (a cache under ~/.cache for an installed qola): the user's alone
        owner.check_dir(choice.path, "default kernel checkout", "--aiter-root")
    return choice.path


def pin_chooser(spec: BuildSpec, manifest: Manifest, env: Mapping[str, str]) -> str | None:
    """Why the tree is the user's explicit choice (its pin mismatch then a recorded warning), or None."""
    choice = tree_choice(spec, manifest, env)
    if spec.skip_checkout:
        return "--skip-checkout"
    return choice.how if choice.from_env else named_by_env(choice.path, only(env, CHOICE_VARIABLES))


def hip_version(env: Mapping[str, str] | ToolchainEnv, manifest: Manifest) -> str | None:
    """The HIP version that answers ``torch.version.hip``: the installed HIP compiler's (found and
    read as the build finds and reads it), else the manifest's first accepted ROCm version."""
    from qola.toolchain.env import ToolchainEnv  # lazy: the build's own probe
    from qola.toolchain.hip import installed_version  # lazy: the build's own probe

    return installed_version(ToolchainEnv.of(env)) or next(iter(manifest.qola.rocm_versions or ()), None)


def prepare(spec: BuildSpec, env: Mapping[str, str]) -> Prepared:
    """Manifest, tree and plan as the tables and the manifest give it (no generator runs: variants
    and the JIT split are the next stages, :func:`qola.pipeline.run.plan`)."""
    from qola.hooks import jit as jit_hook  # lazy: start-up of the CLI and of the no-op path
    from qola.plan import groups  # lazy: start-up of the CLI and of the no-op path
    from qola.plan import manifest as manifest_mod  # lazy: start-up of the CLI and of the no-op path
    from qola.plan.planner import (
        PinAsk,
        PlanInputs,
        check_pin,
        choose_archs,
        make_plan,
    )  # lazy: start-up of the CLI and of the no-op path
    from qola.plan.tree.aiter import open_tree  # lazy: start-up of the CLI and of the no-op path
    from qola.store.usage import fragment as usage_fragment  # lazy: start-up of the CLI and of the no-op path

    manifest = manifest_mod.load(spec.manifest)
    manifest = usage_fragment.merged(manifest, spec.usage_files)  # [usage] files and --usage
    manifest = usage_fragment.recording(manifest, spec.record_ahead)  # --record-ahead: as [usage] record_ahead
    manifest = jit_hook.switched(manifest, spec.jit)  # --jit on|off: as [jit] enabled
    wanted, where = groups.wanted(spec.groups, only(env, (groups.ENV,)))
    manifest = groups.select(manifest, wanted, where)
    tree = open_tree(tree_root(spec, manifest, env))
    archs = choose_archs(spec.archs, manifest, only(env, declared.ARCHS.env))
    commit, notes, pin = check_pin(
        manifest,
        tree,
        PinAsk(
            spec.allow_unpinned,
            want=spec.aiter_commit,
            want_from="--aiter-commit",
            chosen=pin_chooser(spec, manifest, env),
            git_env=git_view(env),
        ),
    )
    if manifest.qola.patches_dir or spec.patches_dir:
        from qola.checkout.request import unapplied_patches_note  # lazy: start-up of the CLI and of the no-op path

        note = unapplied_patches_note(tree.root, manifest, git_view(env), spec.patches_dir)
        notes += [note] if note else []
    hipv = hip_version(env, manifest) if manifest_mod.vendor(archs[0]) == "hip" else None
    plan = make_plan(
        manifest,
        tree,
        PlanInputs(
            archs=archs,
            cli_mode=spec.mode,
            env=tree_env(env, tree),
            hip_version=hipv,
            tree_commit=commit,
            warnings=notes,
            pin=pin,
        ),
    )
    if wanted:
        manifest = groups.prune(manifest, plan)
    return Prepared(manifest, tree, plan)


def child_env(env: Mapping[str, str]) -> ChildEnv:
    """The environment every child runs under (opaque: no setting is read from it)."""
    return ChildEnv(tuple(sorted(env.items())))


def git_view(env: Mapping[str, str]) -> GitEnv:
    """What git reads of ``env`` (:class:`qola.checkout.git.GitEnv`)."""
    from qola.checkout.git import GitEnv  # lazy: start-up of the CLI and of the no-op path

    return GitEnv(child_env(env), env.get(deadlines.GIT_LOCAL.variable))


def recorded(env: Mapping[str, str], keys: Iterable[str]) -> RecordedEnv:
    """The variables of ``keys`` and every ``AITER_CONFIG_*`` (:class:`qola.store.fastpath.RecordedEnv`)."""
    return RecordedEnv.of(env, keys)


def only(env: Mapping[str, str], keys: Iterable[str]) -> dict[str, str]:
    """The variables of ``keys`` that ``env`` sets: what one stage reads, and nothing else."""
    return {k: env[k] for k in keys if k in env}


# what the plan reads of the environment besides the variables the tree names (qola.plan.planner,
# qola.plan.tree.aiter)
PLAN_VARIABLES = ("CK_DIR", "ENABLE_CK", "AITER_ENABLE_EXPERIMENTAL")


def tree_env(env: Mapping[str, str], tree: AiterTree) -> dict[str, str]:
    """What the tree's evaluation may read (AITER's core.py and its config lookups read the
    environment, as AITER does): every variable its module table or core.py names as a string,
    ``AITER_CONFIG_*`` and :data:`PLAN_VARIABLES`. Resolved once, before the plan is made."""
    from qola.plan.tree.files import MAX_CORE, MAX_TABLE, read_small  # lazy: start-up of the CLI and of the no-op path

    texts = []
    for path, limit in ((tree.table_path, MAX_TABLE), (tree.core_path, MAX_CORE)):
        with contextlib.suppress(OSError, QolaError):  # checked (a FIFO or a device is never waited on)
            texts.append(read_small(path, limit=limit, what="tree file").decode("utf-8", errors="replace"))

    def named(key: str) -> bool:  # a string literal, in Python or escaped inside the table's JSON strings
        quoted = re.compile(r"""\\?['"]""" + re.escape(key) + r"""\\?['"]""")
        return any(key in t and quoted.search(t) for t in texts)  # the substring test first: no scan

    return {k: v for k, v in env.items() if k in PLAN_VARIABLES or k.startswith(ENV_PREFIXES) or named(k)}


def layout_of(spec: BuildSpec) -> BuildLayout:
    """The output dir and the build dir (--build-dir > <output dir>.build), checked
    (:func:`qola.pipeline.preflight.output_dirs`)."""
    if not spec.output_dir:
        raise QolaError("no output dir given", hint="pass -o/--output-dir DIR")
    out, build_dir = preflight.output_dirs(spec.output_dir, spec.build_dir)
    return BuildLayout(build_dir, out)


def requested(
    spec: BuildSpec, manifest: Manifest, env: Mapping[str, str], layout: BuildLayout | None = None
) -> Settings:
    """Every setting by its chain alone (:func:`qola.core.settings.resolve`), nothing on the
    machine asked (values are checked: a bad ``[build].jobs`` or ``MAX_JOBS`` is an error even
    where ``-j`` hides it)."""
    from qola.toolchain import default_jobs  # lazy: start-up of the CLI and of the no-op path

    jobs = declared.resolve(
        declared.JOBS, spec.jobs, manifest.build.jobs, only(env, declared.JOBS.env), default=lambda: default_jobs({})
    )
    child, tenv, genv = views(env)
    return Settings(
        layout=layout,
        jobs=jobs.value,
        launcher=declared.resolve(declared.LAUNCHER, spec.launcher, manifest.build.launcher).value,
        dry_run=spec.dry_run,
        verbose=spec.verbose,
        isolate=spec.isolate,
        record_ahead=bool(manifest.usage and manifest.usage.record_ahead),
        remote=_remote(spec, manifest),
        child=child,
        toolchain_env=tenv,
        generator_env=genv,
    )


def views(env: Mapping[str, str]) -> tuple[ChildEnv, ToolchainEnv, GeneratorEnv]:
    """What the stages after planning read of ``env``, resolved once: the environment every child
    runs under (opaque), the toolchain's variables (:mod:`qola.toolchain.env`) and the generators'
    deadline and listing cache (:class:`qola.plan.variants.GeneratorEnv`)."""
    from qola.plan.listcache import cache_dir  # lazy: start-up of the CLI and of the no-op path
    from qola.plan.variants import GeneratorEnv  # lazy: start-up of the CLI and of the no-op path
    from qola.toolchain.env import VARIABLES, ToolchainEnv  # lazy: start-up of the CLI and of the no-op path

    child = child_env(env)
    toolchain = ToolchainEnv(tuple(sorted(only(env, VARIABLES).items())), child)
    return (
        child,
        toolchain,
        GeneratorEnv(child, env.get(deadlines.GENERATOR.variable), cache_dir(only(env, ("XDG_CACHE_HOME", "HOME")))),
    )


@dataclass(frozen=True)
class Start:
    """Stage 0 of a build: what is known before the manifest loads. ``env`` is the build's
    environment, read once (read-only); only this module reads it further (:func:`recorded_env`,
    :func:`resolve_build`)."""

    env: Mapping[str, str] = field(repr=False)
    layout: BuildLayout
    choice: TreeChoice
    checkout: bool  # whether the build checks its tree out first (:func:`qola.pipeline.run._checkout`)
    child: ChildEnv = field(repr=False)  # the environment children run under (the incremental path's ninja)
    asked: CommandRecord = field(default_factory=CommandRecord)  # manifest.json's ``build``: the command line's part
    wait: float | None = None  # for another build holding the dirs: --wait > QOLA_WAIT > None (fail at once)


def start(spec: BuildSpec) -> Start:
    """The build's environment (read once), ``-j`` and ``MAX_JOBS`` checked, ``--wait`` >
    ``QOLA_WAIT`` resolved, its directories
    (:func:`layout_of`) and the tree as far as it is known before the manifest's schema loads
    (:mod:`qola.checkout.choice`, given only the variables it reads)."""
    env = MappingProxyType(spec.environ())
    # every QOLA_* knob, before any work (a library caller's environment too: issue 41 item 6)
    declared.check_environment({k: v for k, v in env.items() if k.startswith(declared.PREFIX)})
    declared.resolve(declared.JOBS, spec.jobs, None, only(env, declared.JOBS.env), default=int)  # checked
    wait = declared.resolve(declared.WAIT, spec.wait, None, only(env, declared.WAIT.env)).value
    layout = layout_of(spec)
    early = preflight.early_tree_root(None, spec.manifest)
    choice = choose(spec.aiter_root, early, only(env, CHOICE_VARIABLES))
    # QoLA's build checks out without --skip-checkout: qola's default checkout always; a tree the user
    # named only when --aiter-commit or --patches-dir asks for it; one named by QOLA_/NVTE_AITER_SOURCE_DIR never
    wanted = choice.managed or bool(spec.aiter_commit or spec.patches_dir)
    checkout = wanted and not (spec.skip_checkout or choice.from_env or spec.dry_run)
    return Start(env, layout, choice, checkout, child_env(env), command_record(spec), wait)


def recorded_env(begun: Start, keys: Iterable[str]) -> RecordedEnv:
    """The variables of ``keys`` (what a no-op record names) and ``AITER_CONFIG_*``, from the
    build's environment: what :func:`qola.store.fastpath.unchanged` digests."""
    return recorded(begun.env, keys)


@dataclass(frozen=True)
class Resolved:
    """Stage 1 of a build: manifest, tree and plan as the tables give it, every setting, and what
    the build key, the no-op record and manifest.json read of the environment."""

    prepared: Prepared
    settings: Settings
    table: tuple[list[str], list[str]]  # the module table's and core.py's paths, the texts of those read
    inputs: RecordedEnv  # the recorded variables (:func:`qola.store.fastpath.env_keys_of` of the texts)
    tree_given: str  # the tree's root as named (the no-op record notices a symlink re-pointed)
    record: BuildRecord  # manifest.json's ``build`` (:func:`settings_record`)


def resolve_build(spec: BuildSpec, begun: Start) -> Resolved:
    """Stage 1: :func:`prepare`, :func:`settings` (the machine asked for ``vendor``'s launcher or
    farm), the table texts and the views; the only call that reads ``begun.env`` after stage 0."""
    env = begun.env
    prepared = prepare(spec, env)
    s = settings(spec, prepared.manifest, begun.layout, env, prepared.plan.vendor)
    table = table_texts(prepared.tree)
    inputs = recorded(env, env_keys_of(table[1]))
    given = str(tree_root(spec, prepared.manifest, env))
    record = settings_record(begun.asked, inputs, env_keys_of(table[1]))
    return Resolved(prepared, s, table, inputs, given, record)


def table_texts(tree: AiterTree) -> tuple[list[str], list[str]]:
    """(the module table and core.py, the texts of those that could be read)."""
    files = [str(tree.table_path), str(tree.core_path)]
    texts = []
    for f in files:
        with contextlib.suppress(OSError):
            texts.append(inputs.read_record(f, limit=inputs.MAX_SOURCE, what="tree file"))
    return files, texts


def settings(
    spec: BuildSpec, manifest: Manifest, layout: BuildLayout, env: Mapping[str, str], vendor: str | None = None
) -> Settings:
    """:func:`requested`, then the machine asked: where the compiles run, one value
    (:func:`qola.compile.executor.choose`: a launcher or ``--dist``'s farm, ``vendor``: the plan's,
    "cuda" or "hip", deciding the launcher, ``-j`` and farm; or the ``--remote`` service)."""
    from qola.compile import executor  # lazy: start-up of the CLI and of the no-op path

    asked = requested(spec, manifest, env, layout)
    service = None
    if asked.remote is not None:
        from qola.store import remote  # lazy: start-up of the CLI and of the no-op path

        service = remote.service(asked.remote, asked.jobs, remote.RemoteUse(spec.remote_fallback, asked.dry_run))
    ex = executor.choose(
        executor.Asked(spec.dist, vendor, asked.launcher, asked.jobs, bool(spec.jobs), service),
        find=lambda name, hint: launcher(name, env, hint),
        env=asked.child,
    )
    return dataclasses.replace(asked, jobs=ex.jobs, launcher=ex.launcher, farm=ex.farm, notes=ex.notes, executor=ex)


def _remote(spec: BuildSpec, manifest: Manifest) -> Endpoint | None:
    """--remote URL > [build].remote; the other options from the command line only (they are this
    machine's files: certificates, a token)."""
    from qola.store.remote import endpoint  # lazy: light

    o = spec.remote_options
    return endpoint(
        declared.resolve(declared.REMOTE, spec.remote, manifest.build.remote).value,
        instance=o.get("instance"),
        ca=o.get("ca"),
        cert=o.get("cert"),
        key=o.get("key"),
        token=o.get("token"),
    )


def launcher(name: str | None, env: Mapping[str, str], hint: str | None = None) -> str | None:
    """The compiler launcher's path on the build's PATH (None: no launcher)."""
    if not name:
        return None
    found = shutil.which(name, path=env.get("PATH"))
    if not found:
        raise QolaError(
            f"compiler launcher {name!r} not found on PATH",
            hint=hint or f"install it (pip install {name} / apt-get install {name}) or drop --launcher",
        )
    return found


def command_record(spec: BuildSpec) -> CommandRecord:
    """What manifest.json's ``build`` entry records of the command line (:func:`settings_record`)."""
    return CommandRecord(
        isolate=bool(spec.isolate),
        allow_unpinned=bool(spec.allow_unpinned),
        groups=tuple(spec.groups),
        skip_checkout=bool(spec.skip_checkout),
        usage_files=tuple(os.path.abspath(f) for f in spec.usage_files),
    )
