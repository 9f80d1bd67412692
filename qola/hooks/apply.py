"""Stage 7 of a build: each buildable module's :class:`~qola.compile.extras.ModuleExtra` from the
hooks in order (the JIT's, then isolation's and embedding's, then the switch record's), computed,
not written (:func:`qola.compile.extras.write` writes them in stage 8)."""

from __future__ import annotations

from collections.abc import Mapping

from qola.compile.extras import ModuleExtra
from qola.compile.results import ModuleResult, Results
from qola.compile.steps import ModuleSources, Stage
from qola.core.errors import QolaError
from qola.hooks import isolation
from qola.hooks import jit as jitbuild
from qola.output import kernels
from qola.toolchain.env import ToolchainEnv


def extras(
    stage: Stage,
    srcs: Mapping[str, ModuleSources],
    results: Results,
    env: ToolchainEnv,
    *,
    isolate: bool,
    build_key: str = "",
) -> tuple[dict[str, ModuleExtra], dict[str, ModuleResult]]:
    """(each buildable module's extra: the JIT's (deferred instances), then isolation's and
    embedding's; every module's result). A hook's QolaError fails its module only. ``build_key``
    goes into JIT tables (usage records name it)."""
    plan_, tc, layout = stage.plan, stage.tc, stage.layout
    compiler = jitbuild.compiler_of(plan_, tc, env)
    linking = isolation.Linking(isolate=isolate, discard_locals=tc.discard_locals)
    out: dict[str, ModuleExtra] = {}
    done = dict(results)
    for mod in plan_.modules:
        if mod.name not in srcs:
            continue
        try:
            jit = jitbuild.extra(mod, srcs[mod.name].generated, stage, compiler, build_key)
            more = jit.then(isolation.extra(mod, srcs[mod.name].all, jit, plan_, layout, how=linking))
            more = more.then(kernels.extra(mod, layout.obj_dir(mod.name)))  # the switch record (qola.output.kernels)
        except QolaError as exc:
            done[mod.name] = done[mod.name].failed(exc)
            continue
        done[mod.name] = done[mod.name].noted(more.warnings)
        out[mod.name] = more
    return out, done
