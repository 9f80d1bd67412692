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
import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qola.compile.layout import BuildLayout
from qola.core import lock
from qola.output import outdir
from qola.output.outdir import OUT_NAMES, OUT_PREFIXES
from qola.pipeline import preflight
from qola.pipeline.report import BuildReport, Reporter
from qola.pipeline.spec import (
    BuildSpec,
    Prepared,
    Settings,
    hip_version,
    prepare,
    requested,
    settings,
    settings_record,
    start,
    tree_root,
)
from qola.store import fastpath

if TYPE_CHECKING:
    from qola.compile.extras import ModuleExtra
    from qola.compile.rebuild import Recipe, Run
    from qola.compile.steps import CompileReport, ModuleResult, ModuleSources
    from qola.plan.model import Plan
    from qola.plan.variants import GenEnv
    from qola.store.key import BuildKey, Material
    from qola.store.prebuilt import Packaged
    from qola.toolchain import Toolchain

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
    # or in the tree), then one build per build dir and output dir
    begun = start(spec)
    env, layout, choice = begun.env, begun.layout, begun.choice
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
    with lock.acquire(locks, ["qola", *spec.argv], wait=spec.wait):
        for note in _checkout(spec, choice, env):  # the tree first: the no-op fast path then sees its files
            ui.note(note)
        record = fastpath.unchanged(layout.root, layout.out, spec.argv, env) if spec.argv and not spec.dry_run else None
        if record is not None and record.get("rebuild"):  # the incremental path (None: no usable recipe)
            preflight.room(layout.out, layout.root)
            done = _incremental(spec, layout, env, ui, record)
            if done is not None:
                return done
        elif record is not None and _nothing_to_do(layout):  # the no-op path
            return BuildReport(layout)
        if not spec.dry_run:
            preflight.room(layout.out, layout.root)
        ready = _prepare(spec, layout, env, ui)  # stages 1-5
        if ready.key is not None and spec.prebuilt:  # the --prebuilt path (None: no archive of this key)
            done = _prebuilt(spec.prebuilt, layout, ready.key, ready.plan.namespace, ui)
            if done is not None:
                return done
        return _full(spec, ready, ui)  # the full path: stages 6-12


def _nothing_to_do(layout: BuildLayout) -> bool:
    """The no-op path's second question (its digest held): whether ninja has any dirty edge."""
    from ninja import BIN_DIR  # lazy: light: the package's __init__

    return fastpath.nothing_to_do(layout.root, os.path.join(BIN_DIR, "ninja"))


def _checkout(spec: BuildSpec, choice, env: Mapping[str, str]) -> list[str]:
    """Check the tree out when the build should (QoLA's ``build`` without ``--skip-checkout``): qola's
    default checkout always; a tree the user named only when ``--aiter-commit`` or ``--patches-dir``
    asks for it; a tree named by QOLA_/NVTE_AITER_SOURCE_DIR never. Returns notes."""
    if spec.skip_checkout or choice.from_env or spec.dry_run:
        return []
    if not (choice.managed or spec.aiter_commit or spec.patches_dir):
        return []
    from qola.checkout.request import request  # lazy: start-up of the CLI and of the no-op path
    from qola.checkout.sync import ensure  # lazy: start-up of the CLI and of the no-op path
    from qola.plan import manifest as manifest_mod  # lazy: start-up of the CLI and of the no-op path

    req = request(
        choice.path,
        manifest_mod.load(spec.manifest),
        env,
        commit=spec.aiter_commit,
        patches_dir=spec.patches_dir,
        url=spec.aiter_url,
        force=spec.force_checkout,
    )
    result = ensure(req)
    return result.notes if result.changed else []


def _incremental(
    spec: BuildSpec, layout: BuildLayout, env: dict[str, str], ui: Reporter, record: Mapping
) -> BuildReport | None:
    """Nothing stages 1-8 read changed since the last successful build (``record``): run ninja on
    its graph (up to date when ninja has nothing to do), audit the libraries it relinked, publish,
    record. None: no usable recipe (the full path then runs)."""
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
        with dist.watched(run.launcher, {**env, **run.env}, notes):
            outcome = ninja.run(
                layout.root,
                jobs=run.jobs,
                env={**env, **run.env},
                owner=run.owner,
                targets=run.targets,
                verbose=spec.verbose,
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
    published = _publish(
        compiled, plan_, tc, layout, {}, key, settings_record(spec, env, record["env_keys"])
    )  # 11. publish
    if compiled.ok:  # 12. record (the recipe stays: nothing it holds changed)
        fastpath.rerecord(
            layout.root, layout.out, {**record, "rebuild": run.after(compiled, layout.root).to_json()}, env
        )
    else:
        fastpath.forget(layout.root)
    return BuildReport(layout, compiled, published, key=key.key, packaged=_store(spec, layout, compiled))


@dataclass(frozen=True)
class Ready:
    """What stages 1-5 decided, for the --prebuilt and the full path."""

    prepared: Prepared
    settings: Settings
    plan: Plan  # with the variants' filters and the JIT split
    toolchain: Toolchain
    table: tuple[list[str], list[str]]  # the module table's and core.py's texts (:func:`_table_texts`)
    material: Material | None  # None: a dry run (no key)
    key: BuildKey | None


def _prepare(spec: BuildSpec, layout: BuildLayout, env: dict[str, str], ui: Reporter) -> Ready:
    """Stages 1-5: manifest, tree and plan; settings; variants and the JIT split; the output dir
    refused or cleaned; the toolchain; the build key."""
    from qola.output.publish import prepare as prepare_output  # lazy: start-up of the CLI and of the no-op path

    fastpath.forget(layout.root)
    prepared = prepare(spec, env)  # 1. prepare
    manifest = prepared.manifest
    s = settings(spec, manifest, layout, env, prepared.plan.vendor)
    for note in s.notes:
        ui.note(note)
    preflight.tree_placement(prepared.tree.root, layout.out, layout.root, OUT_NAMES, OUT_PREFIXES)
    plan_ = resolve(prepared, s.generator_env or s.env)  # 2. variants, 3. JIT plan (from here on, the settings')
    for w in plan_.warnings:
        ui.warning(w)
    if not s.dry_run:  # 4. output dir: refused or cleaned before anything compiles
        for note in prepare_output(layout.out, layout.root):
            ui.note(note)
    tc = _toolchain(plan_, manifest, s)  # 5. toolchain
    if tc.version_check and tc.version_check.get("message"):
        ui.warning(tc.version_check["message"])
    table = _table_texts(prepared)  # the module table and core.py: what the key, manifest.json and the record read
    material = None if s.dry_run else _material(prepared, plan_, tc, s.isolate, s.env, table)
    key = None if material is None else material.key()
    return Ready(prepared, s, plan_, tc, table, material, key)


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

    prepared, s, plan_, tc, table, material, key = (
        ready.prepared,
        ready.settings,
        ready.plan,
        ready.toolchain,
        ready.table,
        ready.material,
        ready.key,
    )
    layout, env = _layout(s), s.env
    farm = f" (farm: {s.farm.servers} server(s), {s.farm.cpus} CPUs at {s.farm.scheduler})" if s.farm else ""
    rx = None
    if s.remote is not None:  # the service answers and has this compiler before anything is generated
        from qola.store import remote  # lazy: start-up of the CLI and of the no-op path

        rx = remote.prepare(
            s.remote, tc, layout.root, plan_.tree_root, env, fallback=spec.remote_fallback, dry_run=s.dry_run
        )
        farm = rx.header()
    ui.info(
        f"qola: {len(plan_.modules)} module(s), {tc.kind} {tc.version} ({tc.compiler}), "
        f"archs {', '.join(plan_.archs)}, -j {s.jobs}{farm}, build dir {layout.root}"
    )
    with ui.running(s.dry_run):
        start = time.perf_counter()
        layout.root.mkdir(parents=True, exist_ok=True)
        results = stages.new_results(plan_)
        notes: list[str] = []
        generated = stages.generate(
            plan_, tc, layout, jobs=s.jobs, env=env, results=results, notes=notes, on_event=ui.event
        )  # 6. generate
        srcs = stages.sources(plan_, generated, results, layout)
        extras = _hooks(plan_, tc, layout, srcs, results, s, key.key if key else "")  # 7. hooks
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
        status = ui.status if rx is None else rx.tally.status(ui.status)
        child = s.child.plus(tc.child_env) if s.child is not None else {**env, **tc.child_env}
        with dist.watched(s.launcher, child, seen, farm_=s.farm, enabled=not s.dry_run):
            compiled = stages.compile_graph(
                plan_,
                tc,
                layout,
                graph,
                results,
                jobs=s.jobs,
                env=env,
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
    published = _publish(
        compiled, plan_, tc, layout, extras, key, settings_record(spec, env, fastpath.env_keys_of(table[1]))
    )  # 11. publish
    if compiled.ok and spec.argv:  # 12. record
        recipe = (
            rebuild.of(compiled, plan_, tc, s.jobs, logs, layout.root, s.launcher) if rebuild.eligible(extras) else None
        )
        _remember(spec, prepared, plan_, tc, s, extras, *(recipe or (None, None)), table=table, material=material)
    return BuildReport(layout, compiled, published, key=key.key, packaged=_store(spec, layout, compiled))


def build_key(spec: BuildSpec) -> BuildKey:
    """The build key of ``spec`` (``qola plan --key``): stages 1-5 of :func:`build`, no output dir;
    the compiler probes run in a temporary dir."""
    from qola.core.fsutil import pid_tempdir  # lazy: start-up of the CLI and of the no-op path

    env = spec.environ()
    prepared = prepare(spec, env)
    plan_ = resolve(prepared, env)
    with pid_tempdir("qola-key-") as tmp:
        s = Settings(
            layout=BuildLayout(Path(tmp), Path(tmp) / "out"),
            jobs=1,
            launcher=None,
            dry_run=False,
            verbose=False,
            isolate=spec.isolate,
            env=env,
        )
        tc = _toolchain(plan_, prepared.manifest, s)
    return _material(prepared, plan_, tc, spec.isolate, env).key()


def _table_texts(prepared: Prepared) -> tuple[list[str], list[str]]:
    """(the module table and core.py, the texts of those that could be read)."""
    files = [str(prepared.tree.table_path), str(prepared.tree.core_path)]
    texts = []
    for f in files:
        try:
            texts.append(Path(f).read_text())
        except OSError:
            pass
    return files, texts


def _material(
    prepared: Prepared,
    plan_: Plan,
    tc: Toolchain,
    isolate: bool,
    env: Mapping[str, str],
    table: tuple[list[str], list[str]] | None = None,
) -> Material:
    from qola.store import key as buildkey  # lazy: start-up of the CLI and of the no-op path

    files, texts = table or _table_texts(prepared)
    return buildkey.material(prepared.manifest, plan_, tc, env, isolate=isolate, table_files=files, table_texts=texts)


def _prebuilt(source: str, layout: BuildLayout, key: BuildKey, namespace: str, ui: Reporter) -> BuildReport | None:
    """``--prebuilt``: the archive of ``key`` installed as a new version of OUT (None: there is none;
    the build goes on). OUT already holding that key is up to date."""
    from qola.output.publish import MANIFEST_JSON  # lazy: start-up of the CLI and of the no-op path
    from qola.store import prebuilt  # lazy: start-up of the CLI and of the no-op path
    from qola.store.key import recorded_key  # lazy: start-up of the CLI and of the no-op path

    try:  # prepare() completed any half-switched publish; this build holds OUT's lock
        held = recorded_key(json.loads((layout.out / MANIFEST_JSON).read_text()))
    except (OSError, ValueError, AttributeError):
        held = None
    if held == key.key:
        ui.note(f"{layout.out} already holds build key {key.key[:16]}…")
        return BuildReport(layout, key=key.key)
    try:
        installed = prebuilt.install(source, namespace, key.key, layout.out, layout.root)
    except prebuilt.Missing as exc:
        ui.note(f"no prebuilt archive for build key {key.key[:16]}… ({exc}): building")
        return None
    return BuildReport(layout, manifest_json=layout.out / MANIFEST_JSON, key=key.key, prebuilt=installed)


def _store(spec: BuildSpec, layout: BuildLayout, compiled: CompileReport) -> Packaged | None:
    """``--publish DIR``: the finished output packaged into DIR (only a build where every module built)."""
    if not spec.publish_to or not compiled.ok:
        return None
    from qola.store import prebuilt  # lazy: start-up of the CLI and of the no-op path

    return prebuilt.package(layout.out, Path(spec.publish_to))


def _layout(s: Settings) -> BuildLayout:
    assert s.layout is not None  # a build's settings have one (only planning's have none)
    return s.layout


def _toolchain(plan_: Plan, manifest, s: Settings) -> Toolchain:
    """The compilers for the plan's archs, probed (their flag probes cached in the build dir). A dry
    run with HIP plans with AITER's flags for the manifest's ROCm version, unprobed."""
    from qola.toolchain import find_toolchain  # lazy: start-up of the CLI and of the no-op path
    from qola.toolchain.env import ToolchainEnv  # lazy: start-up of the CLI and of the no-op path

    hip = plan_.vendor == "hip"
    versions = manifest.qola.rocm_versions if hip else manifest.qola.cuda_versions
    assume = None
    if s.dry_run and hip:
        assume = (versions or [None])[0] or hip_version(s.env, manifest) or "7.0"
    return find_toolchain(
        plan_.archs,
        env=s.toolchain_env or ToolchainEnv.of(s.env),  # only what the toolchain reads, and its children's environment
        accepted_versions=versions,
        cache_dir=_layout(s).probes,
        assume_version=assume,
        drop_hip_flags=manifest.build.drop_hip_flags if hip else (),
    )


def _hooks(
    plan_: Plan,
    tc: Toolchain,
    layout: BuildLayout,
    srcs: Mapping[str, ModuleSources],
    results: dict[str, ModuleResult],
    s: Settings,
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

    compiler = jitbuild.compiler_of(plan_, tc, s.env)
    out: dict[str, ModuleExtra] = {}
    for mod in plan_.modules:
        if mod.name not in srcs:
            continue
        r = results[mod.name]
        try:
            jit = jitbuild.extra(mod, srcs[mod.name].generated, plan_, tc, layout, compiler, build_key)
            more = jit.then(
                isolation.extra(
                    mod, srcs[mod.name].all, jit, plan_, layout, isolate=s.isolate, discard_locals=tc.discard_locals
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


def _publish(
    compiled: CompileReport,
    plan_: Plan,
    tc: Toolchain,
    layout: BuildLayout,
    extras: Mapping[str, ModuleExtra],
    key: BuildKey,
    settings: Mapping[str, Any],
) -> Path:
    from qola.hooks import isolation  # lazy: start-up of the CLI and of the no-op path
    from qola.hooks import jit as jitbuild  # lazy: start-up of the CLI and of the no-op path
    from qola.output.publish import publish  # lazy: start-up of the CLI and of the no-op path

    trees, records = jitbuild.publish_items(compiled, extras, layout)
    built_headers, withdrawn = isolation.module_headers(compiled, plan_, layout)
    return publish(
        compiled,
        layout.out,
        headers=[*isolation.headers(plan_, layout), *built_headers],
        withdrawn=withdrawn,
        mode=plan_.mode,
        texts=isolation.consumers(compiled, plan_, tc),
        trees=trees,
        module_extra=records,
        source_date_epoch=(settings.get("env") or {}).get("SOURCE_DATE_EPOCH"),
        extra={
            "build_key": key.key,
            "build_key_parts": key.digests,
            "build": settings,
            "pin": plan_.pin,
            "version_check": tc.version_check,
        },
    )


def _remember(
    spec: BuildSpec,
    prepared: Prepared,
    plan_: Plan,
    tc: Toolchain,
    s: Settings,
    extras: Mapping[str, ModuleExtra],
    recipe: Recipe | None,
    run: Run | None,
    *,
    table: tuple[list[str], list[str]],
    material: Material | None = None,
) -> None:
    """Record what this (successful) build was derived from, for the next no-op, and (``recipe``,
    ``run``) what the incremental path needs. The manifest and tree paths as the command line (or manifest)
    named them: symlinks re-pointed to another manifest or tree are noticed."""
    from qola.compile import (
        codegen,  # lazy: start-up of the CLI and of the no-op path
        rebuild,  # lazy: start-up of the CLI and of the no-op path
    )
    from qola.compile.layout import gen_module_dir  # lazy: start-up of the CLI and of the no-op path
    from qola.hooks import isolation  # lazy: start-up of the CLI and of the no-op path

    tree, env = prepared.tree, s.env
    given = [spec.manifest, str(tree_root(spec, prepared.manifest))]
    tree_files, texts = table
    dirs = {str(Path(src).parent) for m in plan_.modules for src in m.sources}
    dirs |= {d for m in plan_.modules for d in m.include_dirs}
    if any(m.embed for m in plan_.modules):
        dirs.add(str(tree.hsa))
    scripts = [g.script for m in plan_.modules for g in m.generators]
    # the tuned-config CSVs generators read: merged configs' sources, files named in their commands,
    # and the tree's configs dir (a new per-model CSV joins a merge)
    data = [f for m in plan_.modules for c in m.configs for f in (*c.sources, c.untuned) if f]
    data += [
        a for m in plan_.modules for g in m.generators for a in g.argv[1:] if os.path.isabs(a) and os.path.isfile(a)
    ]
    data += [f for m in plan_.modules if m.api is not None for f in m.api.reads]  # the API read from the tree
    usage = prepared.manifest.usage  # the usage fragments ([usage] files, --usage): their variants are the set
    data += [str(prepared.manifest.base_dir / f) for f in (usage.files if usage else [])] + list(spec.usage_files)
    tools = [tc.compiler, tc.host_cxx, s.launcher]
    layout = _layout(s)
    # what stages 6-8 wrote and read back: the generated dirs (listings and stamps), the graph's own
    # files, the embedded code objects (their bytes decide the embed index)
    gen = [m.name for m in plan_.modules if m.generators]
    written = [
        str(layout.graph),
        str(layout.toolchain_stamp),
        *(str(w.path) for w in isolation.shared_files(plan_, layout)),
        *(str(w.path) for e in extras.values() for w in e.writes),
        *(str(gen_module_dir(layout.gen_root, name) / codegen.STAMP) for name in gen),
    ]
    embedded = [str(Path(plan_.meta_dir) / "hsa" / a / t) for m in plan_.modules for a in plan_.archs for t in m.embed]
    rebuild.save(layout.root, recipe)
    if recipe is not None:
        written.append(str(layout.root / rebuild.RECIPE))
    files = fastpath.input_files(
        manifest=prepared.manifest.path,
        tree_files=tree_files,
        dirs=sorted(dirs),
        generator_scripts=scripts,
        tools=tools,
        data=data,
        data_dirs=[str(tree.root / "aiter" / "configs"), *embedded],
        listed_dirs=[str(layout.blob(name)) for name in gen],
        written=written,
    )
    resolved = [os.path.abspath(p) for p in [*given, *(t for t in tools if t)]]
    fastpath.record(
        layout.root,
        layout.out,
        list(spec.argv),
        env,
        fastpath.env_keys_of(texts),
        files,
        resolved,
        rebuild=None if run is None else run.to_json(),
        key=None if material is None else material.to_json(),
    )
