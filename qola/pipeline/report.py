"""What :func:`qola.pipeline.run.build` tells its caller while it runs (:class:`Reporter`) and what it
did (:class:`BuildReport`). Light at import: the no-op path returns a report.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from qola.compile.layout import BuildLayout

if TYPE_CHECKING:
    from qola.compile.results import CompileReport, ModuleResult
    from qola.store.prebuilt import Installed, Packaged


class Reporter:
    """What :func:`build` tells its caller while it runs. This one says nothing."""

    def warning(self, text: str) -> None:
        """Something the user should know (a plan warning)."""

    def note(self, text: str) -> None:
        """Something qola did on its own (removed a killed run's leftovers)."""

    def info(self, text: str) -> None:
        """The build's one-line header (modules, toolchain, archs, jobs, build dir)."""

    def event(self, text: str) -> None:
        """A step finished (a generator ran or was up to date)."""

    def phase(self, name: str) -> None:
        """The build entered a phase ("generating", "compiling"): what a progress display names."""

    def status(self, done: int, total: int, text: str) -> None:
        """ninja's progress: ``done`` of ``total`` edges, the last one started."""

    @contextlib.contextmanager
    def running(self, dry_run: bool) -> Iterator[None]:
        """Around generating and compiling (a progress display lives here)."""
        yield


@dataclass(frozen=True)
class BuildReport:
    """What :func:`build` did. ``compiled`` is None when the no-op fast path answered or a prebuilt
    archive was installed (``prebuilt``)."""

    layout: BuildLayout
    compiled: CompileReport | None = None
    manifest_json: Path | None = None  # the published OUT/manifest.json (None: dry run, up to date)
    dry_run: bool = False
    key: str | None = None  # the build key (None: not computed: a dry run, the no-op fast path)
    prebuilt: Installed | None = None  # --prebuilt: the archive installed instead of building
    packaged: Packaged | None = None  # --publish: the archive written into the store
    note: str | None = None  # what a failed module left in OUT (nothing published; --keep-going's kept/absent)
    logs: Path | None = None  # nothing published: the dir of the failed modules' logs (else OUT/logs)

    @property
    def up_to_date(self) -> bool:
        return self.compiled is None and self.prebuilt is None

    @property
    def modules(self) -> tuple[ModuleResult, ...]:
        return () if self.compiled is None else self.compiled.modules

    @property
    def ok(self) -> bool:
        """Up to date, every module built, or (dry run) none failed."""
        if self.compiled is None:
            return True
        if self.dry_run:
            from qola.compile.results import Status  # lazy: the no-op path loads no compile stage

            return all(m.status != Status.FAILED for m in self.compiled.modules)
        return self.compiled.ok

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1
