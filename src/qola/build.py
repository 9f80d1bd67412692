"""The build: plan → generated sources → one ninja graph → objects and libraries in the build dir.

Publishing into the output dir is :mod:`qola.publish`'s job; nothing here writes there.
"""

from __future__ import annotations

import shlex
import shutil
import sys
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from qola import ninja
from qola.codegen import GenJob, run_generators
from qola.errors import FailedProcessError, QolaError, tail
from qola.fsutil import inside
from qola.plan import ModulePlan, Plan
from qola.pyext import pybind11_flags, torch_flags
from qola.toolchain import Toolchain
from qola.toolchain import identity
from qola.toolchain.hipconfig import generator_env


@dataclass(frozen=True)
class BuildOptions:
    build_dir: Path
    jobs: int
    launcher: str | None = None
    dry_run: bool = False
    verbose: bool = False
    gen_args: Mapping[str, tuple[tuple[str, ...], ...]] = field(default_factory=dict)  # module -> per-generator args


@dataclass
class ModuleResult:
    name: str
    md_name: str
    mode: str
    link: str
    status: str = "pending"  # built | failed
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
class BuildReport:
    plan: Plan
    toolchain: Toolchain
    modules: list[ModuleResult]
    build_dir: Path
    seconds: float
    ninja_log: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # build-wide, one line each (e.g. the hipconfig shim)

    @property
    def ok(self) -> bool:
        return all(m.status == "built" for m in self.modules)


def artifact_name(mod: ModulePlan) -> str:
    if mod.is_python_module or mod.link != "static":
        return f"{mod.md_name}.so"
    return f"{mod.md_name}.a"


def _split(flags: tuple[str, ...] | list[str]) -> list[str]:
    """AITER writes '-mllvm --x=1' as one entry; compilers want two words."""
    out: list[str] = []
    for f in flags:
        out += shlex.split(f)
    return out


def module_flags(mod: ModulePlan, tc: Toolchain, blob_dir: Path, include_dir: Path) -> list[str]:
    flags = tc.device_flags()
    flags += [f"-I{d}" for d in (*mod.include_dirs, str(blob_dir), str(include_dir))]
    flags += _split(mod.flags_extra_hip)
    if mod.is_python_module:
        flags += pybind11_flags(mod.md_name, mod.table_md_name).cflags
        if not mod.torch_exclude:
            flags += torch_flags(tc.kind).cflags
    return flags


def module_ldflags(mod: ModulePlan, tc: Toolchain) -> list[str]:
    flags = _split(mod.extra_ldflags)
    if mod.is_python_module and not mod.torch_exclude:
        flags += torch_flags(tc.kind).ldflags
    return flags


def fail(r: ModuleResult, exc: QolaError) -> None:
    """Mark ``r`` failed by ``exc``: the summary shows its rendering, the log gets the whole output."""
    r.status, r.error, r.detail = "failed", exc.message, exc.render()
    if isinstance(exc, FailedProcessError):
        r.log += [f"$ {shlex.join(exc.cmd)}", exc.output.rstrip(), f"(exit code {exc.returncode})"]
    r.log.append(exc.render())


def _codegen(plan: Plan, tc: Toolchain, opts: BuildOptions, env: Mapping[str, str],
             results: dict[str, ModuleResult], notes: list[str],
             on_event: Callable[[str], None]) -> dict[str, tuple[str, ...]]:
    """Run every module's generators in parallel; failures mark their module failed."""
    jobs = [GenJob(m.name, m.generators, opts.gen_args.get(m.name, ()), m.configs)
            for m in plan.modules if m.generators]
    generated: dict[str, tuple[str, ...]] = {}
    if not jobs:
        return generated
    gen_root = opts.build_dir / "gen"
    hsa_dir = Path(plan.meta_dir) / "hsa"
    # AITER's generators ask chip_info for the targets: GPU_ARCHS, else rocminfo (absent on build hosts)
    gen_env, note = generator_env(tc, {**env, "GPU_ARCHS": ";".join(plan.archs)}, opts.build_dir / "tools" / "bin")
    notes += [note] if note else []

    def one(job: GenJob):
        try:
            return job.module, run_generators(job, gen_root, env=gen_env, python=sys.executable,
                                              hsa_dir=hsa_dir), None
        except QolaError as exc:
            return job.module, None, exc
        except OSError as exc:  # the interpreter or the build dir: still this module's failure
            return job.module, None, QolaError(f"module {job.module}: cannot run its generators: {exc}")

    with ThreadPoolExecutor(max_workers=max(1, min(opts.jobs, len(jobs)))) as pool:
        for name, res, exc in pool.map(one, jobs):
            r = results[name]
            if exc is not None:
                fail(r, exc)
                on_event(f"generator failed for {name}")
                continue
            r.warnings += res.warnings
            r.log += [f"warning: {w}" for w in res.warnings]
            generated[name] = res.sources
            r.codegen_seconds = res.seconds
            on_event(f"{'generated' if not res.skipped else 'up to date'}: {name} ({len(res.sources)} sources)")
    return generated


def graph_for(plan: Plan, tc: Toolchain, opts: BuildOptions, generated: Mapping[str, tuple[str, ...]],
              results: dict[str, ModuleResult], include_dir: Path,
              extra: Callable[[ModulePlan, ModuleResult], dict] | None = None,
              extra_rules: Mapping[str, Mapping[str, str]] | None = None) -> ninja.Graph:
    """The graph for every module that is still buildable.

    ``extra(mod, result)`` may return {"rule", "ldflags", "extra_inputs", "implicit", "cflags", "edges",
    "variables", "drop_sources", "add_sources"} for a module (isolation, embedding, JIT: sources it
    does not compile / compiles in addition, like instances) or mark it failed; ``extra_rules`` adds
    the rules those name.
    """
    launcher = [opts.launcher] if opts.launcher else []
    cc = launcher + tc.compile_argv("$in", "$out", "$out.d", ["$flags"])
    link = tc.shared_link_argv("$out.rsp", "$out", ["$ldflags"])
    rules: dict[str, dict[str, str]] = {
        "cc": {"command": ninja.command_template(cc), "description": "CC $module $in", "depfile": "$out.d",
               "deps": "gcc"},
        "link": {"command": ninja.command_template(link), "description": "LINK $module $out",
                 "rspfile": "$out.rsp", "rspfile_content": "$in_newline"},
    }
    variables: dict[str, str] = {}
    targets = []
    edges: list[tuple[str, str, tuple[str, ...]]] = []
    for mod in plan.modules:
        r = results[mod.name]
        if r.status == "failed":
            continue
        srcs = list(mod.sources) + list(generated.get(mod.name, ()))
        r.sources, r.generated = len(mod.sources), len(generated.get(mod.name, ()))
        r.instances = tuple(sorted(Path(s).stem for s in generated.get(mod.name, ())))
        if not srcs:
            r.status, r.error = "failed", "the module has no sources (table srcs empty and no generated files)"
            continue
        blob = opts.build_dir / "gen" / mod.name / "blob"
        art = f"lib/{artifact_name(mod)}"
        try:  # names from the table never leave the build dir (checked at plan time too)
            r.artifact = inside(opts.build_dir, art)
            inside(opts.build_dir, "obj", mod.name)
        except QolaError as exc:
            fail(r, exc)
            continue
        more = extra(mod, r) if extra else {}
        if r.status == "failed":  # the hook could not prepare it (its error is in the result)
            continue
        drop = set(more.get("drop_sources", ()))
        srcs = [s for s in srcs if s not in drop] + list(more.get("add_sources", ()))
        var = f"flags_{mod.name}"
        variables[var] = ninja.escape_flags(module_flags(mod, tc, blob, include_dir) + list(more.get("cflags", ())))
        compiles = tuple(ninja.Compile(s, ninja.object_path(mod.name, s), var, tuple(_split(mod.flags_for(s))))
                         for s in srcs)
        edges += list(more.get("edges", ()))
        targets.append(ninja.Target(
            module=mod.name, artifact=art, compiles=compiles, rule=more.get("rule", "link"),
            ldflags=tuple(module_ldflags(mod, tc)) + tuple(more.get("ldflags", ())),
            extra_inputs=tuple(more.get("extra_inputs", ())), implicit=tuple(more.get("implicit", ())),
            variables=tuple(more.get("variables", {}).items()),
        ))
    rules.update(extra_rules or {})
    return ninja.Graph(rules=rules, variables=variables, targets=tuple(targets), extra_edges=tuple(edges),
                       priority=_priorities(plan, targets, opts.build_dir), stamp=identity.STAMP)


def _priorities(plan: Plan, targets: list, build_dir: Path) -> dict[str, float]:
    """Expected compile seconds per object: the last build's time when known, else a guess — a module's
    own sources (entry points including pybind11 or torch) before generated instances."""
    last = ninja.compile_times(build_dir)
    mods = {m.name: m for m in plan.modules}
    prio: dict[str, float] = {}
    for t in targets:
        mod = mods[t.module]
        for c in t.compiles:
            guess = (10.0 if mod.is_python_module else 5.0) if c.src in mod.sources else 1.0
            prio[c.obj] = last.get(c.obj, guess)
    return prio


def run_build(plan: Plan, tc: Toolchain, opts: BuildOptions, *, env: Mapping[str, str],
              on_event: Callable[[str], None] = lambda s: None,
              on_status: Callable[[int, int, str], None] | None = None,
              extra: Callable[[ModulePlan, ModuleResult], dict] | None = None,
              extra_rules: Mapping[str, Mapping[str, str]] | None = None) -> BuildReport:
    start = time.perf_counter()
    opts.build_dir.mkdir(parents=True, exist_ok=True)
    results = {m.name: ModuleResult(m.name, m.md_name, m.mode, m.link) for m in plan.modules}
    include_dir = opts.build_dir / "include"
    include_dir.mkdir(exist_ok=True)
    notes: list[str] = []
    generated = _codegen(plan, tc, opts, env, results, notes, on_event)
    graph = graph_for(plan, tc, opts, generated, results, include_dir, extra, extra_rules)
    # the compilers' identity and environment: a replaced compiler or a changed NVCC_APPEND_FLAGS
    # rebuilds every edge, though no command line changed
    identity.write_stamp(opts.build_dir, identity.stamp_text(tc, {**env, **tc.child_env}))
    ninja.write(graph, opts.build_dir / "build.ninja")
    owners = {t.artifact: t.module for t in graph.targets}
    owners.update({c.obj: t.module for t in graph.targets for c in t.compiles})
    owners.update({e[1]: e[3].get("module") for e in graph.extra_edges if len(e) > 3 and e[3]})
    log_mark = ninja.log_length(opts.build_dir)
    outcome = ninja.run(opts.build_dir, jobs=opts.jobs, env={**env, **tc.child_env}, owner=owners.get,
                        targets=[f"module_{t.module}" for t in graph.targets], dry_run=opts.dry_run,
                        verbose=opts.verbose, on_status=on_status)
    times = ninja.compile_times(opts.build_dir, log_mark)
    failed_mods = {owners.get(o) for o in outcome.failed_outputs}
    for t in graph.targets:
        r = results[t.module]
        r.log += outcome.lines_by_module.get(t.module, [])
        r.seconds = r.codegen_seconds + sum(times.get(c.obj, 0.0) for c in t.compiles) + times.get(t.artifact, 0.0)
        if opts.dry_run:
            r.status = "planned"
        elif t.module in failed_mods or not (opts.build_dir / t.artifact).is_file():
            r.status = "failed"
            first = next((ln for ln in r.log if "error" in ln.lower()), None) or (r.log[0] if r.log else "")
            r.error = r.error or (first.strip()[:300] or f"ninja exited {outcome.returncode}")
            r.detail = r.detail or _failed_excerpt(r.log)
        else:
            r.status = "built"
    if outcome.returncode != 0 and not failed_mods and not opts.dry_run and all(
            r.status == "built" for r in results.values()):
        raise QolaError("ninja failed without naming a failed edge:\n" + "\n".join(outcome.log[-20:]))
    return BuildReport(plan, tc, list(results.values()), opts.build_dir, time.perf_counter() - start, outcome.log,
                       notes)


def _failed_excerpt(log: list[str]) -> str | None:
    """From ninja's first ``FAILED:`` line of a module on (the command and the compiler's output), bounded."""
    at = next((i for i, ln in enumerate(log) if ln.startswith("FAILED: ")), None)
    return None if at is None else "error: " + tail("\n".join(log[at:]))


def clean_stale(build_dir: Path) -> None:
    shutil.rmtree(build_dir / "obj", ignore_errors=True)
