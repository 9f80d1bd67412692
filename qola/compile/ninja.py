"""Write one ``build.ninja`` for every module (with ``ninja_syntax``) and run it.

Object names are unique per source path; every compile writes a depfile (``-MD``: the one the
compiler names after ``-o``, bound per edge as ``$dep``); link lines go through response files;
ninja runs with ``-k 0`` so one broken module does not stop the others, and its status lines drive a
progress callback. Every compile line passes :mod:`qola.toolchain.portable`'s rule here, before the
file exists: its rule's command, the flag variables its edges use and their own flags.
"""

from __future__ import annotations

import io
import re
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ninja as ninja_pkg
from ninja import ninja_syntax

from qola.compile import layout
from qola.core import argfile, proc
from qola.core.errors import QolaError
from qola.core.fsutil import write_if_changed
from qola.toolchain import portable

STATUS = "[qola %f/%t] "
UNWRAPPED = 1 << 62  # ninja_syntax.Writer width: never wrap (see write)
NINJA_LOG_KEEP = 32 << 20  # bytes of ninja's whole output kept (head and tail); each module's lines: proc.LOG_KEEP
_STATUS_RE = re.compile(r"^\[qola (\d+)/(\d+)\] (.*)$")
_VARS = ("$in", "$out", "$out.rsp", "$flags", "$ldflags", "$launcher", "@$out.rsp")
DEPFILE = "$dep"  # a compile rule's depfile: each edge binds it to portable.depfile_of(its output)
COMPILE_RULE, HOST_RULE = "cc", "cc_host"  # a compile edge's rule; a host-only one's (Compile.device)
TARGETS = "qola_targets"  # the one phony target layout.TARGETS_FILE names a run's targets by (see target_args)


@dataclass(frozen=True)
class Compile:
    src: str
    obj: str
    flags_var: str  # name of the file-level variable holding the module's flags
    extra_flags: tuple[str, ...] = ()  # per-source flags
    archs: tuple[str, ...] = ()  # the device passes this file needs (``--offload-arch=…``): the edge's $archs
    # a host-only compile's: the passes it compiles with instead when the host-only compile fails (the
    # edge's $device, rule HOST_RULE) or its object holds device code (qola.compile.hostonly); else None
    device: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Target:
    """One module's edges: compiles, then a link (or archive) producing ``artifact``."""

    module: str
    artifact: str
    compiles: tuple[Compile, ...]
    rule: str  # "link" | custom rule name
    ldflags: tuple[str, ...] = ()
    extra_inputs: tuple[str, ...] = ()  # objects not compiled here (embedded data …)
    implicit: tuple[str, ...] = ()  # files the link depends on (version script …)
    variables: tuple[tuple[str, str], ...] = ()  # extra bindings for the link edge
    entry_reads: tuple[str, ...] = ()  # build-dir files its entry-point sources force-include (portable.violations)


@dataclass(frozen=True)
class Edge:
    """One edge outside the compile/link pattern (a hook's: assemble, host C++ compile)."""

    rule: str
    out: str  # relative to the build dir
    inputs: tuple[str, ...]
    variables: tuple[tuple[str, str], ...] = ()  # its bindings; ("module", name) names its module
    implicit: tuple[str, ...] = ()  # files it reads that are not on its command line (an .S's .incbin files)

    @property
    def module(self) -> str | None:
        return dict(self.variables).get("module")


@dataclass(frozen=True)
class Graph:
    rules: Mapping[str, Mapping[str, str]]  # name -> {command, description, depfile, rspfile …}
    variables: Mapping[str, str]
    targets: tuple[Target, ...]
    extra_edges: tuple[Edge, ...] = ()
    priority: Mapping[str, float] = field(default_factory=dict)  # object -> expected seconds (bigger first)
    stamp: str | None = None  # a file every compile, link and extra edge depends on (the toolchain's identity)

    def owners(self) -> dict[str, str | None]:
        """Output (artifact, object, extra edge's output) -> the module it belongs to."""
        owners: dict[str, str | None] = {t.artifact: t.module for t in self.targets}
        owners.update({c.obj: t.module for t in self.targets for c in t.compiles})
        owners.update({e.out: e.module for e in self.extra_edges if e.module})
        return owners


def command_template(argv: Sequence[str]) -> str:
    """Join argv for a ninja rule: quote everything except ninja variables, and escape a ``$`` in the
    rest (a program or qola's own dir under ``/opt/q$x/``: ninja would read ``$x`` as a variable)."""
    return " ".join(a if a in _VARS or a.startswith("$") else ninja_syntax.escape(shlex.quote(a)) for a in argv)


def command_variable(steps: Sequence[Sequence[str]]) -> str:
    """Commands run one after the other (``&&``) as the value of a ninja variable a rule's command
    expands (``$archive_cmd``): shell-quoted, then ninja-escaped."""
    return ninja_syntax.escape(" && ".join(shlex.join(s) for s in steps))


_DOLLAR = re.compile(r"\$(?! )")


def escaped_path(p: str) -> str:
    """A path as a build line's output or input: ``ninja_syntax.Writer.build`` escapes space, colon and
    ``$ `` (:func:`ninja_syntax.escape_path`) but reads any other ``$`` as a variable; this escapes
    those, so that the writer's own escaping completes ninja's rules."""
    return _DOLLAR.sub("$$", p)


def _paths(ps: Sequence[str]) -> list[str]:
    return [escaped_path(p) for p in ps]


def escape_flags(flags: Sequence[str]) -> str:
    """A flag list as the value of a ninja variable (shell-quoted, ninja-escaped)."""
    return ninja_syntax.escape(" ".join(shlex.quote(f) for f in flags))


def _flags(value: str) -> list[str]:
    """A variable's value (:func:`escape_flags`) as its flag list again."""
    return shlex.split(value.replace("$$", "$"))


def check_portable(graph: Graph, build_dir: Path) -> None:
    """Refuse a graph with a compile line that would not replay from another directory once
    ``build_dir`` is gone (:mod:`qola.toolchain.portable`): every rule with a depfile (a compile),
    each flag variable and each edge's own flags, naming the flag, the rule or module, and why."""
    where = str(build_dir)
    found: list[str] = []
    entry = frozenset(r for t in graph.targets for r in t.entry_reads)
    compile_rules = {n for n, r in graph.rules.items() if "depfile" in r}
    for name in sorted(compile_rules):
        found += [f"rule {name}: {v}" for v in portable.violations(shlex.split(graph.rules[name]["command"]), where)]
    used = {c.flags_var for t in graph.targets for c in t.compiles}
    for var in sorted(used & set(graph.variables)):
        found += [f"{var}: {v}" for v in portable.violations(_flags(graph.variables[var]), where)]
    for extra in sorted({c.extra_flags for t in graph.targets for c in t.compiles if c.extra_flags}):
        found += [f"per-source flags: {v}" for v in portable.violations(extra, where, entry)]
    for e in graph.extra_edges:
        if e.rule in compile_rules:
            flags = dict(e.variables).get("flags", "")
            found += [f"{e.out}: {v}" for v in portable.violations(_flags(flags), where)]
    if found:
        raise QolaError(
            "a compile line would not replay from another directory once the build dir is gone "
            "(a client such as ck-jit records the flags and runs them later, elsewhere: docs/design-notes.md, "
            '"Portable compile lines"):\n  ' + "\n  ".join(found) + "\nName such files by absolute paths outside "
            f"{where}, or drop the flag."
        )


def write(graph: Graph, path: Path) -> None:
    """Write ``build.ninja`` (:func:`qola.core.fsutil.write_if_changed`: atomically, and an unchanged
    file keeps its mtime) once :func:`check_portable` passes. Lines are not wrapped: ninja_syntax's
    wrapping re-slices a long line at every break, quadratic in a link edge's thousands of objects."""
    check_portable(graph, path.parent)
    dep_rules = {n for n, r in graph.rules.items() if r.get("depfile") == DEPFILE}
    with io.StringIO() as fh:
        # ninja's stub types the output as a str; Writer writes to the text stream it is given
        w = ninja_syntax.Writer(fh, width=UNWRAPPED)  # type: ignore[arg-type]
        w.comment("generated by qola; do not edit")
        w.variable("ninja_required_version", "1.10")
        for name, value in sorted(graph.variables.items()):
            w.variable(name, value)
        w.newline()
        for name, rule in graph.rules.items():
            settings: Mapping[str, Any] = rule  # str values only (the stub's bool keywords are not used)
            w.rule(name, **settings)
            w.newline()
        stamp = [graph.stamp] if graph.stamp else []
        for e in graph.extra_edges:
            bound = {**dict(e.variables), **({"dep": portable.depfile_of(e.out)} if e.rule in dep_rules else {})}
            w.build(
                _paths([e.out]),
                e.rule,
                _paths(e.inputs),
                implicit=_paths([*e.implicit, *stamp]),
                variables=bound or None,
            )
        # ninja starts ready edges in file order: the expected-slowest compiles go first, across modules,
        # so a heavy source of the last module does not become the build's tail
        compiles = [(t, c) for t in graph.targets for c in t.compiles]
        compiles.sort(key=lambda tc: -graph.priority.get(tc[1].obj, 0.0))
        # the compile edges (the file's bulk: 25,000 of them take ninja_syntax 0.3 s): each binds its flags,
        # its device passes (a few distinct lists, escaped once) and its module
        lists = {c.archs for _, c in compiles if c.archs} | {c.device for _, c in compiles if c.device}
        passes = {a: escape_flags(a) for a in lists}
        for t, c in compiles:
            bindings = {"flags": f"${c.flags_var}" + (f" {escape_flags(c.extra_flags)}" if c.extra_flags else "")}
            if c.archs:
                bindings["archs"] = passes[c.archs]
            if c.device is not None:
                bindings["device"] = passes[c.device] if c.device else ""
            bindings["module"] = t.module
            bindings["dep"] = portable.depfile_of(c.obj)
            kind = COMPILE_RULE if c.device is None else HOST_RULE
            w.build([escaped_path(c.obj)], kind, [escaped_path(c.src)], implicit=_paths(stamp), variables=bindings)
        for t in graph.targets:
            objs = [c.obj for c in t.compiles]
            w.build(
                [escaped_path(t.artifact)],
                t.rule,
                _paths(objs + list(t.extra_inputs)),
                implicit=_paths([*t.implicit, *stamp]),
                variables={"ldflags": escape_flags(t.ldflags), "module": t.module, **dict(t.variables)},
            )
            w.build([f"module_{t.module}"], "phony", [escaped_path(t.artifact)])
            w.newline()
        if graph.targets:
            w.default([f"module_{t.module}" for t in graph.targets])
        write_if_changed(path, fh.getvalue())


def ninja_binary() -> str:
    exe = Path(ninja_pkg.BIN_DIR) / "ninja"
    if not exe.exists():
        raise QolaError("the ninja package is installed without its binary", hint="pip install --force-reinstall ninja")
    return str(exe)


@dataclass(frozen=True)
class NinjaRun:
    returncode: int
    failed_outputs: list[str]
    lines_by_module: dict[str, list[str]]  # compiler output (warnings, errors) per module
    log: list[str]


_DESC_RE = re.compile(r"^(?:CC|LINK|AR|AS|GEN) (\S+) ")


@dataclass(frozen=True)
class RunOptions:
    """How :func:`run` runs ninja: ``jobs``, the children's ``env``, ``owner`` (an output's module),
    the ``targets`` (none: nothing runs), ``dry_run`` (``-n``), ``verbose`` (``-v``), ``on_status``
    (ninja's progress: done, total, the edge started)."""

    jobs: int
    env: Mapping[str, str] | proc.ChildEnv
    owner: Callable[[str], str | None]
    targets: Sequence[str] = ()
    dry_run: bool = False
    verbose: bool = False
    on_status: Callable[[int, int, str], None] | None = None


def target_args(build_dir: Path, targets: Sequence[str]) -> list[str]:
    """``targets`` as ninja's command line names them: themselves while they fit
    (:func:`qola.core.argfile.fits`: one per module, tens of thousands of modules pass the OS's limit);
    past that, ninja reads no list from a file: they go into :data:`qola.compile.layout.TARGETS_FILE` beside the graph, a
    manifest that includes it and names them all as one phony target, and ninja reads that one
    (``-f``; the build log and deps stay the build dir's)."""
    if argfile.fits(targets):
        return list(targets)
    with io.StringIO() as fh:
        w = ninja_syntax.Writer(fh, width=UNWRAPPED)  # type: ignore[arg-type]
        w.comment("generated by qola for one run's targets; do not edit")
        w.include(layout.GRAPH)
        w.build([TARGETS], "phony", _paths(targets))
        write_if_changed(build_dir / layout.TARGETS_FILE, fh.getvalue())
    return ["-f", layout.TARGETS_FILE, TARGETS]


def run(build_dir: Path, how: RunOptions) -> NinjaRun:
    """Run ninja (-k 0); report progress; attribute compiler output to modules.

    Rule descriptions start with ``<VERB> <module> `` so the lines ninja prints after
    a status line belong to that module; ``FAILED: <out>`` is mapped with ``how.owner``.
    """
    jobs, env, owner, targets, on_status = how.jobs, how.env, how.owner, how.targets, how.on_status
    argv = [ninja_binary(), "-C", str(build_dir), "-k", "0", "-j", str(jobs)]
    if how.dry_run:
        argv.append("-n")
    if how.verbose:
        argv.append("-v")
    if not targets:
        return NinjaRun(0, [], {}, [])
    argv += target_args(build_dir, targets)
    child_env = proc.ChildEnv.of(env).plus({"NINJA_STATUS": STATUS})
    failed: list[str] = []
    by_module: dict[str, proc.Lines] = {}  # each bounded: a compiler printing gigabytes is cut, not held
    log = proc.Lines(NINJA_LOG_KEEP)
    current: str | None = None
    # its own process group; SIGTERM if qola dies (ninja then stops its compilers); ended on an exception
    with proc.started(argv, env=child_env) as child:
        assert child.stdout is not None
        for raw in proc.read_lines(child.stdout):
            line = raw.rstrip("\n")
            log.append(line)
            m = _STATUS_RE.match(line)
            if m:
                d = _DESC_RE.match(m.group(3))
                current = d.group(1) if d else None
                if on_status:
                    on_status(int(m.group(1)), int(m.group(2)), m.group(3))
                continue
            if line.startswith("FAILED: "):
                outs = [
                    o
                    for o in line[len("FAILED: ") :].split()  # ninja >= 1.12 says "FAILED: [code=1] out"
                    if not o.endswith(".d") and not (o.startswith("[code=") and o.endswith("]"))
                ]
                failed.extend(outs)
                current = next((mod for o in outs if (mod := owner(o))), current)
            if current is not None:
                by_module.setdefault(current, proc.Lines()).append(line)
        rc = child.wait()
    return NinjaRun(rc, failed, {k: v.lines() for k, v in by_module.items()}, log.lines())


def log_length(build_dir: Path) -> int:
    """A mark in ``.ninja_log`` (its size now) for :func:`compile_times`: a stat, not a read."""
    try:
        return (build_dir / ".ninja_log").stat().st_size
    except OSError:
        return 0


def compile_times(build_dir: Path, since: int = 0) -> dict[str, float]:
    """Seconds per output from the ``.ninja_log`` entries written after the mark ``since``
    (:func:`log_length`; 0: every entry). A log ninja recompacted meanwhile (shorter than the mark)
    counts whole."""
    times: dict[str, float] = {}
    try:
        data = (build_dir / ".ninja_log").read_bytes()
    except OSError:
        return times
    for line in data[since if since <= len(data) else 0 :].decode(errors="replace").splitlines():
        parts = line.split("\t")
        if len(parts) >= 4 and parts[0].isdigit() and parts[1].isdigit():
            times[parts[3]] = (int(parts[1]) - int(parts[0])) / 1000.0
    return times
