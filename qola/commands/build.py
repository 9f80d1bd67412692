"""``qola build``: arguments in, :func:`qola.pipeline.run.build`, the summary out."""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from typing import TYPE_CHECKING, Any

from qola.commands.common import add_manifest_args, spec_of
from qola.core import settings
from qola.pipeline.run import Reporter, build

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from qola.compile.layout import BuildLayout
    from qola.compile.results import CompileReport

# light imports only: the pipeline loads the rest after the no-op fast path had its chance


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "build",
        help="build the manifest's modules into an output dir",
        description="Build every module of the manifest in one ninja graph and publish the results.",
    )
    add_manifest_args(p, settings.BUILD)  # and every declared setting a build takes (qola.core.settings)
    p.add_argument("--output-dir", "-o", required=True, help="where lib/, include/, manifest.json … land")
    p.add_argument("--build-dir", help="objects and generated sources (default: <output-dir>.build)")
    p.add_argument(
        "--dist",
        action="store_true",
        help="compile through sccache on the sccache-dist farm its config names; -j sized for the farm "
        "(HIP compiles locally: docs/distributed.md)",
    )
    _remote_flags(p)
    p.add_argument("--dry-run", action="store_true", help="write the graph and show what would run; O untouched")
    p.add_argument("--verbose", "-v", action="store_true", help="print every command")
    p.add_argument(
        "--quiet",
        "-q",
        action="store_true",
        help="no progress (without a terminal a line at each module's end and every 30 s; a bar on one)",
    )
    p.add_argument(
        "--no-isolation",
        action="store_true",
        help="debug: link cpp_itfs libraries without the version script (the audit then fails on leaks)",
    )
    _output_flags(p)
    p.set_defaults(func=run)


def _output_flags(p: argparse.ArgumentParser) -> None:
    """What a build does with OUT: --prebuilt, --publish, --keep-going."""
    p.add_argument(
        "--prebuilt",
        metavar="DIR|URL",
        help="install the archive of this build's key from DIR or an http(s) base URL instead of "
        "building (verified: sha256, safe unpacking, audit, key); build as usual when there is none",
    )
    p.add_argument(
        "--publish",
        dest="publish_to",
        metavar="DIR",
        help="after a successful build, store the output's archive (+ .sha256, .json) in DIR by its key",
    )
    p.add_argument(
        "--keep-going",
        action="store_true",
        help="a module failing, publish the modules that built (a failed one keeps the library OUT "
        "holds, else it is absent; exit 1); default: publish nothing and leave OUT as it was",
    )


def _remote_flags(p: argparse.ArgumentParser) -> None:
    """``--remote URL``'s options (docs/distributed.md; ``--remote`` is declared: qola.core.settings)."""
    p.add_argument("--remote-instance", metavar="NAME", help="the service's instance name (default: none)")
    p.add_argument("--remote-ca", metavar="PEM", help="CA certificate the service's TLS certificate is checked with")
    p.add_argument("--remote-client-cert", metavar="PEM", help="client certificate (mTLS; with --remote-client-key)")
    p.add_argument("--remote-client-key", metavar="PEM", help="client key (mTLS)")
    p.add_argument("--remote-token", metavar="FILE", help="a file holding the access token (sent as a bearer token)")
    p.add_argument(
        "--remote-fallback",
        action="store_true",
        help="when the service fails (unreachable, refused, a worker lost), compile that file locally "
        "(counted and named in the summary) instead of failing the build",
    )


def summary(report: CompileReport, console: Any, layout: BuildLayout | None = None, logs: Path | None = None) -> None:
    from rich.table import Table  # lazy: start-up of the CLI and of the no-op path

    table = Table(title=f"qola build — {len(report.modules)} module(s) in {report.seconds:.1f} s")
    for col in ("module", "status", "sources", "generated", "artifact", "time"):
        table.add_column(col, overflow="fold")
    for m in report.modules:
        style = {"built": "green", "failed": "red"}.get(m.status, "yellow")
        table.add_row(
            m.name,
            f"[{style}]{m.status}[/]",
            str(m.sources),
            str(m.generated),
            m.artifact.name if m.artifact and m.built else "-",
            f"{m.seconds:.1f} s",
        )
    console.print(table)
    problems(report, console, layout, logs)


def problems(report: CompileReport, console: Any, layout: BuildLayout | None = None, logs: Path | None = None) -> None:
    """Notes, warnings and every failed module's error (the command and the tail of its output),
    printed as plain text (no markup, no wrapping: commands stay copyable)."""
    from qola.compile.results import Status  # lazy: the no-op path loads no compile stage

    for note in report.notes:
        console.print(f"note: {note}", markup=False, highlight=False, soft_wrap=True)
    for m in report.modules:
        for w in m.warnings:
            console.print(f"warning: {w}", markup=False, highlight=False, soft_wrap=True)
    for m in report.modules:
        if m.status != Status.FAILED:
            continue
        text = m.detail or f"error: {m.error}"
        head, _, rest = text.partition("\n")
        head = head.removeprefix("error: ")
        console.print(
            f"error: {m.name} failed: {head}",
            *([rest] if rest else []),
            sep="\n",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
        if layout is not None:
            log = logs / f"{m.name}.log" if logs is not None else layout.log(m.name)
            console.print(f"  full log: {log}", markup=False, highlight=False, soft_wrap=True)


class RichReporter(Reporter):
    """Warnings and notes as plain lines on stderr; the build's progress as a rich bar (transient) on a
    terminal, else as plain lines (:class:`qola.pipeline.progress.PlainProgress`: at each module's end
    and at least every 30 s, as a CI log needs them); nothing of it with ``quiet``; every command
    with --verbose."""

    REFRESH = 0.1  # seconds between progress updates (one per edge costs ~50 µs: a second at 25,000 edges)

    def __init__(self, verbose: bool, quiet: bool = False, console: Any = None) -> None:
        self.verbose, self.quiet = verbose, quiet
        self.progress: Any = None  # rich's Progress while running on a terminal
        self.plain: Any = None  # PlainProgress while running without one
        self.task: Any = None
        self._console: Any = console
        self._updated = 0.0

    @property
    def console(self) -> Any:
        if self._console is None:  # rich loads only when something is shown (not for a no-op)
            from rich.console import Console  # lazy: start-up of the CLI and of the no-op path

            self._console = Console(stderr=True)
        return self._console

    def line(self, text: str) -> None:
        self.console.print(text, markup=False, highlight=False, soft_wrap=True)

    def warning(self, text: str) -> None:
        print(f"warning: {text}", file=sys.stderr)

    def note(self, text: str) -> None:
        self.line(f"note: {text}")

    def info(self, text: str) -> None:
        if not self.quiet:
            self.line(text)  # unwrapped: its paths stay copyable

    def event(self, text: str) -> None:
        if self.verbose:
            (self.progress.console if self.progress else self.console).print(text)

    def phase(self, name: str) -> None:
        if self.progress is not None:
            self.progress.update(self.task, description=name)
        if self.plain is not None:
            self.plain.phase(name)

    def status(self, done: int, total: int, text: str) -> None:
        now = time.monotonic()
        if self.progress is not None and (done >= total or now - self._updated >= self.REFRESH):
            self._updated = now
            self.progress.update(self.task, completed=done, total=total, description=text[:60])
        if self.plain is not None:
            self.plain.status(done, total, text)
        if self.verbose:
            self.console.print(text)

    @contextlib.contextmanager
    def running(self, dry_run: bool) -> Iterator[None]:
        if dry_run or self.quiet:
            yield
            return
        if not self.console.is_terminal:  # a pipe or a file: plain lines, on a clock of their own
            from qola.pipeline import progress as plain  # lazy: start-up of the CLI and of the no-op path

            self.plain = plain.PlainProgress(self.line, running=plain.running_units)
            try:
                with plain.Ticker(self.plain.tick):
                    yield
            finally:
                self.plain = None
            return
        from rich.progress import (  # lazy: start-up of the CLI and of the no-op path
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=self.console,
            transient=True,
        ) as progress:
            self.progress, self.task = progress, progress.add_task("starting", total=None)
            try:
                yield
            finally:
                self.progress = None


def run(args: argparse.Namespace) -> int:
    spec = spec_of(args)
    reporter = RichReporter(spec.verbose, quiet=args.quiet)
    report = build(spec, reporter)
    out = report.layout.out
    if report.up_to_date:
        print(f"qola: {out} is up to date (nothing to do)", file=sys.stderr)
        return 0
    compiled = report.compiled
    if report.prebuilt is not None:
        reporter.line(
            f"qola: installed prebuilt {report.prebuilt.origin} (build key {(report.key or '')[:16]}…) "
            f"into {report.prebuilt.out}; nothing compiled"
        )
        reporter.line(f"manifest: {report.manifest_json}")
        return 0
    assert compiled is not None  # neither up to date nor installed: compiled
    if report.dry_run:
        for line in compiled.ninja_log:
            print(line)
        problems(compiled, reporter.console)
        reporter.console.print(f"dry run: graph written to {report.layout.graph}; {out} untouched")
        return report.exit_code
    summary(compiled, reporter.console, report.layout, report.logs)
    if report.note:
        print(f"{'error' if report.manifest_json is None else 'warning'}: {report.note}", file=sys.stderr)
    if report.manifest_json is not None:
        reporter.console.print(f"manifest: {report.manifest_json}")
    if report.key:
        reporter.line(f"build key: {report.key}")
    if report.packaged is not None:
        reporter.line(f"published: {report.packaged.archive}")
    return report.exit_code
