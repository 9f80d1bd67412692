"""The build dir's stages: generated sources → each module's source list → one ninja graph →
objects and libraries. :mod:`qola.pipeline.run` calls them in order (with the hooks' extras between
the source lists and the graph).

Publishing into the output dir is :mod:`qola.output.publish`'s job; nothing here writes there.
"""

from __future__ import annotations

import shlex
import sys
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

from qola.compile import ninja
from qola.compile.extras import ModuleExtra
from qola.compile.layout import BuildLayout, object_path
from qola.compile.pathmap import PathMap, unit_id
from qola.compile.pyext import pybind11_flags, torch_flags
from qola.core.errors import FailedProcessError, QolaError, tail
from qola.core.proc import ChildEnv
from qola.plan import genrules, needs
from qola.plan.model import ModulePlan, Plan
from qola.plan.tree.files import read_small
from qola.plan.variants import GeneratorEnv
from qola.toolchain import Toolchain, identity
from qola.toolchain.env import ToolchainEnv
from qola.toolchain.hip import arch_flags
from qola.toolchain.hipconfig import generator_child


@dataclass(frozen=True)
class ModuleSources:
    """A module's source list: the table's (after the manifest's edits) and its generators' files."""

    own: tuple[str, ...]
    generated: tuple[str, ...]
    groups: tuple[tuple[str, ...], ...] = ()  # the generated files by the generator that wrote them (() = one group)

    @property
    def all(self) -> tuple[str, ...]:
        return self.own + self.generated


class Status(str, Enum):
    """A module's state in a build. A ``str``: the JSON and manifest.json spell it as before."""

    PENDING = "pending"  # not settled yet
    PLANNED = "planned"  # a dry run: it would build
    BUILT = "built"
    FAILED = "failed"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Generated:
    """What a module's generators wrote: every file, and each generator's files (() = not known)."""

    files: tuple[str, ...]
    groups: tuple[tuple[str, ...], ...] = ()


@dataclass
class ModuleResult:
    name: str
    md_name: str
    mode: str
    link: str
    status: Status = Status.PENDING
    sources: int = 0
    generated: int = 0
    instances: tuple[str, ...] = ()
    artifact: Path | None = None  # in the build dir
    seconds: float = 0.0
    codegen_seconds: float = 0.0
    error: str | None = None
    detail: str | None = None  # the error as the summary shows it (command, rc, output tail, hint)
    log: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    exports: list[str] = field(default_factory=list)
    headers: tuple[Path, ...] = ()


@dataclass
class CompileReport:
    plan: Plan
    toolchain: Toolchain
    modules: list[ModuleResult]
    build_dir: Path
    seconds: float
    ninja_log: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # build-wide, one line each (e.g. the hipconfig shim)

    @property
    def ok(self) -> bool:
        return all(m.status == Status.BUILT for m in self.modules)


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


def fail(r: ModuleResult, exc: QolaError) -> None:
    """Mark ``r`` failed by ``exc``: the summary shows its rendering, the log gets the whole output."""
    r.status, r.error, r.detail = Status.FAILED, exc.message, exc.render()
    if isinstance(exc, FailedProcessError):
        r.log += [f"$ {shlex.join(exc.cmd)}", exc.output.rstrip(), f"(exit code {exc.returncode})"]
    r.log.append(exc.render())


def new_results(plan: Plan) -> dict[str, ModuleResult]:
    return {m.name: ModuleResult(m.name, m.md_name, m.mode, m.link) for m in plan.modules}


def generate(
    plan: Plan,
    tc: Toolchain,
    layout: BuildLayout,
    *,
    jobs: int,
    env: Mapping[str, str] | ToolchainEnv,
    timeout: GeneratorEnv | None = None,
    results: dict[str, ModuleResult],
    notes: list[str],
    on_event: Callable[[str], None] = lambda s: None,
) -> dict[str, Generated]:
    """Run every module's generators (with the plan's filters) in parallel; module -> its generated
    files (and each generator's). A failure marks its module failed. ``env``: the toolchain's view
    (they run under its children's environment, hipconfig found on its PATH); ``timeout``: the generators' view, for
    ``QOLA_GENERATOR_TIMEOUT`` (both resolved from ``env`` when it is a mapping)."""
    from qola.compile.codegen import GenJob, run_generators  # lazy: the incremental path needs none of it

    given = genrules.aiter_env(plan.archs, plan.meta_dir)  # what AITER's build exports; in each stamp
    gen_jobs = [
        GenJob(m.name, m.generators, (), m.configs, env=tuple(sorted(given.items())))
        for m in plan.modules
        if m.generators
    ]
    generated: dict[str, Generated] = {}
    if not gen_jobs:
        return generated
    hsa_dir = Path(plan.meta_dir) / "hsa"
    tenv = ToolchainEnv.of(env)
    raw = (timeout or GeneratorEnv.of({} if isinstance(env, ToolchainEnv) else env)).timeout_raw
    child, note = generator_child(tc, tenv, given, layout.tools_bin)
    gen_env = GeneratorEnv(child, raw)
    notes += [note] if note else []

    def one(job: GenJob):
        try:
            return (
                job.module,
                run_generators(job, layout.gen_root, env=gen_env, python=sys.executable, hsa_dir=hsa_dir),
                None,
            )
        except QolaError as exc:
            return job.module, None, exc
        except OSError as exc:  # the interpreter or the build dir: still this module's failure
            return job.module, None, QolaError(f"module {job.module}: cannot run its generators: {exc}")

    with ThreadPoolExecutor(max_workers=max(1, min(jobs, len(gen_jobs)))) as pool:
        for name, res, exc in pool.map(one, gen_jobs):
            r = results[name]
            if exc is not None:
                fail(r, exc)
                on_event(f"generator failed for {name}")
                continue
            r.warnings += res.warnings
            r.log += [f"warning: {w}" for w in res.warnings]
            r.log += res.output.splitlines()  # what its generators printed (head and tail past proc.LOG_KEEP)
            generated[name] = Generated(res.sources, res.groups)
            r.codegen_seconds = res.seconds
            on_event(f"{'generated' if not res.skipped else 'up to date'}: {name} ({len(res.sources)} sources)")
    return generated


def sources(
    plan: Plan, generated: Mapping[str, Generated], results: dict[str, ModuleResult], layout: BuildLayout
) -> dict[str, ModuleSources]:
    """Each buildable module's source list; its result gets the counts, instances and artifact path.
    A module without a source fails."""
    out: dict[str, ModuleSources] = {}
    for mod in plan.modules:
        r = results[mod.name]
        if r.status == Status.FAILED:
            continue
        made = generated.get(mod.name) or Generated(())
        gen, groups = made.files, made.groups
        if unused := _unused_dispatch(mod, gen):
            gen = tuple(s for s in gen if s not in unused)
            groups = tuple(tuple(s for s in g if s not in unused) for g in groups)
            r.log += [f"not compiled: {Path(s).name} (a dropped direction's dispatch no source calls)" for s in unused]
        r.sources, r.generated = len(mod.sources), len(gen)
        r.instances = tuple(sorted(Path(s).stem for s in gen))
        if not mod.sources and not gen:
            r.status, r.error = Status.FAILED, "the module has no sources (table srcs empty and no generated files)"
            continue
        if mod.gates:  # a source gating its kernels on a registry switch left off (qola.plan.needs)
            flags = [*(mod.flags_extra_cc if plan.vendor == "hip" else ()), *mod.flags_extra_hip]
            off = needs.off_switches(mod.gates, flags, {s: mod.flags_for(s) for s, _ in mod.gates})
            if off:
                every = all(len(names) == len(dict(mod.gates)[src]) for src, names in off)
                fail(
                    r,
                    QolaError(
                        needs.off_message(mod.name, off, every),
                        hint="define them to 1 (qola's registry adds -D<NAME>=1 unless the table or the "
                        "manifest defines the switch; remove the manifest's -D<NAME>=0)",
                    ),
                )
                continue
        try:  # names from the table never leave the build dir (checked at plan time too)
            r.artifact = layout.artifact(mod.artifact_name)
            layout.obj_dir(mod.name)
        except QolaError as exc:
            fail(r, exc)
            continue
        out[mod.name] = ModuleSources(tuple(mod.sources), gen, groups)
    return out


MAX_SCANNED = 64 << 20  # a source read to see whether it calls a dropped direction's dispatch


def _unused_dispatch(mod: ModulePlan, generated: tuple[str, ...]) -> set[str]:
    """The dispatch files of ``mod``'s dropped directions (CK writes them alone: ``drop_directions``)
    that no other source of the library calls (:func:`qola.plan.genrules.unused_dispatch`): not
    compiled. Read: the module's own sources and the generated files without an arch suffix (API and
    dispatch files; a CK kernel file calls no dispatch)."""
    dropped = {g.direction for g in mod.generators if g.dispatch_only and g.direction}
    stems = {genrules.dispatch_stem(d): d for d in dropped}
    candidates = {s: stems[Path(s).stem] for s in generated if Path(s).stem in stems}
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
    """Each generated file's archs, judged among the files of the generator that wrote it (CK's
    ``_gfx9`` files beside an asm generator's ``_gfx942`` one still serve gfx942); all of them as
    one listing when the groups are not known."""
    out: dict[str, tuple[str, ...]] = {}
    for group in src.groups or (src.generated,):
        out.update(genrules.source_archs(group, archs))
    return out


def graph_for(
    plan: Plan,
    tc: Toolchain,
    layout: BuildLayout,
    srcs: Mapping[str, ModuleSources],
    extras: Mapping[str, ModuleExtra],
    *,
    launcher: str | None = None,
    rules: Mapping[str, Mapping[str, str]] | None = None,
) -> ninja.Graph:
    """The graph for every module in ``srcs`` (the buildable ones), each compiled and linked as its
    extra says (sources dropped / added, flags, edges, link rule); ``rules`` adds the rules those name.

    HIP: each compile edge names its own device passes (``$archs``, after ``$flags``): a generated file
    the archs it holds device code for (:func:`qola.plan.genrules.source_archs`: CK's ``…_gfx9`` file no
    gfx950 pass), every other source all the build's archs; the module's flags name none."""
    per_file = tc.kind == "hip"
    every = tuple(arch_flags(tc.archs)) if per_file else ()
    cc = ([launcher] if launcher else []) + tc.compile_argv(
        "$in", "$out", "$out.d", ["$flags", "$archs"] if per_file else ["$flags"]
    )
    link = tc.shared_link_argv("$out.rsp", "$out", ["$ldflags"])
    all_rules: dict[str, Mapping[str, str]] = {
        "cc": {
            "command": ninja.command_template(cc),
            "description": "CC $module $in",
            "depfile": "$out.d",
            "deps": "gcc",
        },
        "link": {
            "command": ninja.command_template(link),
            "description": "LINK $module $out",
            "rspfile": "$out.rsp",
            "rspfile_content": "$in_newline",
        },
        **(rules or {}),
    }
    variables: dict[str, str] = {}
    targets = []
    edges: list[tuple] = []
    paths = PathMap.of(plan.tree_root, layout.root)
    for mod in plan.modules:
        if mod.name not in srcs:
            continue
        more = extras.get(mod.name) or ModuleExtra()
        var = f"flags_{mod.name}"
        flags = module_flags(mod, tc, layout.blob(mod.name), layout.include) + list(more.cflags)
        flags = [f for f in flags if f not in every]  # each edge names its own ($archs)
        variables[var] = ninja.escape_flags(flags + tc.prefix_map_flags(paths.compiler_maps))
        served = _source_archs(srcs[mod.name], tc.archs) if per_file else {}
        compiles = tuple(
            ninja.Compile(
                s,
                object_path(mod.name, s),
                var,
                tuple(_split(mod.flags_for(s)) + list(more.flags_for(s)) + unit_flags(tc, paths, mod.name, s)),
                tuple(arch_flags(served[s])) if s in served else every,
            )
            for s in more.sources(srcs[mod.name].all)
        )
        edges += [(e.rule, e.out, e.inputs, dict(e.variables)) for e in more.edges]
        targets.append(
            ninja.Target(
                module=mod.name,
                artifact=layout.artifact_rel(mod.artifact_name),
                compiles=compiles,
                rule=more.rule or "link",
                ldflags=tuple(module_ldflags(mod, tc)) + more.ldflags,
                extra_inputs=more.extra_inputs,
                implicit=more.implicit,
                variables=more.variables,
            )
        )
    return ninja.Graph(
        rules=all_rules,
        variables=variables,
        targets=tuple(targets),
        extra_edges=tuple(edges),
        priority=_priorities(plan, targets, layout.root),
        stamp=identity.STAMP,
    )


def _priorities(plan: Plan, targets: list, build_dir: Path) -> dict[str, float]:
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


def compile_graph(
    plan: Plan,
    tc: Toolchain,
    layout: BuildLayout,
    graph: ninja.Graph,
    results: dict[str, ModuleResult],
    *,
    jobs: int,
    env: Mapping[str, str] | ChildEnv,
    stamp_env: Mapping[str, str] | None = None,
    dry_run: bool = False,
    verbose: bool = False,
    on_status: Callable[[int, int, str], None] | None = None,
    notes: list[str] | None = None,
    start: float | None = None,
) -> CompileReport:
    """Write the toolchain stamp and ``build.ninja``, run ninja (``-k 0``) under ``env`` (the
    children's environment) and sort its outcome into the modules' results (``dry_run``: ``ninja
    -n``, every module "planned"). ``stamp_env``: what the stamp reads (PATH and
    :data:`qola.toolchain.identity.COMPILER_ENV`; default: ``env``, a mapping)."""
    start = time.perf_counter() if start is None else start
    # the compilers' identity and environment: a replaced compiler or a changed NVCC_APPEND_FLAGS
    # rebuilds every edge, though no command line changed
    read = stamp_env if stamp_env is not None else env if isinstance(env, Mapping) else {}
    identity.write_stamp(layout.root, identity.stamp_text(tc, {**read, **tc.child_env}))
    ninja.write(graph, layout.graph)
    owners = {t.artifact: t.module for t in graph.targets}
    owners.update({c.obj: t.module for t in graph.targets for c in t.compiles})
    owners.update({e[1]: e[3].get("module") for e in graph.extra_edges if len(e) > 3 and e[3]})
    log_mark = ninja.log_length(layout.root)
    outcome = ninja.run(
        layout.root,
        jobs=jobs,
        env=ChildEnv.of(env).plus(tc.child_env),
        owner=owners.get,
        targets=[f"module_{t.module}" for t in graph.targets],
        dry_run=dry_run,
        verbose=verbose,
        on_status=on_status,
    )
    times = ninja.compile_times(layout.root, log_mark)
    seconds = {
        t.module: sum(times.get(c.obj, 0.0) for c in t.compiles) + times.get(t.artifact, 0.0) for t in graph.targets
    }
    settle(
        results,
        outcome,
        {t.module: t.artifact for t in graph.targets},
        seconds,
        layout.root,
        owner=owners.get,
        dry_run=dry_run,
    )
    return CompileReport(
        plan, tc, list(results.values()), layout.root, time.perf_counter() - start, outcome.log, list(notes or [])
    )


def settle(
    results: Mapping[str, ModuleResult],
    outcome: ninja.NinjaRun,
    artifacts: Mapping[str, str],
    seconds: Mapping[str, float],
    root: Path,
    *,
    owner: Callable[[str], str | None],
    dry_run: bool = False,
) -> None:
    """Sort ninja's outcome into the results of the modules it built (``artifacts``: module -> its
    artifact, relative to ``root``): each gets its output lines and seconds, and is built, failed
    (a failed edge of its own, or no artifact) or, in a dry run, planned."""
    failed_mods = {owner(o) for o in outcome.failed_outputs}
    for name, artifact in artifacts.items():
        r = results[name]
        r.log += outcome.lines_by_module.get(name, [])
        r.seconds = r.codegen_seconds + seconds.get(name, 0.0)
        if dry_run:
            r.status = Status.PLANNED
        elif name in failed_mods or not (root / artifact).is_file():
            r.status = Status.FAILED
            first = next((ln for ln in r.log if "error" in ln.lower()), None) or (r.log[0] if r.log else "")
            r.error = r.error or (first.strip()[:300] or f"ninja exited {outcome.returncode}")
            r.detail = r.detail or _failed_excerpt(r.log)
        else:
            r.status = Status.BUILT
    if (
        outcome.returncode != 0
        and not failed_mods
        and not dry_run
        and all(r.status == Status.BUILT for r in results.values())
    ):
        raise QolaError("ninja failed without naming a failed edge:\n" + "\n".join(outcome.log[-20:]))


def _failed_excerpt(log: list[str]) -> str | None:
    """From ninja's first ``FAILED:`` line of a module on (the command and the compiler's output), bounded."""
    at = next((i for i, ln in enumerate(log) if ln.startswith("FAILED: ")), None)
    return None if at is None else "error: " + tail("\n".join(log[at:]))
