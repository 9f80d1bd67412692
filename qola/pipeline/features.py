"""The features that span stages, in the one order every stage takes them (:mod:`qola.compile.feature`
says what a feature is): the JIT (its split in the plan, its deferred units), isolation and
embedding (links, code objects, the ELF audit, headers and consumer files), the kernels' switch
record (probe headers), and ``[usage]`` (exactly the recorded variants ahead, after the JIT split).
:mod:`qola.pipeline.run`, :mod:`qola.hooks.apply` and :mod:`qola.pipeline.finish` loop over
:data:`FEATURES`; a new feature is one :class:`~qola.compile.feature.Feature` added here (CONTRIBUTING.md,
"A feature across stages")."""

from __future__ import annotations

from typing import TYPE_CHECKING

from qola.compile.feature import Feature
from qola.hooks import isolation
from qola.hooks import jit as jitbuild
from qola.output import kernels

if TYPE_CHECKING:
    from qola.plan.manifest import Manifest
    from qola.plan.model import Plan
    from qola.plan.variants import GenEnv


def _usage(plan: Plan, manifest: Manifest, env: GenEnv) -> Plan:
    """``[usage]``'s plan part (:func:`qola.store.usage.apply.apply`), imported only when a plan is made."""
    from qola.store.usage import apply  # lazy: the planner (pydantic); the incremental path audits without it

    return apply.apply(plan, manifest, env)


USAGE = Feature("usage", plan=_usage)

# the order of every stage: the JIT's extra before isolation's (isolation archives the JIT's objects),
# the switch record's last; [usage] after the JIT split (its variants join [jit.aot]'s)
FEATURES: tuple[Feature, ...] = (jitbuild.FEATURE, isolation.FEATURE, kernels.FEATURE, USAGE)
