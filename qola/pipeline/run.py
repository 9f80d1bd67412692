"""One build, start to end: :func:`build` (``qola build``) and :func:`plan` (``qola plan``).

:func:`build` checks and locks (stage 0), then takes one of four paths, each its own function:

* **no-op** (:func:`_nothing_to_do`): nothing stages 1-8 read changed and ninja has no dirty edge;
* **incremental** (:func:`_incremental`): nothing stages 1-8 read changed: ninja on the recorded
  graph, then 10-12 for what it relinked (None: no usable recipe, the full path runs);
* **--prebuilt** (:func:`_prebuilt`, after :func:`_prepare`'s stages 1-5): an archive of the build
  key installed instead of stages 6-11 (None: no such archive, the full path runs);
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
from typing import TYPE_CHECKING, Any

from qola.compile.layout import GIT_IGNORE, BuildLayout
from qola.core import lock
from qola.core.errors import QolaError
from qola.core.fsutil import write_if_changed
from qola.output import outdir
from qola.output.outdir import OUT_NAMES, OUT_PREFIXES
from qola.pipeline import finish, preflight
from qola.pipeline.report import BuildReport, Reporter
from qola.pipeline.spec import (
    BuildSpec,
    Prepared,
    Resolved,
    Settings,
    Start,
    hip_version,
    prepare,
    recorded_env,
    requested,
    resolve_build,
    settings_record,
    start,
    table_texts,
    views,
)
from qola.store import fastpath
from qola.store.fastpath import RecordedEnv

if TYPE_CHECKING:
    from qola.compile.extras import ModuleExtra
    from qola.compile.steps import ModuleResult, ModuleSources
    from qola.core.proc import ChildEnv
    from qola.plan.model import Plan
    from qola.plan.variants import GenEnv
    from qola.store.key import BuildKey, Material
    from qola.toolchain import Toolchain
    from qola.toolchain.env import ToolchainEnv

__all__ = ["BuildReport", "BuildSpec", "Reporter", "build", "build_key", "plan"]
SHOW_PROGRESS_AFTER = 1.0  # seconds: the incremental path shows ninja's progress once it runs this long


def plan(spec: BuildSpec, *, with_settings: bool = False) -> Prepared:
    """The whole plan (``qola plan``): stages 1-3 of :func:`build`; ``with_settings``: and the
    build's settings as requested (:func:`qola.pipeline.spec.requested`, ``qola plan --json``)."""
    env = spec.environ()
    prepared = prepare(spec, env)
    asked = requested(spec, prepared.manifest, env) if with_settings else None
    return dataclasses.replace(prepared, plan=resolve(prepared, env), settings=asked)


def resolve(prepared: Prepared, env: GenEnv) -> Plan:
    """Stages 2 and 3: the declared variants' generator filters and the JIT split, in the plan."""
    from qola.hooks import jit as jitbuild  # lazy: start-up of the CLI and of the no-op path
    from qola.plan import variants  # lazy: start-up of the CLI and of the no-op path
    from qola.store.usage import apply as usage  # lazy: start-up of the CLI and of the no-op path

    plan_ = variants.apply(prepared.plan, prepared.manifest, env)  # 2. variants
    plan_ = jitbuild.plan_jit(plan_, prepared.manifest, env)  # 3. JIT plan
    return usage.apply(plan_, prepared.manifest, env)  # [usage]: exactly these variants ahead


def build(spec: BuildSpec, reporter: Reporter | None = None) -> BuildReport:
    """Build ``spec`` into its output dir (see the module's docstring for the stages). Raises
    QolaError for what the user must fix (exit 2); a module that fails to build is in the report
    (exit 1), and nothing of it is published."""
    ui = reporter or Reporter()
    # 0. before anything is written or run: numbers, directories (never /, never nested in each other
    # or in the tree), then one build per build dir and output dir. The settings are resolved in
    # qola.pipeline.spec: stage 0 here (start), stage 1 after the no-op check (resolve_build); the
    # stages get the typed views they read, never the spec or the environment
    begun = start(spec)
    layout, choice = begun.layout, begun.choice
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
            last = fastpath.load(layout.root, spec.argv) if spec.argv and not spec.dry_run else None
            seen = None if last is None else recorded_env(begun, last["env_keys"])  # what its digest reads
            record = None if last is None or seen is None else fastpath.unchanged(last, layout.root, layout.out, seen)
            if record is not None and seen is not None and record.get("rebuild"):  # the incremental path
                preflight.room(layout.out, layout.root)
                asked = settings_record(begun.asked, seen, record["env_keys"])
                done = _incremental(layout, record, seen, begun.child, asked, spec.verbose, spec.publish_to, ui)
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
    :func:`qola.pipeline.spec.start` decides). Returns notes."""
    from qola.checkout.request import Asked, request  # lazy: start-up of the CLI and of the no-op path
    from qola.checkout.sync import ensure  # lazy: start-up of the CLI and of the no-op path
    from qola.plan import manifest as manifest_mod  # lazy: start-up of the CLI and of the no-op path

    req = request(
        begun.choice.path,
        manifest_mod.load(spec.manifest),
        begun.env,
        Asked(commit=spec.aiter_commit, patches_dir=spec.patches_dir, url=spec.aiter_url, force=spec.force_checkout),
    )
    result = ensure(req)
    return result.notes if result.changed else []


def _incremental(
    layout: BuildLayout,
    record: Mapping,
    env: RecordedEnv,
    child: ChildEnv,
    asked: Mapping[str, Any],
    verbose: bool,
    publish_to: str | None,
    ui: Reporter,
) -> BuildReport | None:
    """Nothing stages 1-8 read changed since the last successful build (``record``; ``env``: the
    variables it names): run ninja on its graph under ``child`` (up to date when ninja has nothing to
    do), audit the libraries it relinked, publish (``asked``: manifest.json's ``build``), record.
    None: no usable recipe (the full path then runs)."""
    from qola.compile import (
        dist,  # lazy: light
        ninja,  # lazy: light
        rebuild,  # lazy: light
    )
    from qola.store.key import Material  # lazy: start-up of the CLI and of the no-op path

    start = time.perf_counter()
    try:
        run = rebuild.Run.of(record["rebuild"])
        material = Material.of(record["key"])
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    mark = ninja.log_length(layout.root)
    with contextlib.ExitStack() as shown:

        def status(done: int, total: int, text: str) -> None:
            # a progress display only for work that lasts (a one-edge rebuild needs none)
            if not shown_yet and time.perf_counter() - start > SHOW_PROGRESS_AFTER:
                shown_yet.append(shown.enter_context(ui.running(False)))
            ui.status(done, total, text)

        shown_yet: list = []
        notes: list[str] = []
        with dist.watched(run.launcher, child.plus(run.env), notes):
            outcome = ninja.run(
                layout.root,
                jobs=run.jobs,
                env=child.plus(run.env),
                owner=run.owner,
                targets=run.targets,
                verbose=verbose,
                on_status=status,
            )
    if outcome.returncode == 0 and any(line.startswith("ninja: no work to do") for line in outcome.log):
        return BuildReport(layout)
    recipe = rebuild.load(layout.root)
    if recipe is None:
        return None
    from qola.compile.steps import CompileReport, settle  # lazy: start-up of the CLI and of the no-op path
    from qola.hooks import isolation  # lazy: start-up of the CLI and of the no-op path

    plan_, tc = recipe.typed()
    results = {r.name: r for r in recipe.results(run)}
    seconds: dict[str, float] = {}
    for out, secs in ninja.compile_times(layout.root, mark).items():
        if (mod := run.owner(out)) is not None:
            seconds[mod] = seconds.get(mod, 0.0) + secs
    settle(results, outcome, {m: a for a, m in run.artifacts.items()}, seconds, layout.root, owner=run.owner)
    compiled = CompileReport(
        plan_, tc, list(results.values()), layout.root, time.perf_counter() - start, outcome.log, notes
    )
    isolation.audit(compiled, plan_, only=run.changed(layout.root))  # 10. audit what ninja relinked
    key = material.key()  # the tree's files rehashed: ninja rebuilt what some of them changed
    published = finish.publish_out(compiled, plan_, tc, layout, {}, key, asked)  # 11. publish
    if compiled.ok:  # 12. record (the recipe stays: nothing it holds changed)
        fastpath.rerecord(
            layout.root, layout.out, {**record, "rebuild": run.after(compiled, layout.root).to_json()}, env
        )
    else:
        fastpath.forget(layout.root)
    return BuildReport(layout, compiled, published, key=key.key, packaged=finish.store(publish_to, layout, compiled))


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
    if tc.version_check and tc.version_check.get("message"):
        ui.warning(tc.version_check["message"])
    material = None if s.dry_run else _material(prepared, plan_, tc, s.isolate, r.inputs, r.table)
    key = None if material is None else material.key()
    return Ready(r, plan_, tc, material, key)


def _full(spec: BuildSpec, ready: Ready, ui: Reporter) -> BuildReport:
    """Stages 6-12: generate, hooks, write, ninja, audit, publish, record."""
    from qola.compile import (
        dist,  # lazy: start-up of the CLI and of the no-op path
        rebuild,  # lazy: start-up of the CLI and of the no-op path
    )
    from qola.compile import extras as extras_mod  # lazy: start-up of the CLI and of the no-op path
    from qola.compile import steps as stages  # lazy: start-up of the CLI and of the no-op path
    from qola.hooks import isolation  # lazy: start-up of the CLI and of the no-op path
    from qola.hooks import jit as jitbuild  # lazy: start-up of the CLI and of the no-op path
    from qola.toolchain.identity import COMPILER_ENV  # lazy: start-up of the CLI and of the no-op path

    r, plan_, tc, material, key = ready.resolved, ready.plan, ready.toolchain, ready.material, ready.key
    s, layout = r.settings, _layout(r.settings)
    tenv, child = _views(s)
    farm = f" (farm: {s.farm.servers} server(s), {s.farm.cpus} CPUs at {s.farm.scheduler})" if s.farm else ""
    rx = None
    if s.remote is not None:  # the service answers and has this compiler before anything is generated
        from qola.store import remote  # lazy: start-up of the CLI and of the no-op path

        remote_env = r.inputs.only(("PATH", *COMPILER_ENV))  # what it reads: trexe on PATH, the compilers' variables
        use = remote.RemoteUse(fallback=spec.remote_fallback, dry_run=s.dry_run)
        rx = remote.prepare(s.remote, tc, layout.root, plan_.tree_root, remote_env, use)
        farm = rx.header()
    ui.info(
        f"qola: {len(plan_.modules)} module(s), {tc.kind} {tc.version} ({tc.compiler}), "
        f"archs {', '.join(plan_.archs)}, -j {s.jobs}{farm}, build dir {layout.root}"
    )
    with ui.running(s.dry_run):
        start = time.perf_counter()
        layout.root.mkdir(parents=True, exist_ok=True)
        write_if_changed(layout.git_ignore, GIT_IGNORE)  # git status of the checkout around it never shows it
        results = stages.new_results(plan_)
        notes: list[str] = []
        if any(m.generators for m in plan_.modules):
            ui.phase("generating")
        generated = stages.generate(
            plan_,
            tc,
            layout,
            jobs=s.jobs,
            env=tenv,
            timeout=s.generator_env,
            results=results,
            notes=notes,
            on_event=ui.event,
        )  # 6. generate
        srcs = stages.sources(plan_, generated, results, layout)
        extras = _hooks(plan_, tc, layout, srcs, results, tenv, s.isolate, key.key if key else "")  # 7. hooks
        extras_mod.write(extras, isolation.shared_files(plan_, layout))  # 8. write
        srcs = {name: src for name, src in srcs.items() if name in extras}
        logs = {name: list(r.log) for name, r in results.items()}  # before ninja: the incremental path's start
        graph = stages.graph_for(
            plan_,
            tc,
            layout,
            srcs,
            extras,
            launcher=rx.launcher if rx else s.launcher,
            rules={**isolation.RULES, **jitbuild.rules(tc)},
        )
        seen: list[str] = []  # what sccache did, when it is the launcher
        ui.phase("compiling")
        status = ui.status if rx is None else rx.tally.status(ui.status)
        with dist.watched(s.launcher, child.plus(tc.child_env), seen, farm_=s.farm, enabled=not s.dry_run):
            compiled = stages.compile_graph(
                plan_,
                tc,
                layout,
                graph,
                results,
                jobs=s.jobs,
                env=child,
                stamp_env=r.inputs.only(("PATH", *COMPILER_ENV)),
                dry_run=s.dry_run,
                verbose=s.verbose,
                on_status=status,
                notes=notes,
                start=start,
            )  # 9. run_build
        compiled.notes += seen
        if rx is not None and not s.dry_run:
            compiled.notes.append(rx.tally.update().describe(rx.endpoint.url))
    if s.dry_run:
        return BuildReport(layout, compiled, dry_run=True)
    assert key is not None  # computed for every build that is not a dry run
    isolation.audit(compiled, plan_)  # 10. audit
    published = finish.publish_out(compiled, plan_, tc, layout, extras, key, r.record)  # 11. publish
    if compiled.ok and spec.argv:  # 12. record
        recipe = (
            rebuild.of(compiled, plan_, tc, s.jobs, logs, layout.root, s.launcher) if rebuild.eligible(extras) else None
        )
        finish.remember(
            spec.argv,
            spec.manifest,
            spec.usage_files,
            r,
            plan_,
            tc,
            extras,
            *(recipe or (None, None)),
            material=material,
        )
    return BuildReport(
        layout, compiled, published, key=key.key, packaged=finish.store(spec.publish_to, layout, compiled)
    )


def _views(s: Settings) -> tuple[ToolchainEnv, ChildEnv]:
    """The toolchain's view and the children's environment the settings resolved."""
    return s.toolchain_env, s.child


def build_key(spec: BuildSpec) -> BuildKey:
    """The build key of ``spec`` (``qola plan --key``): stages 1-5 of :func:`build`, no output dir;
    the compiler probes run in a temporary dir."""
    from qola.core.fsutil import pid_tempdir  # lazy: start-up of the CLI and of the no-op path

    env = spec.environ()
    prepared = prepare(spec, env)
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
    table: tuple[list[str], list[str]] | None = None,
) -> Material:
    from qola.store import key as buildkey  # lazy: start-up of the CLI and of the no-op path

    files, texts = table or table_texts(prepared.tree)
    inputs = env if isinstance(env, RecordedEnv) else RecordedEnv.of(env, fastpath.env_keys_of(texts))
    return buildkey.material(
        prepared.manifest, plan_, tc, inputs, isolate=isolate, table=buildkey.TableRead(files, texts)
    )


def _layout(s: Settings) -> BuildLayout:
    assert s.layout is not None  # a build's settings have one (only planning's have none)
    return s.layout


def _toolchain(plan_: Plan, manifest, s: Settings) -> Toolchain:
    """The compilers for the plan's archs, probed (their flag probes cached in the build dir). A dry
    run with HIP plans with AITER's flags for the manifest's ROCm version, unprobed."""
    from qola.toolchain import ToolchainChoice, find_toolchain  # lazy: start-up of the CLI and of the no-op path

    hip = plan_.vendor == "hip"
    versions = manifest.qola.rocm_versions if hip else manifest.qola.cuda_versions
    assume = None
    tenv = s.toolchain_env  # only what the toolchain reads, and its children's environment
    if s.dry_run and hip:
        assume = (versions or [None])[0] or hip_version(tenv, manifest) or "7.0"
    return find_toolchain(
        plan_.archs,
        env=tenv,
        accepted_versions=versions,
        cache_dir=_layout(s).probes,
        choice=ToolchainChoice(assume_version=assume, drop_hip_flags=manifest.build.drop_hip_flags if hip else ()),
    )


def _hooks(
    plan_: Plan,
    tc: Toolchain,
    layout: BuildLayout,
    srcs: Mapping[str, ModuleSources],
    results: dict[str, ModuleResult],
    env: ToolchainEnv,
    isolate: bool,
    build_key: str = "",
) -> dict[str, ModuleExtra]:
    """Each buildable module's extra: the JIT's (deferred instances), then isolation's and
    embedding's. A hook's QolaError fails its module only. ``build_key`` goes into JIT tables
    (usage records name it)."""
    from qola.compile.steps import fail  # lazy: start-up of the CLI and of the no-op path
    from qola.core.errors import QolaError  # lazy: start-up of the CLI and of the no-op path
    from qola.hooks import isolation  # lazy: start-up of the CLI and of the no-op path
    from qola.hooks import jit as jitbuild  # lazy: start-up of the CLI and of the no-op path
    from qola.output import kernels  # lazy: start-up of the CLI and of the no-op path

    compiler = jitbuild.compiler_of(plan_, tc, env)
    out: dict[str, ModuleExtra] = {}
    for mod in plan_.modules:
        if mod.name not in srcs:
            continue
        r = results[mod.name]
        try:
            jit = jitbuild.extra(mod, srcs[mod.name].generated, plan_, tc, layout, compiler, build_key)
            more = jit.then(
                isolation.extra(
                    mod, srcs[mod.name].all, jit, plan_, layout, isolate=isolate, discard_locals=tc.discard_locals
                )
            )
            more = more.then(kernels.extra(mod, layout.obj_dir(mod.name)))  # the switch record (qola.output.kernels)
        except QolaError as exc:
            fail(r, exc)
            continue
        r.warnings += more.warnings
        r.log += [f"warning: {w}" for w in more.warnings]
        out[mod.name] = more
    return out
