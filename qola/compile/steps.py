"""The build dir's stages: generated sources → each module's source list → one ninja graph →
objects and libraries. :mod:`qola.pipeline.run` calls them in order (with the hooks' extras between
the source lists and the graph).

Publishing into the output dir is :mod:`qola.output.publish`'s job; nothing here writes there.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import sys
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from qola.compile import devicecode, hostonly, includes, ninja, passes
from qola.compile.devicecode import Writer
from qola.compile.devicescan import DeviceScan
from qola.compile.extras import ModuleExtra
from qola.compile.layout import BuildLayout, object_path
from qola.compile.overlay import Readers
from qola.compile.pathmap import PathMap, unit_id
from qola.compile.pyext import pybind11_flags, torch_flags
from qola.compile.results import (
    CompileReport,
    ModuleResult,
    Ran,
    Results,
    Status,
    empty_objects,
    forget_stubs,
    settle,
    stub_notes,
)
from qola.core.errors import QolaError
from qola.core.proc import ChildEnv
from qola.plan import genrules, needs
from qola.plan.model import ModulePlan, Plan
from qola.plan.tree.files import read_small
from qola.plan.variants import GeneratorEnv
from qola.toolchain import Toolchain, identity
from qola.toolchain.env import ToolchainEnv
from qola.toolchain.hipconfig import generator_child


@dataclass(frozen=True)
class ModuleSources:
    """A module's source list: the table's (after the manifest's edits) and its generators' files."""

    own: tuple[str, ...]
    generated: tuple[str, ...]
    groups: tuple[tuple[str, ...], ...] = ()  # the generated files by the generator that wrote them (() = one group)
    host_only: tuple[str, ...] = ()  # generated files with no kernel (qola.compile.devicecode): no device pass
    writers: tuple[Writer, ...] = ()  # the generator of each group (() = not known: every file every arch)

    @property
    def all(self) -> tuple[str, ...]:
        return self.own + self.generated


@dataclass(frozen=True)
class Generated:
    """What a module's generators wrote: every file, each generator's files and who wrote each
    group (() = not known)."""

    files: tuple[str, ...]
    groups: tuple[tuple[str, ...], ...] = ()
    writers: tuple[Writer, ...] = ()


def _split(flags: tuple[str, ...] | list[str]) -> list[str]:
    """AITER writes '-mllvm --x=1' as one entry; compilers want two words."""
    out: list[str] = []
    for f in flags:
        out += shlex.split(f)
    return out


def module_flags(mod: ModulePlan, tc: Toolchain, blob_dir: Path, include_dir: Path) -> list[str]:
    flags = tc.device_flags()
    flags += [f"-I{d}" for d in (*mod.include_dirs, str(blob_dir), str(include_dir))]
    if tc.kind == "hip":  # AITER compiles HIP sources with its C++ flags first (cpp_extension: cflags + …)
        flags += _split(mod.flags_extra_cc)
    flags += _split(mod.flags_extra_hip)
    if mod.is_python_module:
        flags += pybind11_flags(mod.md_name, mod.table_md_name).cflags
        if not mod.torch_exclude:
            flags += torch_flags(tc.kind).cflags
    return flags


def unit_flags(tc: Toolchain, paths: PathMap, module: str, src: str) -> list[str]:
    """The flags naming ``src`` to the compiler by its path with the tree and build dir mapped
    (:mod:`qola.compile.pathmap`), not by where those lie."""
    name = paths.name(src)
    return tc.unit_flags_for(name, unit_id(module, name))


def module_ldflags(mod: ModulePlan, tc: Toolchain) -> list[str]:
    flags = _split(mod.extra_ldflags)
    if mod.is_python_module and not mod.torch_exclude:
        flags += torch_flags(tc.kind).ldflags
    return flags


@dataclass(frozen=True)
class Stage:
    """What every stage after planning works on: the plan, its toolchain and the build dir."""

    plan: Plan
    tc: Toolchain
    layout: BuildLayout
    readers: Readers | None = None  # which units of the modules qola's fixes moved read a fixed file
    scan: DeviceScan = field(init=False, compare=False)  # CUDA: which units hold device code

    def __post_init__(self) -> None:
        roots = (self.plan.tree_root, self.plan.meta_dir, str(self.layout.root))
        object.__setattr__(self, "scan", DeviceScan(tuple(os.path.realpath(r) for r in roots)))


@dataclass(frozen=True)
class Generation:
    """What :func:`generate` returns: module -> its generated files (and each generator's), every
    module's result (those whose generators ran or failed updated), the build-wide notes."""

    files: dict[str, Generated]
    results: dict[str, ModuleResult]
    notes: tuple[str, ...] = ()


def generate(
    stage: Stage,
    results: Results,
    *,
    jobs: int,
    env: Mapping[str, str] | ToolchainEnv,
    timeout: GeneratorEnv | None = None,
    on_event: Callable[[str], None] = lambda s: None,
) -> Generation:
    """Run every module's generators (with the plan's filters) in parallel. A failure fails its
    module. ``env``: the toolchain's view (they run under its children's environment, hipconfig
    found on its PATH); ``timeout``: the generators' view, for ``QOLA_GENERATOR_TIMEOUT`` (both
    resolved from ``env`` when it is a mapping)."""
    from qola.compile.codegen import GenJob, GenResult, run_generators  # lazy: the incremental path needs none of it

    plan, layout = stage.plan, stage.layout
    given = genrules.aiter_env(plan.archs, plan.meta_dir)  # what AITER's build exports; in each stamp
    gen_jobs = [
        GenJob(m.name, m.generators, (), m.configs, env=tuple(sorted(given.items())))
        for m in plan.modules
        if m.generators and results[m.name].status != Status.FAILED  # a module failed before: none run
    ]
    if not gen_jobs:
        return Generation({}, dict(results))
    hsa_dir = Path(plan.meta_dir) / "hsa"
    raw = (timeout or GeneratorEnv.of({} if isinstance(env, ToolchainEnv) else env)).timeout_raw
    child, note = generator_child(stage.tc, ToolchainEnv.of(env), given, layout.tools_bin)
    gen_env = GeneratorEnv(child, raw)

    def one(job: GenJob) -> tuple[str, GenResult | QolaError]:
        try:
            return job.module, run_generators(job, layout.gen_root, env=gen_env, python=sys.executable, hsa_dir=hsa_dir)
        except QolaError as exc:
            return job.module, exc
        except OSError as exc:  # the interpreter or the build dir: still this module's failure
            return job.module, QolaError(f"module {job.module}: cannot run its generators: {exc}")

    files: dict[str, Generated] = {}
    gens = {job.module: job.generators for job in gen_jobs}
    out = dict(results)
    with ThreadPoolExecutor(max_workers=max(1, min(jobs, len(gen_jobs)))) as pool:
        for name, res in pool.map(one, gen_jobs):
            if isinstance(res, QolaError):
                out[name] = out[name].failed(res)
                on_event(f"generator failed for {name}")
                continue
            # what its generators printed (head and tail past proc.LOG_KEEP)
            r = out[name].noted(res.warnings, res.output.splitlines())
            out[name] = dataclasses.replace(r, codegen_seconds=res.seconds)
            writers = devicecode.writers(gens[name], res.groups, plan.meta_dir)  # who wrote each group
            files[name] = Generated(res.sources, res.groups, writers)
            on_event(f"{'generated' if not res.skipped else 'up to date'}: {name} ({len(res.sources)} sources)")
    return Generation(files, out, (note,) if note else ())


def sources(
    stage: Stage, generated: Mapping[str, Generated], results: Results
) -> tuple[dict[str, ModuleSources], dict[str, ModuleResult]]:
    """(each buildable module's source list, every module's result: with the counts, instances and
    artifact path). A module without a source fails."""
    out: dict[str, ModuleSources] = {}
    done = dict(results)
    for mod in stage.plan.modules:
        if results[mod.name].status == Status.FAILED:
            continue
        src, done[mod.name] = _sources_of(mod, stage, generated.get(mod.name) or Generated(()), results[mod.name])
        if src is not None:
            out[mod.name] = src
    return out, done


def _sources_of(
    mod: ModulePlan, stage: Stage, made: Generated, r: ModuleResult
) -> tuple[ModuleSources | None, ModuleResult]:
    """(``mod``'s source list, or None: it fails; its result)."""
    gen, groups, writers = made.files, made.groups, made.writers
    candidates = _dispatch_only(mod, gen)
    if unused := _unused_dispatch(mod, gen, candidates):
        gen = tuple(s for s in gen if s not in unused)
        groups = tuple(tuple(s for s in g if s not in unused) for g in groups)
        r = r.noted(
            log=[f"not compiled: {Path(s).name} (a dropped direction's dispatch no source calls)" for s in unused]
        )
    r = dataclasses.replace(
        r, sources=len(mod.sources), generated=len(gen), instances=tuple(sorted(Path(s).stem for s in gen))
    )
    if not mod.sources and not gen:
        return None, dataclasses.replace(
            r, status=Status.FAILED, error="the module has no sources (table srcs empty and no generated files)"
        )
    if mod.gates:  # a source gating its kernels on a registry switch left off (qola.plan.needs)
        flags = [*(mod.flags_extra_cc if stage.plan.vendor == "hip" else ()), *mod.flags_extra_hip]
        off = needs.off_switches(mod.gates, flags, {s: mod.flags_for(s) for s, _ in mod.gates})
        if off:
            every = all(len(names) == len(dict(mod.gates)[src]) for src, names in off)
            return None, r.failed(
                QolaError(
                    needs.off_message(mod.name, off, every),
                    hint="define them to 1 (qola's registry adds -D<NAME>=1 unless the table or the "
                    "manifest defines the switch; remove the manifest's -D<NAME>=0)",
                )
            )
    try:  # names from the table never leave the build dir (checked at plan time too)
        r = dataclasses.replace(r, artifact=stage.layout.artifact(mod.artifact_name))
        stage.layout.obj_dir(mod.name)
    except QolaError as exc:
        return None, r.failed(exc)
    kept = tuple(s for s in candidates if s not in unused)  # they dispatch to no kernel: host code only
    host = tuple(dict.fromkeys((*kept, *devicecode.host_only(groups, writers))))
    return ModuleSources(tuple(mod.sources), gen, groups, host, writers), r


MAX_SCANNED = 64 << 20  # a source read to see whether it calls a dropped direction's dispatch


def _dispatch_only(mod: ModulePlan, generated: tuple[str, ...]) -> dict[str, str]:
    """The dispatch files of ``mod``'s dropped directions (CK writes them alone, with no kernel:
    ``drop_directions``) -> their direction."""
    dropped = {g.direction for g in mod.generators if g.dispatch_only and g.direction}
    stems = {genrules.dispatch_stem(d): d for d in dropped}
    return {s: stems[Path(s).stem] for s in generated if Path(s).stem in stems}


def _unused_dispatch(mod: ModulePlan, generated: tuple[str, ...], candidates: dict[str, str]) -> set[str]:
    """Which of ``candidates`` (:func:`_dispatch_only`) no other source of the library calls
    (:func:`qola.plan.genrules.unused_dispatch`): not compiled. Read: the module's own sources and the
    generated files without an arch suffix (API and dispatch files; a CK kernel file calls no dispatch)."""
    if not candidates:
        return set()
    texts: dict[str, str | None] = {}
    for src in (*mod.sources, *(s for s in generated if genrules.arch_suffix(Path(s).stem) is None)):
        try:
            texts[src] = read_small(src, limit=MAX_SCANNED, what="source").decode("utf-8", "replace")
        except (OSError, QolaError):  # unread: it may call anything (the dispatch stays)
            texts[src] = None
    return genrules.unused_dispatch(candidates, texts)


def _source_archs(src: ModuleSources, archs: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
    """The archs of each file CK's generator wrote, judged among that generator's files
    (:func:`qola.compile.devicecode.source_archs`); every other file (absent) gets every arch."""
    return devicecode.source_archs(src.groups, src.writers, archs)


def graph_for(
    stage: Stage,
    srcs: Mapping[str, ModuleSources],
    extras: Mapping[str, ModuleExtra],
    *,
    launcher: str | None = None,
    rules: Mapping[str, Mapping[str, str]] | None = None,
) -> ninja.Graph:
    """The graph for every module in ``srcs`` (the buildable ones), each compiled and linked as its
    extra says (sources dropped / added, flags, edges, link rule); ``rules`` adds the rules those name.

    HIP: each compile edge names its own device passes (``$archs``, after ``$flags``): a generated file
    the archs it holds device code for (:func:`qola.compile.devicecode.source_archs`: CK's ``…_gfx9`` file
    no gfx950 pass), every other source all the build's archs; the module's flags name none."""
    plan, tc, layout = stage.plan, stage.tc, stage.layout
    variables: dict[str, str] = {}
    targets: list[ninja.Target] = []
    edges: list[ninja.Edge] = []
    paths = PathMap.of(plan.tree_root, layout.root)
    for mod in plan.modules:
        if mod.name not in srcs:
            continue
        more = extras.get(mod.name) or ModuleExtra()
        var = f"flags_{mod.name}"
        variables[var] = ninja.escape_flags(_module_var(mod, stage, more) + tc.prefix_map_flags(paths.compiler_maps))
        tree = stage.readers.tree.get(mod.name) if stage.readers else None
        if tree is not None:  # the units that read no fixed file compile the tree's own paths
            tree_flags = _module_var(tree, stage, more) + tc.prefix_map_flags(paths.compiler_maps)
            variables[var + "_tree"] = ninja.escape_flags(tree_flags)
        target = _target(mod, stage, srcs[mod.name], more, var=var, paths=paths)
        checks = [hostonly.edge(mod.name, c, c.device) for c in target.compiles if c.device is not None]
        edges += (*more.edges, *checks)  # each host-only object proven before the link (qola.compile.hostonly)
        targets.append(dataclasses.replace(target, implicit=target.implicit + tuple(e.out for e in checks)))
    return ninja.Graph(
        rules={**_rules(tc, launcher), **(rules or {})},
        variables=variables,
        targets=tuple(targets),
        extra_edges=tuple(edges),
        priority=_priorities(plan, targets, layout.root),
        stamp=identity.STAMP,
    )


def _rules(tc: Toolchain, launcher: str | None) -> dict[str, Mapping[str, str]]:
    """The compile and link rules of every module (``launcher``: in front of each compile)."""
    cc = passes.compile_line(tc, "$in", "$out", launcher)
    link = tc.shared_link_argv("$out.rsp", "$out", ["$ldflags"])
    return {
        hostonly.RULE_NAME: hostonly.rule(sys.executable, passes.compile_line(tc, "$src", "$obj", launcher)),
        ninja.COMPILE_RULE: {
            "command": ninja.command_template(cc),
            "description": "CC $module $in",
            "depfile": ninja.DEPFILE,
            "deps": "gcc",
        },
        ninja.HOST_RULE: {
            "command": passes.host_only_command(tc, launcher),
            "description": "CC $module $in",
            "depfile": ninja.DEPFILE,
            "deps": "gcc",
        },
        "link": {
            "command": ninja.command_template(link),
            "description": "LINK $module $out",
            "rspfile": "$out.rsp",
            "rspfile_content": "$in_newline",
        },
    }


def _module_var(mod: ModulePlan, stage: Stage, more: ModuleExtra) -> list[str]:
    """The flags every compile of ``mod`` shares (its ``flags_<module>`` variable), less the device passes."""
    every = passes.every(stage.tc)
    flags = module_flags(mod, stage.tc, stage.layout.blob(mod.name), stage.layout.include) + list(more.cflags)
    return [f for f in flags if f not in every]  # each edge names its own ($archs)


def _device_passes(tc: Toolchain, src: ModuleSources, more: ModuleExtra) -> dict[str, tuple[str, ...]]:
    """What each source of the module compiles, in order -> its device passes (:mod:`qola.compile.passes`)."""
    host = {*more.host_only, *src.host_only}
    return passes.of_sources(tc, more.sources(src.all), host, _source_archs(src, tc.archs))


def _target(
    mod: ModulePlan, stage: Stage, src: ModuleSources, more: ModuleExtra, *, var: str, paths: PathMap
) -> ninja.Target:
    """``mod``'s compile edges (each with its own flags and device passes) and its link."""
    tc = stage.tc
    where = _unit_paths(mod, stage, more)
    compiles: list[ninja.Compile] = []
    shared: dict[bool, list[str]] = {}  # CUDA: the module's flags (the tree's when the unit is the tree's)
    for s, device in _device_passes(tc, src, more).items():
        u, m = where(s)
        flags = tuple(_split(m.flags_for(u)) + list(more.flags_for(s)) + unit_flags(tc, paths, mod.name, u))
        if tc.kind == "cuda":  # decided by what the unit holds (qola.compile.devicescan)
            if (m is mod) not in shared:
                shared[m is mod] = _module_var(m, stage, more)
            device = passes.for_cuda(tc, stage.scan, u, [*shared[m is mod], *flags])[0]
        obj, flags_var = object_path(mod.name, u, paths), var if m is mod else var + "_tree"
        compiles.append(ninja.Compile(u, obj, flags_var, flags, device, passes.device_of(tc, device)))
    return ninja.Target(
        module=mod.name,
        artifact=stage.layout.artifact_rel(mod.artifact_name),
        compiles=tuple(compiles),
        rule=more.rule or "link",
        ldflags=tuple(module_ldflags(mod, tc)) + more.ldflags,
        extra_inputs=more.extra_inputs,
        implicit=more.implicit,
        variables=more.variables,
        entry_reads=more.entry_reads,
    )


def _unit_paths(mod: ModulePlan, stage: Stage, more: ModuleExtra) -> Callable[[str], tuple[str, ModulePlan]]:
    """Where each unit of ``mod`` compiles from: (its source, the module whose paths its line names).
    A module qola's fixes moved (:class:`qola.compile.overlay.Readers`) compiles the overlay's copies
    only in the units that can read a fixed file; the others name the tree's paths, as without fixes."""
    readers = stage.readers
    tree = readers.tree.get(mod.name) if readers else None
    if readers is None or tree is None:
        return lambda s: (s, mod)
    shared = _module_var(mod, stage, more)

    def where(s: str) -> tuple[str, ModulePlan]:
        dirs, forced = includes.search_path([*shared, *_split(mod.flags_for(s)), *more.flags_for(s)])
        return (s, mod) if readers.reads(s, dirs, forced) else (readers.in_tree(s), tree)

    return where


def _priorities(plan: Plan, targets: list[ninja.Target], build_dir: Path) -> dict[str, float]:
    """Expected compile seconds per object: the last build's time when known, else a guess — a module's
    own sources (entry points including pybind11 or torch) before generated instances."""
    last = ninja.compile_times(build_dir)
    mods = {m.name: m for m in plan.modules}
    prio: dict[str, float] = {}
    for t in targets:
        mod = mods[t.module]
        own = set(mod.sources)
        for c in t.compiles:
            guess = (10.0 if mod.is_python_module else 5.0) if c.src in own else 1.0
            prio[c.obj] = last.get(c.obj, guess)
    return prio


@dataclass(frozen=True)
class CompileRun:
    """How :func:`compile_graph` runs ninja. ``env``: the children's environment; ``stamp_env``: what
    the toolchain stamp reads (PATH and :data:`qola.toolchain.identity.COMPILER_ENV`; default:
    ``env``, a mapping); ``dry_run``: ``ninja -n``, every module "planned"; ``notes``: the build's
    notes so far (the report carries them); ``start``: when the build began (default: now)."""

    jobs: int
    env: Mapping[str, str] | ChildEnv
    stamp_env: Mapping[str, str] | None = None
    dry_run: bool = False
    verbose: bool = False
    on_status: Callable[[int, int, str], None] | None = None
    notes: tuple[str, ...] = ()
    start: float | None = None


def compile_graph(stage: Stage, graph: ninja.Graph, results: Results, how: CompileRun) -> CompileReport:
    """Write the toolchain stamp and ``build.ninja``, run ninja (``-k 0``) as ``how`` says and sort
    its outcome into the modules' results (:func:`qola.compile.results.settle`)."""
    tc, layout = stage.tc, stage.layout
    start = time.perf_counter() if how.start is None else how.start
    # the compilers' identity and environment: a replaced compiler or a changed NVCC_APPEND_FLAGS
    # rebuilds every edge, though no command line changed
    env = how.env
    read = how.stamp_env if how.stamp_env is not None else env if isinstance(env, Mapping) else {}
    identity.write_stamp(layout.root, identity.stamp_text(tc, {**read, **tc.child_env}))
    ninja.write(graph, layout.graph)
    owners = graph.owners()
    log_mark = ninja.log_length(layout.root)
    outcome = ninja.run(
        layout.root,
        ninja.RunOptions(
            jobs=how.jobs,
            env=ChildEnv.of(env).plus(tc.child_env),
            owner=owners.get,
            targets=tuple(f"module_{t.module}" for t in graph.targets),
            dry_run=how.dry_run,
            verbose=how.verbose,
            on_status=how.on_status,
        ),
    )
    times = ninja.compile_times(layout.root, log_mark)
    seconds = {
        t.module: sum(times.get(c.obj, 0.0) for c in t.compiles) + times.get(t.artifact, 0.0) for t in graph.targets
    }
    artifacts = {t.module: t.artifact for t in graph.targets}
    settled = settle(results, Ran(outcome, artifacts, seconds, layout.root, owners.get, how.dry_run))
    objects = {t.module: [c.obj for c in t.compiles] for t in graph.targets}
    empty = {} if how.dry_run else empty_objects(objects, layout.root)
    stubs = tuple(o for objs in empty.values() for o in objs)
    forget_stubs(stubs, layout.root)
    totals = {m: len(objs) for m, objs in objects.items()}
    return CompileReport(
        stage.plan,
        tc,
        tuple(settled.values()),
        layout.root,
        time.perf_counter() - start,
        tuple(outcome.log),
        (*how.notes, *stub_notes(empty, totals, tc.compiler, layout.log)),
        stubs,
    )
