"""The settings of a build as the machine answers them: :func:`requested` (every setting as resolved,
nothing asked: ``qola plan --json``), :func:`settings` (the launcher found on PATH, the ``--dist``
farm asked, the ``--remote`` endpoint), :func:`launcher`."""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from qola.core import settings as declared
from qola.core.errors import QolaError
from qola.pipeline.spec import BuildSpec, Given, Settings
from qola.pipeline.views import views

if TYPE_CHECKING:
    from qola.compile.executor import CacheReady, Where
    from qola.compile.layout import BuildLayout
    from qola.store.remote import Endpoint


def requested(spec: BuildSpec, given: Given, env: Mapping[str, str], layout: BuildLayout | None = None) -> Settings:
    """Every setting as :func:`qola.pipeline.begin.ask` resolved it (``given``), nothing on the
    machine asked; ``-j`` given by no source: AITER's cpu/memory rule."""
    from qola.toolchain import default_jobs  # lazy: start-up of the CLI and of the no-op path

    child, tenv, genv = views(env)
    return Settings(
        layout=layout,
        jobs=given[declared.JOBS] or default_jobs({}),
        launcher=given[declared.LAUNCHER],
        dry_run=spec.dry_run,
        verbose=spec.verbose,
        isolate=spec.isolate,
        record_ahead=given[declared.RECORD_AHEAD],
        remote=_remote(spec, given),
        child=child,
        toolchain_env=tenv,
        generator_env=genv,
    )


def settings(
    spec: BuildSpec, given: Given, layout: BuildLayout, env: Mapping[str, str], vendor: str | None = None
) -> Settings:
    """:func:`requested`, then the machine asked: where the compiles run, one value
    (:func:`qola.compile.executor.choose`: a launcher or ``--dist``'s farm, ``vendor``: the plan's,
    "cuda" or "hip", deciding the launcher, ``-j`` and farm; or the ``--remote`` service)."""
    from qola.compile import executor  # lazy: start-up of the CLI and of the no-op path

    asked = requested(spec, given, env, layout)
    service = None
    if asked.remote is not None:
        from qola.store import remote  # lazy: start-up of the CLI and of the no-op path

        service = remote.service(asked.remote, asked.jobs, remote.RemoteUse(spec.remote_fallback, asked.dry_run))
    ex = executor.choose(
        executor.Asked(spec.dist, vendor, asked.launcher, asked.jobs, given.values.by_flag(declared.JOBS), service),
        find=lambda name, hint: launcher(name, env, hint),
        env=asked.child,
    )
    if isinstance(ex, executor.Local) and ex.launcher is None and not asked.dry_run:
        ex = dataclasses.replace(ex, cache=_cache(given[declared.NO_CACHE], env))
    return dataclasses.replace(asked, jobs=ex.jobs, launcher=ex.launcher, farm=ex.farm, notes=ex.notes, executor=ex)


def _cache(off: bool, env: Mapping[str, str]) -> Callable[[Where], CacheReady] | None:
    """A local build's compile cache (:mod:`qola.store.ccache`), prepared once the toolchain is
    known; None: ``--no-cache``."""
    from qola.compile.executor import CacheReady  # lazy: start-up of the CLI and of the no-op path
    from qola.store import ccache  # lazy: start-up of the CLI and of the no-op path

    use = ccache.wanted(env, off)
    if use is None:
        return None

    def connect(where: Where) -> CacheReady:
        script = ccache.prepare(use, where.toolchain, where.build_dir, where.tree_root, where.env)
        return CacheReady(script, str(use.dir), lambda: ccache.trim(use))

    return connect


def _remote(spec: BuildSpec, given: Given) -> Endpoint | None:
    """--remote URL > [build].remote; the other options from the command line only (they are this
    machine's files: certificates, a token)."""
    from qola.store.remote import endpoint  # lazy: light

    o = spec.remote_options
    return endpoint(
        given[declared.REMOTE],
        instance=o.get("instance"),
        ca=o.get("ca"),
        cert=o.get("cert"),
        key=o.get("key"),
        token=o.get("token"),
    )


def launcher(name: str | None, env: Mapping[str, str], hint: str | None = None) -> str | None:
    """The compiler launcher's path on the build's PATH (None: no launcher)."""
    if not name:
        return None
    found = shutil.which(name, path=env.get("PATH"))
    if not found:
        raise QolaError(
            f"compiler launcher {name!r} not found on PATH",
            hint=hint or f"install it (pip install {name} / apt-get install {name}) or drop --launcher",
        )
    return found
