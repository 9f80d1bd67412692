"""``qola build``: plan, generate, compile and link every module in one ninja graph, then publish."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

from qola import fastpath, lock, preflight
from qola.commands.common import add_manifest_args
from qola.errors import QolaError

# everything else is imported in run(), after the no-op fast path had its chance


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("build", help="build the manifest's modules into an output dir",
                       description="Build every module of the manifest in one ninja graph and publish the results.")
    add_manifest_args(p)
    p.add_argument("--output-dir", "-o", required=True, help="where lib/, include/, manifest.json … land")
    p.add_argument("-j", "--jobs", type=preflight.jobs_arg, metavar="N",
                   help="parallel jobs (default: MAX_JOBS, else AITER's cpu/memory rule)")
    p.add_argument("--build-dir", help="objects and generated sources (default: <output-dir>.build)")
    p.add_argument("--launcher", help="compiler launcher, e.g. sccache or ccache")
    p.add_argument("--dry-run", action="store_true", help="write the graph and show what would run; O untouched")
    p.add_argument("--verbose", "-v", action="store_true", help="print every command")
    p.add_argument("--wait", nargs="?", type=preflight.seconds_arg, const=float("inf"), metavar="SECONDS",
                   help="when another qola build uses the same build or output dir, wait for it (at most SECONDS) "
                   "instead of failing at once")
    p.add_argument("--no-isolation", action="store_true",
                   help="debug: link cpp_itfs libraries without the version script (the audit then fails on leaks)")
    p.set_defaults(func=run)


def _launcher(name: str | None, env: dict[str, str]) -> str | None:
    if not name:
        return None
    found = shutil.which(name, path=env.get("PATH"))
    if not found:
        raise QolaError(f"compiler launcher {name!r} not found on PATH",
                        hint=f"install it (e.g. pip install {name} / apt-get install {name}) or drop --launcher")
    return found


def summary(report, console, out: Path | None = None) -> None:
    from rich.table import Table  # noqa: PLC0415

    table = Table(title=f"qola build — {len(report.modules)} module(s) in {report.seconds:.1f} s")
    for col in ("module", "status", "sources", "generated", "artifact", "time"):
        table.add_column(col, overflow="fold")
    for m in report.modules:
        style = {"built": "green", "failed": "red"}.get(m.status, "yellow")
        table.add_row(m.name, f"[{style}]{m.status}[/]", str(m.sources), str(m.generated),
                      m.artifact.name if m.artifact and m.status == "built" else "-", f"{m.seconds:.1f} s")
    console.print(table)
    problems(report, console, out)


def problems(report, console, out: Path | None = None) -> None:
    """Notes, warnings and every failed module's error (the command and the tail of its output),
    printed as plain text (no markup, no wrapping: commands stay copyable)."""
    for note in report.notes:
        console.print(f"note: {note}", markup=False, highlight=False, soft_wrap=True)
    for m in report.modules:
        for w in m.warnings:
            console.print(f"warning: {w}", markup=False, highlight=False, soft_wrap=True)
    for m in report.modules:
        if m.status != "failed":
            continue
        text = m.detail or f"error: {m.error}"
        head, _, rest = text.partition("\n")
        head = head.removeprefix("error: ")
        console.print(f"error: {m.name} failed: {head}", *([rest] if rest else []), sep="\n", markup=False,
                      highlight=False, soft_wrap=True)
        if out is not None:
            console.print(f"  full log: {out / 'logs' / f'{m.name}.log'}", markup=False, highlight=False,
                          soft_wrap=True)


def run(args: argparse.Namespace) -> int:
    env = dict(os.environ)
    argv = list(getattr(args, "argv", None) or [])
    # before anything is written or run: numbers, directories (never /, never nested in each other or
    # in the tree), then one build per build dir and output dir
    preflight.check_jobs(args.jobs, None, env)
    out, build_dir = preflight.output_dirs(args.output_dir, args.build_dir)
    preflight.disjoint({"the output dir": out, "the build dir": build_dir,
                        "the kernel tree": preflight.early_tree_root(args.aiter_root, args.manifest)})
    dirs = {"the build dir": (build_dir, "--build-dir")} | ({} if args.dry_run else {"the output dir": (out, "-o")})
    preflight.writable(dirs)
    locks = {lock.build_lock_path(build_dir): f"the build dir {build_dir}"}
    if not args.dry_run:
        locks[lock.output_lock_path(out)] = f"the output dir {out}"
    with lock.acquire(locks, ["qola", *argv], wait=args.wait):
        if not args.dry_run and argv:
            from ninja import BIN_DIR  # noqa: PLC0415 (light: the package's __init__)

            if fastpath.up_to_date(build_dir, out, argv, env, os.path.join(BIN_DIR, "ninja")):
                print(f"qola: {out} is up to date (nothing to do)", file=sys.stderr)
                return 0
        if not args.dry_run:
            preflight.room(out, build_dir)
        return _run(args, env, argv, out, build_dir)


def _run(args: argparse.Namespace, env: dict[str, str], argv: list[str], out: Path, build_dir: Path) -> int:
    from rich.console import Console  # noqa: PLC0415
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn  # noqa: PLC0415

    from qola import isolation, jitbuild, variants  # noqa: PLC0415
    from qola.build import BuildOptions, run_build  # noqa: PLC0415
    from qola.commands.common import hip_version as prepared_hip_version  # noqa: PLC0415
    from qola.commands.common import prepare, tree_root, warn  # noqa: PLC0415
    from qola.publish import prepare as prepare_output  # noqa: PLC0415
    from qola.publish import publish  # noqa: PLC0415
    from qola.toolchain import default_jobs, find_toolchain  # noqa: PLC0415

    fastpath.forget(build_dir)
    prepared = prepare(args, env)
    plan, manifest = prepared.plan, prepared.manifest
    preflight.check_jobs(args.jobs, manifest.build.jobs, env)
    preflight.disjoint({"the output dir": out, "the build dir": build_dir, "the kernel tree": prepared.tree.root})
    plan, gen_args = variants.apply(plan, manifest, env)  # declared variants -> generator filters
    jplan = jitbuild.plan_jit(prepared.plan, manifest, env)  # [jit]: instances built ahead; None without it
    console = Console(stderr=True)
    warn(plan.warnings)
    if not args.dry_run:  # refuse an OUT qola did not write, and clear what killed runs left, before compiling
        for note in prepare_output(out, build_dir):
            console.print(f"note: {note}", markup=False, highlight=False, soft_wrap=True)
    versions = manifest.qola.rocm_versions if plan.vendor == "hip" else manifest.qola.cuda_versions
    # a dry run only plans: with HIP it takes AITER's flags for the manifest's ROCm version, unprobed
    assume = (versions or [None])[0] if args.dry_run and plan.vendor == "hip" else None
    if args.dry_run and plan.vendor == "hip" and assume is None:
        assume = prepared_hip_version(env, manifest) or "7.0"
    tc = find_toolchain(plan.archs, env=env, accepted_versions=versions, cache_dir=build_dir / "probes",
                        assume_version=assume)
    jobs = args.jobs or manifest.build.jobs or default_jobs(env)
    launcher = _launcher(args.launcher or manifest.build.launcher, env)
    opts = BuildOptions(build_dir=build_dir, jobs=jobs, launcher=launcher, dry_run=args.dry_run,
                        verbose=args.verbose, gen_args=gen_args)
    console.print(f"qola: {len(plan.modules)} module(s), {tc.kind} {tc.version} ({tc.compiler}), "
                  f"archs {', '.join(plan.archs)}, -j {jobs}, build dir {build_dir}")
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=True, disable=args.dry_run) as progress:
        task = progress.add_task("generating", total=None)

        def on_status(done: int, total: int, desc: str) -> None:
            progress.update(task, completed=done, total=total, description=desc[:60])
            if args.verbose:
                console.print(desc)

        jhk = jitbuild.hooks(jplan, plan, tc, build_dir, env) if jplan else None
        hk = isolation.hooks(plan, tc, build_dir, isolate=not args.no_isolation, inner=jhk)
        hdrs = isolation.headers(plan, build_dir)  # qola_config.h, qola_common.h: before the compiles
        report = run_build(plan, tc, opts, env=env, on_event=lambda s: progress.console.print(s) if args.verbose else None,
                           on_status=on_status, extra=hk.extra, extra_rules=hk.rules)
    if args.dry_run:
        for line in report.ninja_log:
            print(line)
        problems(report, console)
        console.print(f"dry run: graph written to {build_dir / 'build.ninja'}; {out} untouched")
        return 0 if all(m.status != "failed" for m in report.modules) else 1
    isolation.audit(report, plan)
    trees, records = jitbuild.publish_items(jhk, report)
    built_hdrs, withdrawn = isolation.module_headers(report, plan, build_dir)
    path = publish(report, out, headers=[*hdrs, *built_hdrs], withdrawn=withdrawn,
                   mode=args.mode or manifest.build.mode or "pybind", texts=isolation.consumers(report, plan, tc),
                   trees=trees, module_extra=records)
    summary(report, console, out)
    console.print(f"manifest: {path}")
    if report.ok and argv:
        given = [args.manifest, str(tree_root(args, manifest))]
        _remember(prepared, plan, tc, launcher, build_dir, out, argv, env, given)
    return 0 if report.ok else 1


def _remember(prepared, plan, tc, launcher, build_dir: Path, out: Path, argv: list[str], env: dict[str, str],
              given: list[str]) -> None:
    """Record what this (successful) build was derived from, for the next no-op. ``given``: the
    manifest and tree paths as the command line (or manifest) named them: symlinks re-pointed to
    another manifest or tree are noticed."""
    tree = prepared.tree
    tree_files = [str(tree.table_path), str(tree.root / "aiter" / "jit" / "core.py")]
    texts = []
    for f in tree_files:
        try:
            texts.append(Path(f).read_text())
        except OSError:
            pass
    dirs = {str(Path(s).parent) for m in plan.modules for s in m.sources}
    dirs |= {d for m in plan.modules for d in m.include_dirs}
    if any(m.embed for m in plan.modules):
        dirs.add(str(tree.hsa))
    scripts = [g.script for m in plan.modules for g in m.generators]
    # the tuned-config CSVs generators read: merged configs' sources, files named in their commands,
    # and the tree's configs dir (a new per-model CSV joins a merge)
    data = [f for m in plan.modules for c in m.configs for f in (*c.sources, c.untuned) if f]
    data += [a for m in plan.modules for g in m.generators for a in g.argv[1:]
             if os.path.isabs(a) and os.path.isfile(a)]
    tools = [tc.compiler, tc.host_cxx, launcher]
    files = fastpath.input_files(manifest=prepared.manifest.path, tree_files=tree_files, dirs=sorted(dirs),
                                 generator_scripts=scripts, tools=tools, data=data,
                                 data_dirs=[str(tree.root / "aiter" / "configs")])
    resolved = [os.path.abspath(p) for p in [*given, *(t for t in tools if t)]]
    fastpath.record(build_dir, out, argv, env, fastpath.env_keys_of(texts), files, resolved)
