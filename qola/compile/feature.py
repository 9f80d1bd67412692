"""One shape for a feature that spans stages (the JIT, isolation and embedding, the kernels' switch
record, ``[usage]``): a :class:`Feature` is a frozen set of its stage parts, each a function of
typed data, and a no-op where the feature has none:

* ``plan`` (stages 2-3): (Plan, Manifest, the generators' environment) -> Plan;
* ``extra`` (stage 7): per build, the function that gives each module's
  :class:`~qola.compile.extras.ModuleExtra` (its sources, and what the features before it added);
  ``rules`` (the ninja rules its edges name) and ``shared`` (the files every module reads);
* ``audit`` (stage 10): CompileReport -> CompileReport (``only``: the modules an incremental
  build relinked; None: all);
* ``publish`` (stage 11): the trees, records, headers and texts the new version of OUT holds
  (:class:`PublishItems`).

The features are registered in one ordered list (:data:`qola.pipeline.features.FEATURES`) and the
pipeline loops over it at each stage (:func:`planned`, :func:`extra_of`, :func:`audited`,
:func:`published`), in its order. This module sits in ``compile`` (below ``output``, ``hooks`` and
``store``) so that every feature may name its types; the list lives in ``pipeline``, which may
import them all. The anchor: cibuildwheel's platform modules (each platform one module exposing the
same functions, the main loop picks one) and Triton's cache managers (one interface, local and
remote implementations behind it).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from qola.compile.extras import FileWrite, ModuleExtra

if TYPE_CHECKING:
    from qola.compile.layout import BuildLayout
    from qola.compile.results import CompileReport
    from qola.compile.steps import ModuleSources, Stage
    from qola.plan.manifest import Manifest
    from qola.plan.model import ModulePlan, Plan
    from qola.plan.variants import GenEnv
    from qola.toolchain import Toolchain
    from qola.toolchain.env import ToolchainEnv

Rules = Mapping[str, Mapping[str, str]]  # ninja rule name -> its variables
Record = Mapping[str, object]  # what a feature adds to a module's record in manifest.json (JSON)


@dataclass(frozen=True)
class ExtraContext:
    """What stage 7 knows of the build: the plan, toolchain and layout (``stage``), the toolchain's
    view of the environment, ``--no-isolate`` and the build key (JIT tables name it)."""

    stage: Stage
    env: ToolchainEnv
    isolate: bool = True
    build_key: str = ""


class ModuleHook(Protocol):
    """A feature's stage-7 part for one build: ``mod``'s extra, given its sources and what the
    features before it added (``so_far``)."""

    def __call__(self, mod: ModulePlan, sources: ModuleSources, so_far: ModuleExtra) -> ModuleExtra: ...


@dataclass(frozen=True)
class PublishContext:
    """What stage 11 knows: the audited report, the report as published (``shown``: a failed module
    kept from the previous version shows as built), each module's extra, the build dir's layout."""

    compiled: CompileReport
    shown: CompileReport
    extras: Mapping[str, ModuleExtra]
    layout: BuildLayout


@dataclass(frozen=True)
class PublishItems:
    """What features put into a new version of OUT besides the libraries: ``headers`` (into
    include/), ``withdrawn`` (header names a failed module's earlier build left there), ``texts``
    (OUT-relative path -> text, None: removed), ``trees`` (OUT-relative dir -> build dir, None:
    removed), ``records`` (module -> keys added to its record in manifest.json)."""

    headers: tuple[Path, ...] = ()
    withdrawn: tuple[str, ...] = ()
    texts: Mapping[str, str | None] = field(default_factory=dict)
    trees: Mapping[str, Path | None] = field(default_factory=dict)
    records: Mapping[str, Record] = field(default_factory=dict)

    def then(self, other: PublishItems) -> PublishItems:
        """These items and ``other``'s: lists concatenate, ``other``'s keys win (a module's record merges)."""
        records = {k: dict(v) for k, v in self.records.items()}
        for name, rec in other.records.items():
            records[name] = {**records.get(name, {}), **rec}
        return PublishItems(
            headers=self.headers + other.headers,
            withdrawn=self.withdrawn + other.withdrawn,
            texts={**self.texts, **other.texts},
            trees={**self.trees, **other.trees},
            records=records,
        )


def _same_plan(plan: Plan, manifest: Manifest, env: GenEnv) -> Plan:
    return plan


def _nothing(mod: ModulePlan, sources: ModuleSources, so_far: ModuleExtra) -> ModuleExtra:
    return ModuleExtra()


def _no_extra(ctx: ExtraContext) -> ModuleHook:
    return _nothing


def _no_rules(tc: Toolchain) -> Rules:
    return {}


def _no_files(plan: Plan, layout: BuildLayout) -> tuple[FileWrite, ...]:
    return ()


def _same_report(report: CompileReport, only: Collection[str] | None) -> CompileReport:
    return report


def _no_items(ctx: PublishContext) -> PublishItems:
    return PublishItems()


@dataclass(frozen=True)
class Feature:
    """A feature's parts, one per stage it takes part in (the module's docstring); a part it does
    not give is a no-op."""

    name: str
    plan: Callable[[Plan, Manifest, GenEnv], Plan] = _same_plan
    extra: Callable[[ExtraContext], ModuleHook] = _no_extra
    rules: Callable[[Toolchain], Rules] = _no_rules
    shared: Callable[[Plan, BuildLayout], tuple[FileWrite, ...]] = _no_files
    audit: Callable[[CompileReport, Collection[str] | None], CompileReport] = _same_report
    publish: Callable[[PublishContext], PublishItems] = _no_items


def planned(features: Iterable[Feature], plan: Plan, manifest: Manifest, env: GenEnv) -> Plan:
    """Stage 3: each feature's plan part, in order."""
    for f in features:
        plan = f.plan(plan, manifest, env)
    return plan


def extra_of(hooks: Iterable[ModuleHook], mod: ModulePlan, sources: ModuleSources) -> ModuleExtra:
    """Stage 7 for one module: each feature's extra (``hooks``: their parts for this build), in
    order, each after what the ones before it added."""
    done = ModuleExtra()
    for hook in hooks:
        done = done.then(hook(mod, sources, done))
    return done


def rules_of(features: Iterable[Feature], tc: Toolchain) -> dict[str, Mapping[str, str]]:
    """The ninja rules every feature's edges name."""
    return {name: rule for f in features for name, rule in f.rules(tc).items()}


def shared_of(features: Iterable[Feature], plan: Plan, layout: BuildLayout) -> tuple[FileWrite, ...]:
    """The files every module's compiles and links read, of every feature."""
    return tuple(w for f in features for w in f.shared(plan, layout))


def audited(features: Iterable[Feature], report: CompileReport, only: Collection[str] | None = None) -> CompileReport:
    """Stage 10: each feature's audit, in order (``only``: of these modules; None: every one)."""
    for f in features:
        report = f.audit(report, only)
    return report


def published(features: Iterable[Feature], ctx: PublishContext) -> PublishItems:
    """Stage 11: every feature's items, in order."""
    items = PublishItems()
    for f in features:
        items = items.then(f.publish(ctx))
    return items
