"""One build, start to end: :func:`build` (``qola build``) and :func:`plan` (``qola plan``).

:func:`build` checks and locks (stage 0), then takes one of four paths, each its own function:

* **no-op** (:func:`_nothing_to_do`): nothing stages 1-8 read changed and ninja has no dirty edge;
* **incremental** (:func:`_incremental`): nothing stages 1-8 read changed: ninja on the recorded
  graph, then 10-12 for what it relinked (None: no usable recipe, the full path runs);
* **--prebuilt** (:func:`qola.pipeline.finish.install_prebuilt`, after :func:`_prepare`'s stages
  1-5): an archive of the build key installed instead of stages 6-11 (None: no such archive, the full path runs);
* **full** (:func:`_full`, after :func:`_prepare`): stages 6-12.

Each stage takes data and returns data:

 1. prepare     manifest, tree, the plan as the tables give it; the build's settings
 2. variants    declared variants -> each generator's filter, in the plan
 3. JIT plan    [jit] -> each module's ahead/deferred split, in the plan
 4. output dir  refuse one qola did not write; clear what killed runs left
 5. toolchain   find and probe the compilers; the build key (:mod:`qola.store.key`); with
                --prebuilt, an archive of that key installed instead of stages 6-11
 6. generate    run the generators; each module's source list
 7. hooks       per module what the JIT, isolation and embedding add (computed, not written)
 8. write       every file the graph reads, in one place
 9. run_build   write build.ninja, run ninja
10. audit       ELF exports of every library
11. publish     a new version of the output dir
12. record      what the build was derived from, for the next no-op (and, with --publish, the
                output packaged by its key into the prebuilt store)

Nothing here prints: a :class:`Reporter` hears the warnings, notes and progress (the command line
shows them with rich; the default says nothing), and :class:`BuildReport` says what happened.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from qola.compile.layout import GIT_IGNORE, BuildLayout
from qola.core import lock
from qola.core.errors import QolaError
from qola.core.fsutil import write_if_changed
from qola.output import outdir
from qola.output.outdir import OUT_NAMES, OUT_PREFIXES
from qola.pipeline import finish, preflight
from qola.pipeline.begin import Start, ask, recorded_env, start
from qola.pipeline.machine import requested
from qola.pipeline.prepare import Resolved, hip_version, prepare, resolve_build, table_texts
from qola.pipeline.record import BuildRecord, settings_record
from qola.pipeline.report import BuildReport, Reporter
from qola.pipeline.spec import BuildSpec, Prepared, Settings
from qola.pipeline.views import views
from qola.store import fastpath
from qola.store.fastpath import NoopRecord, RecordedEnv

if TYPE_CHECKING:
    from qola.compile.executor import Executor
    from qola.compile.extras import ModuleExtra
    from qola.compile.ninja import NinjaRun
    from qola.compile.rebuild import Recipe, Run
    from qola.compile.results import CompileReport
    from qola.core.proc import ChildEnv
    from qola.plan.manifest import Manifest
    from qola.plan.model import Plan
    from qola.plan.variants import GenEnv
    from qola.store.key import BuildKey, Material
    from qola.toolchain import Toolchain
    from qola.toolchain.env import ToolchainEnv

__all__ = ["BuildReport", "BuildSpec", "Reporter", "build", "build_key", "plan"]
SHOW_PROGRESS_AFTER = 1.0  # seconds: the incremental path shows ninja's progress once it runs this long


def plan(spec: BuildSpec, *, with_settings: bool = False) -> Prepared:
    """The whole plan (``qola plan``): stages 1-3 of :func:`build`; ``with_settings``: and the
    build's settings as requested (:func:`qola.pipeline.machine.requested`, ``qola plan --json``)."""
    env = spec.environ()
    given = ask(spec, env)
    prepared = prepare(spec, given, env)
    asked = requested(spec, given, env) if with_settings else None
    return dataclasses.replace(prepared, plan=resolve(prepared, env), settings=asked)


def resolve(prepared: Prepared, env: GenEnv) -> Plan:
    """Stages 2 and 3: the declared variants' generator filters, then each feature's plan part (the
    JIT split, then [usage]: exactly the recorded variants ahead), in the plan."""
    from qola.compile.feature import planned  # lazy: start-up of the CLI and of the no-op path
    from qola.pipeline import features  # lazy: start-up of the CLI and of the no-op path
    from qola.plan import variants  # lazy: start-up of the CLI and of the no-op path

    plan_ = variants.apply(prepared.plan, prepared.manifest, env)  # 2. variants
    return planned(features.FEATURES, plan_, prepared.manifest, env)  # 3. JIT plan, [usage]


def build(spec: BuildSpec, reporter: Reporter | None = None) -> BuildReport:
    """Build ``spec`` into its output dir (see the module's docstring for the stages). Raises
    QolaError for what the user must fix (exit 2); a module that fails to build is in the report
    (exit 1), and nothing of it is published."""
    ui = reporter or Reporter()
    # 0. before anything is written or run: numbers, directories (never /, never nested in each other
    # or in the tree), then one build per build dir and output dir. The settings are resolved in
    # qola.pipeline.begin: stage 0 here (start), qola.pipeline.prepare: stage 1 after the no-op check (resolve_build); the
    # stages get the typed views they read, never the spec or the environment
    begun = start(spec)
    layout, choice = begun.layout, begun.given.choice
    preflight.tree_placement(choice.path, layout.out, layout.root, OUT_NAMES, OUT_PREFIXES)
    if not spec.dry_run:  # a directory qola did not publish (any project's lib/, manifest.json) is never replaced
        outdir.check_output(layout.out)
    if spec.publish_to:
        preflight.disjoint({"the output dir": layout.out, "the prebuilt store (--publish)": Path(spec.publish_to)})
    dirs = {"the build dir": (layout.root, "--build-dir")}
    if not spec.dry_run:
        dirs["the output dir"] = (layout.out, "-o")
    preflight.writable(dirs)
    locks = {layout.build_lock: f"the build dir {layout.root}"}
    if not spec.dry_run:
        locks[layout.out_lock] = f"the output dir {layout.out}"
    with lock.acquire(locks, ["qola", *spec.argv], wait=begun.wait) as held:
        try:  # the locks held: the checkout, then the no-op, incremental, --prebuilt or full path
            layout = begun.layout
            if begun.checkout:  # the tree first: the no-op fast path then sees its files
                for note in _checkout(spec, begun):
                    ui.note(note)
            noop_key = spec.key_args or spec.argv  # the build, not its spelling
            last = fastpath.load(layout.root, noop_key) if noop_key and not spec.dry_run else None
            seen = None if last is None else recorded_env(begun, last.names())  # what its digest reads
            record = None if last is None or seen is None else fastpath.unchanged(last, layout.root, layout.out, seen)
            if record is not None and seen is not None and record.rebuild:  # the incremental path
                preflight.room(layout.out, layout.root)
                asked = settings_record(begun.asked, seen, record.env_keys)
                again = Again(layout, record, seen, begun.child, asked, spec.verbose, spec.publish_to, spec.keep_going)
                done = _incremental(again, ui)
                if done is not None:  # None: no usable recipe
                    return done
            elif record is not None and _nothing_to_do(layout):  # the no-op path
                return BuildReport(layout)
            if not spec.dry_run:
                preflight.room(layout.out, layout.root)
            fastpath.forget(layout.root)  # from here on the record no longer says what the build dir holds
            ready = _prepare(resolve_build(spec, begun), ui)  # 1. prepare, every setting; then stages 2-5
            if ready.key is not None and spec.prebuilt:  # the --prebuilt path (None: no archive of this key)
                done = finish.install_prebuilt(spec.prebuilt, layout, ready.key, ready.plan.namespace, ui)
                if done is not None:
                    return done
            return _full(spec, ready, ui)  # the full path: stages 6-12
        except QolaError:
            held.undo()  # refused: the lock files and a build dir made only for them are not left behind
            raise


def _nothing_to_do(layout: BuildLayout) -> bool:
    """The no-op path's second question (its digest held): whether ninja has any dirty edge."""
    from ninja import BIN_DIR  # lazy: light: the package's __init__

    return fastpath.nothing_to_do(layout.root, os.path.join(BIN_DIR, "ninja"))


def _checkout(spec: BuildSpec, begun: Start) -> list[str]:
    """Check the tree out (``begun.checkout``: QoLA's ``build`` without ``--skip-checkout``,
    :func:`qola.pipeline.begin.start` decides). Returns notes."""
    from qola.checkout.request import request  # lazy: start-up of the CLI and of the no-op path
    from qola.checkout.sync import ensure  # lazy: start-up of the CLI and of the no-op path
    from qola.plan import manifest as manifest_mod  # lazy: start-up of the CLI and of the no-op path

    manifest_mod.load(spec.manifest)  # a manifest the schema refuses is said before the tree changes
    choice = begun.given.choice
    result = ensure(request(choice.path, begun.given.values, begun.env, own=choice.managed))
    return result.notes if result.changed else []


@dataclass(frozen=True)
class Again:
    """What the incremental path gets: the last successful build's ``record`` (``env``: the variables
    it names), the children's environment, manifest.json's ``build`` (``asked``), -v and --publish."""

    layout: BuildLayout
    record: NoopRecord
    env: RecordedEnv
    child: ChildEnv
    asked: BuildRecord
    verbose: bool
    publish_to: str | None
    keep_going: bool = False  # --keep-going: publish what built though a module failed


def _incremental(again: Again, ui: Reporter) -> BuildReport | None:
    """Nothing stages 1-8 read changed since the last successful build (``again.record``): run ninja
    on its graph (up to date when ninja has nothing to do), audit the libraries it relinked, publish,
    record. None: no usable recipe (the full path then runs)."""
    from qola.compile import ninja, rebuild  # lazy: light

    start, layout = time.perf_counter(), again.layout
    run, material = again.record.rebuild, again.record.key
    if run is None or material is None:
        return None
    if changed := _altered_sources(layout, run):  # generated again by the full path, never compiled as they are
        ui.note(f"generated sources changed since their generator wrote them ({changed}): generating again")
        return None
    mark = ninja.log_length(layout.root)
    outcome, notes = _ninja_again(again, run, start, ui)
    if outcome.returncode == 0 and any(line.startswith("ninja: no work to do") for line in outcome.log):
        return BuildReport(layout)
    from qola.compile.feature import audited  # lazy: only when ninja relinked something (not on the no-op path)
    from qola.pipeline import features  # lazy: only when ninja relinked something (not on the no-op path)

    recipe = rebuild.load(layout.root)
    if recipe is None:
        return None
    compiled = _settled_again(recipe, run, outcome, layout.root, mark=mark, start=start).noted(notes)
    compiled = audited(features.FEATURES, compiled, only=run.changed(layout.root))  # 10. audit what ninja relinked
    key = material.key()  # the tree's files rehashed: ninja rebuilt what some of them changed
    published = finish.publish_out(compiled, layout, {}, key, again.asked, again.keep_going)  # 11. publish
    if compiled.ok:  # 12. record (the recipe stays: nothing it holds changed)
        after = dataclasses.replace(again.record, rebuild=run.after(compiled, layout.root))
        fastpath.rerecord(layout.root, layout.out, after, again.env)
    else:
        fastpath.forget(layout.root)
    packaged = finish.store(again.publish_to, layout, compiled)
    return published.report(layout, compiled, key.key, packaged)


def _altered_sources(layout: BuildLayout, run: Run) -> str:
    """The generated sources of ``run``'s modules that are no longer as their generator left them
    (:func:`qola.compile.gensums.altered`), named for a note (the first few); "" when none."""
    from qola.compile import gensums  # lazy: light

    found = [
        f"{module}: {name}"
        for module in sorted(set(run.artifacts.values()))
        for name in gensums.altered(layout.blob(module))
    ]
    return ", ".join(found[:5]) + (f" and {len(found) - 5} more" if len(found) > 5 else "")


def _ninja_again(again: Again, run: Run, start: float, ui: Reporter) -> tuple[NinjaRun, tuple[str, ...]]:
    """(ninja's outcome on the recorded graph, what sccache did meanwhile); a progress display only
    for work that lasts (a one-edge rebuild needs none)."""
    from qola.compile import dist, ninja  # lazy: light

    env = again.child.plus(run.env)
    with contextlib.ExitStack() as shown:

        def status(done: int, total: int, text: str) -> None:
            if not shown_yet and time.perf_counter() - start > SHOW_PROGRESS_AFTER:
                shown_yet.append(shown.enter_context(ui.running(False)))
            ui.status(done, total, text)

        shown_yet: list[None] = []
        watched = dist.watch(run.launcher, env)
        how = ninja.RunOptions(
            jobs=run.jobs, env=env, owner=run.owner, targets=run.targets, verbose=again.verbose, on_status=status
        )
        outcome = ninja.run(again.layout.root, how)
        return outcome, dist.notes_of(watched)


def _settled_again(
    recipe: Recipe, run: Run, outcome: NinjaRun, root: Path, *, mark: int, start: float
) -> CompileReport:
    """The incremental build's report: the recipe's results (as they stood before ninja) settled by
    ``outcome`` (``mark``: where this run's entries of ``.ninja_log`` begin)."""
    from qola.compile import ninja  # lazy: light
    from qola.compile.results import CompileReport, Ran, settle  # lazy: start-up of the CLI and of the no-op path

    plan_, tc = recipe.typed()
    seconds: dict[str, float] = {}
    for out, secs in ninja.compile_times(root, mark).items():
        if (mod := run.owner(out)) is not None:
            seconds[mod] = seconds.get(mod, 0.0) + secs
    artifacts = {m: a for a, m in run.artifacts.items()}
    results = settle({r.name: r for r in recipe.results(run)}, Ran(outcome, artifacts, seconds, root, run.owner))
    return CompileReport(plan_, tc, tuple(results.values()), root, time.perf_counter() - start, tuple(outcome.log))


@dataclass(frozen=True)
class Ready:
    """What stages 1-5 decided, for the --prebuilt and the full path."""

    resolved: Resolved  # stage 1: manifest, tree, plan as the tables give it, the settings, the views
    plan: Plan  # with the variants' filters and the JIT split
    toolchain: Toolchain
    material: Material | None  # None: a dry run (no key)
    key: BuildKey | None


def _prepare(r: Resolved, ui: Reporter) -> Ready:
    """Stages 2-5 after stage 1 (``r``: manifest, tree and plan; settings): variants and the JIT
    split; the output dir refused or cleaned; the toolchain; the build key."""
    from qola.output.publish import prepare as prepare_output  # lazy: start-up of the CLI and of the no-op path

    prepared, s, manifest = r.prepared, r.settings, r.prepared.manifest
    layout = _layout(s)
    for note in s.notes:
        ui.note(note)
    preflight.tree_placement(prepared.tree.root, layout.out, layout.root, OUT_NAMES, OUT_PREFIXES)
    plan_ = resolve(prepared, s.generator_env)  # 2. variants, 3. JIT plan
    for w in plan_.warnings:
        ui.warning(w)
    if not s.dry_run:  # 4. output dir: refused or cleaned before anything compiles
        for note in prepare_output(layout.out, layout.root):
            ui.note(note)
    tc = _toolchain(plan_, manifest, s)  # 5. toolchain
    if tc.version_check and tc.version_check.message:
        ui.warning(tc.version_check.message)
    material = None if s.dry_run else _material(prepared, plan_, tc, s.isolate, r.inputs, table=r.table)
    key = None if material is None else material.key()
    return Ready(r, plan_, tc, material, key)


def _full(spec: BuildSpec, ready: Ready, ui: Reporter) -> BuildReport:
    """Stages 6-12: generate, hooks, write, ninja, audit, publish, record."""
    from qola.compile import rebuild  # lazy: start-up of the CLI and of the no-op path
    from qola.compile.feature import audited  # lazy: start-up of the CLI and of the no-op path
    from qola.pipeline import features  # lazy: start-up of the CLI and of the no-op path

    r, plan_, tc, key = ready.resolved, ready.plan, ready.toolchain, ready.key
    s, layout = r.settings, _layout(r.settings)
    ex = _executor(ready)
    ui.info(
        f"qola: {len(plan_.modules)} module(s), {tc.kind} {tc.version} ({tc.compiler}), "
        f"archs {', '.join(plan_.archs)}, -j {ex.jobs}{ex.header()}, build dir {layout.root}"
    )
    built = _compiled(ready, ex, ui)  # stages 6-9
    if s.dry_run:
        return BuildReport(layout, built.compiled, dry_run=True)
    assert key is not None  # computed for every build that is not a dry run
    compiled = audited(features.FEATURES, built.compiled)  # 10. audit
    published = finish.publish_out(compiled, layout, built.extras, key, r.record, spec.keep_going)  # 11. publish
    if compiled.ok and spec.argv and not compiled.stubs:  # 12. record (never over a wrapper's stubs: no no-op)
        eligible = rebuild.eligible(built.extras)
        recipe = rebuild.of(compiled, s.jobs, built.logs, layout.root, s.launcher) if eligible else None
        finish.remember(
            finish.Derived(
                spec.key_args or spec.argv, spec.manifest, spec.usage_files, r, plan_, tc, built.extras, ready.material
            ),
            *(recipe or (None, None)),
        )
    packaged = finish.store(spec.publish_to, layout, compiled)
    return published.report(layout, compiled, key.key, packaged)


def _executor(ready: Ready) -> Executor:
    """Where the compiles run (:class:`qola.compile.executor.Executor`, chosen by
    :func:`qola.pipeline.machine.settings`), ready: a ``--remote`` service answers and has this compiler
    before anything is generated."""
    from qola.compile.executor import Where  # lazy: start-up of the CLI and of the no-op path
    from qola.toolchain.identity import COMPILER_ENV  # lazy: start-up of the CLI and of the no-op path

    s = ready.resolved.settings
    assert s.executor is not None  # a build's settings have one (only planning's have none)
    remote_env = ready.resolved.inputs.only(("PATH", *COMPILER_ENV))  # trexe on PATH, the compilers' variables
    return s.executor.ready(Where(ready.toolchain, _layout(s).root, ready.plan.tree_root, remote_env))


@dataclass(frozen=True)
class Built:
    """What stages 6-9 made: the compile's report, each module's extra, each module's log before ninja."""

    compiled: CompileReport
    extras: dict[str, ModuleExtra]
    logs: dict[str, tuple[str, ...]]


def _compiled(ready: Ready, ex: Executor, ui: Reporter) -> Built:
    """Stages 6-9: generate, hooks, write, ninja (each compile where ``ex`` runs it)."""
    from qola.compile import extras as extras_mod  # lazy: start-up of the CLI and of the no-op path
    from qola.compile import feature as feat  # lazy: start-up of the CLI and of the no-op path
    from qola.compile import overlay  # lazy: start-up of the CLI and of the no-op path
    from qola.compile import steps as stages  # lazy: start-up of the CLI and of the no-op path
    from qola.compile.results import new_results  # lazy: start-up of the CLI and of the no-op path
    from qola.hooks import apply as hooks  # lazy: start-up of the CLI and of the no-op path
    from qola.pipeline import features  # lazy: start-up of the CLI and of the no-op path
    from qola.toolchain.identity import COMPILER_ENV  # lazy: start-up of the CLI and of the no-op path

    r, tc, key = ready.resolved, ready.toolchain, ready.key
    s, layout = r.settings, _layout(r.settings)
    tenv, child = _views(s)
    fixed = overlay.staged(ready.plan, layout.fixed)  # qola's fixes: the compiles read the staged copies
    plan_ = fixed.plan
    stage = stages.Stage(plan_, tc, layout, fixed.readers)
    with ui.running(s.dry_run):
        start = time.perf_counter()
        layout.root.mkdir(parents=True, exist_ok=True)
        write_if_changed(layout.git_ignore, GIT_IGNORE)  # git status of the checkout around it never shows it
        overlay.write(fixed, layout.fixed)
        begun = {
            n: res.failed(e) if (e := overlay.failures(fixed).get(n)) else res for n, res in new_results(plan_).items()
        }
        if any(m.generators for m in plan_.modules):
            ui.phase("generating")
        gen = stages.generate(  # 6. generate
            stage, begun, jobs=s.jobs, env=tenv, timeout=s.generator_env, on_event=ui.event
        )
        srcs, results = stages.sources(stage, gen.files, gen.results)
        feats = features.FEATURES
        ctx = feat.ExtraContext(stage, tenv, isolate=s.isolate, build_key=key.key if key else "")
        extras, results = hooks.extras(feats, ctx, srcs, results)  # 7. hooks
        extras_mod.write(extras, feat.shared_of(feats, plan_, layout))  # 8. write
        srcs = {name: src for name, src in srcs.items() if name in extras}
        logs = {name: res.log for name, res in results.items()}  # before ninja: the incremental path's start
        rules = feat.rules_of(feats, tc)
        graph = stages.graph_for(stage, srcs, extras, launcher=ex.launcher, rules=rules)
        ui.phase("compiling")
        notes_after = ex.watch(child.plus(tc.child_env), dry_run=s.dry_run)
        how = stages.CompileRun(
            jobs=ex.jobs,
            env=child,
            stamp_env=r.inputs.only(("PATH", *COMPILER_ENV)),
            dry_run=s.dry_run,
            verbose=s.verbose,
            on_status=ex.status(ui.status),
            notes=gen.notes,
            start=start,
        )
        compiled = stages.compile_graph(stage, graph, results, how).noted(notes_after())  # 9. run_build
    return Built(compiled, extras, logs)


def _views(s: Settings) -> tuple[ToolchainEnv, ChildEnv]:
    """The toolchain's view and the children's environment the settings resolved."""
    return s.toolchain_env, s.child


def build_key(spec: BuildSpec) -> BuildKey:
    """The build key of ``spec`` (``qola plan --key``): stages 1-5 of :func:`build`, no output dir;
    the compiler probes run in a temporary dir."""
    from qola.core.fsutil import pid_tempdir  # lazy: start-up of the CLI and of the no-op path

    env = spec.environ()
    prepared = prepare(spec, ask(spec, env), env)
    plan_ = resolve(prepared, env)
    child, tenv, genv = views(env)
    with pid_tempdir("qola-key-") as tmp:
        s = Settings(
            layout=BuildLayout(Path(tmp), Path(tmp) / "out"),
            jobs=1,
            launcher=None,
            dry_run=False,
            verbose=False,
            isolate=spec.isolate,
            child=child,
            toolchain_env=tenv,
            generator_env=genv,
        )
        tc = _toolchain(plan_, prepared.manifest, s)
    return _material(prepared, plan_, tc, spec.isolate, env).key()


def _material(
    prepared: Prepared,
    plan_: Plan,
    tc: Toolchain,
    isolate: bool,
    env: RecordedEnv | Mapping[str, str],
    *,
    table: tuple[list[str], list[str]] | None = None,
) -> Material:
    from qola.store import key as buildkey  # lazy: start-up of the CLI and of the no-op path

    files, texts = table or table_texts(prepared.tree)
    inputs = (
        env
        if isinstance(env, RecordedEnv)
        else RecordedEnv.of(env, fastpath.env_keys_of(texts, {m.name for m in plan_.modules}))
    )
    return buildkey.material(
        prepared.manifest, plan_, tc, inputs, isolate=isolate, table=buildkey.TableRead(files, texts)
    )


def _layout(s: Settings) -> BuildLayout:
    assert s.layout is not None  # a build's settings have one (only planning's have none)
    return s.layout


def _toolchain(plan_: Plan, manifest: Manifest, s: Settings) -> Toolchain:
    """The compilers for the plan's archs, probed (their flag probes cached in the build dir). A dry
    run with HIP plans with AITER's flags for the manifest's ROCm version, unprobed."""
    from qola.toolchain import ToolchainChoice, find_toolchain  # lazy: start-up of the CLI and of the no-op path

    hip = plan_.vendor == "hip"
    versions = manifest.qola.rocm_versions if hip else manifest.qola.cuda_versions
    assume = None
    tenv = s.toolchain_env  # only what the toolchain reads, and its children's environment
    if s.dry_run and hip:
        assume = (versions[0] if versions else None) or hip_version(tenv, manifest) or "7.0"
    return find_toolchain(
        plan_.archs,
        env=tenv,
        accepted_versions=versions,
        cache_dir=_layout(s).probes,
        choice=ToolchainChoice(assume_version=assume, drop_hip_flags=manifest.build.drop_hip_flags if hip else ()),
    )
