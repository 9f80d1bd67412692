"""A build's results as values: each module's :class:`ModuleResult` and the build's
:class:`CompileReport`, both frozen. A stage takes results and returns new ones
(:func:`dataclasses.replace`, :meth:`ModuleResult.failed`, :meth:`ModuleResult.noted`, :func:`settle`);
notes are returned as tuples the caller combines, never appended to another function's list.
"""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING

from qola.compile import ninja
from qola.core.errors import FailedProcessError, QolaError, tail

if (
    TYPE_CHECKING
):  # annotations only: the no-op path loads this module, not the plan's (tests/pipeline/test_noop_imports.py)
    from qola.plan.model import Plan
    from qola.toolchain import Toolchain


class Status(str, Enum):
    """A module's state in a build. A ``str``: the JSON and manifest.json spell it as before."""

    PENDING = "pending"  # not settled yet
    PLANNED = "planned"  # a dry run: it would build
    BUILT = "built"
    FAILED = "failed"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
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
    log: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    exports: tuple[str, ...] = ()
    headers: tuple[Path, ...] = ()

    @property
    def built(self) -> bool:
        return self.status == Status.BUILT

    def failed(self, exc: QolaError) -> ModuleResult:
        """This result failed by ``exc``: the summary shows its rendering, the log gets the whole output."""
        more: tuple[str, ...] = ()
        if isinstance(exc, FailedProcessError):
            more = (f"$ {shlex.join(exc.cmd)}", exc.output.rstrip(), f"(exit code {exc.returncode})")
        return dataclasses.replace(
            self,
            status=Status.FAILED,
            error=exc.message,
            detail=exc.render(),
            log=(*self.log, *more, exc.render()),
        )

    def noted(self, warnings: Iterable[str] = (), log: Iterable[str] = ()) -> ModuleResult:
        """This result with ``warnings`` added (each also a ``warning:`` line of its log), then ``log``."""
        warned = tuple(warnings)
        return dataclasses.replace(
            self,
            warnings=(*self.warnings, *warned),
            log=(*self.log, *(f"warning: {w}" for w in warned), *log),
        )


Results = Mapping[str, ModuleResult]  # module name -> its result


@dataclass(frozen=True)
class CompileReport:
    plan: Plan
    toolchain: Toolchain
    modules: tuple[ModuleResult, ...]
    build_dir: Path
    seconds: float
    ninja_log: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()  # build-wide, one line each (e.g. the hipconfig shim)
    stubs: tuple[str, ...] = ()  # objects the compiler left empty (a wrapper's stubs: :func:`empty_objects`)

    @property
    def ok(self) -> bool:
        return all(m.status == Status.BUILT for m in self.modules)

    def with_modules(self, results: Results) -> CompileReport:
        """This report with each module's result replaced by its entry in ``results`` (if any)."""
        return dataclasses.replace(self, modules=tuple(results.get(m.name, m) for m in self.modules))

    def noted(self, notes: Iterable[str]) -> CompileReport:
        return dataclasses.replace(self, notes=(*self.notes, *notes))


def new_results(plan: Plan) -> dict[str, ModuleResult]:
    return {m.name: ModuleResult(m.name, m.md_name, m.mode, m.link) for m in plan.modules}


@dataclass(frozen=True)
class Ran:
    """What :func:`settle` sorts: ninja's outcome and, per module it built, its artifact (relative to
    ``root``) and the seconds its edges took."""

    outcome: ninja.NinjaRun
    artifacts: Mapping[str, str]
    seconds: Mapping[str, float]
    root: Path
    owner: Callable[[str], str | None]
    dry_run: bool = False


def settle(results: Results, ran: Ran) -> dict[str, ModuleResult]:
    """The results of the modules ninja built, sorted from its outcome (the others as given): each
    gets its output lines and seconds, and is built, failed (a failed edge of its own, or no
    artifact) or, in a dry run, planned."""
    outcome = ran.outcome
    failed_mods = {ran.owner(o) for o in outcome.failed_outputs}
    out = dict(results)
    for name, artifact in ran.artifacts.items():
        r = results[name]
        r = dataclasses.replace(
            r,
            log=(*r.log, *outcome.lines_by_module.get(name, [])),
            seconds=r.codegen_seconds + ran.seconds.get(name, 0.0),
        )
        if ran.dry_run:
            r = dataclasses.replace(r, status=Status.PLANNED)
        elif name in failed_mods or not (ran.root / artifact).is_file():
            first = next((ln for ln in r.log if "error" in ln.lower()), None) or (r.log[0] if r.log else "")
            r = dataclasses.replace(
                r,
                status=Status.FAILED,
                error=r.error or (first.strip()[:300] or f"ninja exited {outcome.returncode}"),
                detail=r.detail or _failed_excerpt(r.log),
            )
        else:
            r = dataclasses.replace(r, status=Status.BUILT)
        out[name] = r
    if outcome.returncode != 0 and not failed_mods and not ran.dry_run and all(r.built for r in out.values()):
        raise QolaError("ninja failed without naming a failed edge:\n" + "\n".join(outcome.log[-20:]))
    return out


def _failed_excerpt(log: tuple[str, ...]) -> str | None:
    """From ninja's first ``FAILED:`` line of a module on (the command and the compiler's output), bounded."""
    at = next((i for i, ln in enumerate(log) if ln.startswith("FAILED: ")), None)
    return None if at is None else "error: " + tail("\n".join(log[at:]))


def empty_objects(graph_objects: Mapping[str, Sequence[str]], root: Path) -> dict[str, tuple[str, ...]]:
    """{module: its objects of zero bytes} for each module whose compiler left any object empty: a
    compiler wrapper's stub in place of compiled code (ck-jit's interceptor writes one for every CK
    kernel it defers to first use, and records how to compile it). Read from the files after ninja ran."""
    out: dict[str, tuple[str, ...]] = {}
    for module, objs in graph_objects.items():
        empty = tuple(o for o in objs if (root / o).is_file() and (root / o).stat().st_size == 0)
        if empty:
            out[module] = empty
    return out


def forget_stubs(stubs: Iterable[str], root: Path) -> None:
    """Remove the empty objects once linked: an empty object is no compiled code, so no later build may
    take it as up to date. The next build compiles those units again through the wrapper, which
    records them anew (ck-jit clears its records before every build and links from what it saw)."""
    for rel in stubs:
        (root / rel).unlink(missing_ok=True)


def stub_notes(
    empty: Mapping[str, Sequence[str]], totals: Mapping[str, int], compiler: str, log_of: Callable[[str], Path]
) -> tuple[str, ...]:
    """What the build's summary says of :func:`empty_objects`: per module, how many objects the compiler
    wrapper left empty and where its own words about them are."""
    return tuple(
        f"{module}: {len(objs)} of {totals[module]} objects are empty (0 bytes): the compiler {compiler} (a "
        f"wrapper) left stubs in place of compiled code, to be compiled later from its own records (ck-jit: "
        f"$CK_JIT_TMP_DIR/manifest.json.ndjson; its [CK-JIT] lines are in {log_of(module)}); the next build "
        "hands them to it again"
        for module, objs in sorted(empty.items())
    )
