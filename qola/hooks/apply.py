"""Stage 7 of a build: each buildable module's :class:`~qola.compile.extras.ModuleExtra` from the
features' extra parts in their order (:data:`qola.pipeline.features.FEATURES`: the JIT's, then
isolation's and embedding's, then the switch record's), computed, not written
(:func:`qola.compile.extras.write` writes them in stage 8)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from qola.compile.extras import ModuleExtra
from qola.compile.feature import ExtraContext, Feature, extra_of
from qola.compile.results import ModuleResult, Results
from qola.compile.steps import ModuleSources
from qola.core.errors import QolaError


def extras(
    features: Iterable[Feature], ctx: ExtraContext, srcs: Mapping[str, ModuleSources], results: Results
) -> tuple[dict[str, ModuleExtra], dict[str, ModuleResult]]:
    """(each buildable module's extra: every feature's, in order; every module's result). A
    feature's QolaError fails its module only; its warnings join the module's."""
    hooks = [f.extra(ctx) for f in features]
    out: dict[str, ModuleExtra] = {}
    done = dict(results)
    for mod in ctx.stage.plan.modules:
        if mod.name not in srcs:
            continue
        try:
            more = extra_of(hooks, mod, srcs[mod.name])
        except QolaError as exc:
            done[mod.name] = done[mod.name].failed(exc)
            continue
        done[mod.name] = done[mod.name].noted(more.warnings)
        out[mod.name] = more
    return out, done
