"""Module groups (QoLA's ``[[modules]].group``): which of the manifest's modules a build selects.

``--group G`` (repeatable, each a ``;``-separated list), else ``QOLA_BUILD_GROUPS`` (a
``;``-separated list), selects the modules whose ``group`` is one of them; modules without a group
are left out while a selection is active, and every module is built when none is (QoLA's
semantics). A group no module declares is an error naming the declared ones, before anything runs.

The selection is applied to the manifest itself (:func:`select`): the modules, and the variant
tables and ``[jit]`` entries that name a module left out. Unnamed CK fMHA variant tables apply to
whatever modules of the plan run CK's generator of their family; :func:`prune` drops those no
selected module runs (:func:`qola.pipeline.prepare.prepare` calls it once the plan is made).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from qola.core.errors import QolaError

if TYPE_CHECKING:
    from qola.plan.manifest import Manifest
    from qola.plan.model import Plan


def declared(manifest: Manifest) -> dict[str, list[str]]:
    """group -> the names of its modules, in manifest order."""
    found: dict[str, list[str]] = {}
    for m in manifest.modules:
        if m.group is not None:
            found.setdefault(m.group, []).append(m.name)
    return found


def check(manifest: Manifest, names: Iterable[str], where: str) -> dict[str, list[str]]:
    """The selected groups' modules (group -> module names); QolaError for a group the manifest
    does not declare."""
    have = declared(manifest)
    unknown = [g for g in names if g not in have]
    if unknown:
        shown = ", ".join(repr(g) for g in sorted(have)) or "none (no [[modules]] entry has a group key)"
        raise QolaError(
            f"{where}: unknown module group(s) {', '.join(repr(g) for g in unknown)}",
            hint=f"the manifest declares the groups: {shown}",
            where=manifest.path or None,
        )
    return {g: have[g] for g in names}


def select(manifest: Manifest, names: Sequence[str], where: str) -> Manifest:
    """The manifest narrowed to the modules of ``names`` (every module when ``names`` is empty)."""
    if not names:
        return manifest
    chosen = {m for mods in check(manifest, names, where).values() for m in mods}
    keep = [m for m in manifest.modules if m.name in chosen]
    update: dict[str, Any] = {"modules": keep}
    for key in ("variants", "mha_fwd_variants", "mha_bwd_variants"):
        update[key] = [t for t in getattr(manifest, key) if getattr(t, "module", None) in (None, *chosen)]
    if manifest.jit is not None:
        jit = manifest.jit
        aot = jit.aot.model_copy(
            update={
                key: [t for t in getattr(jit.aot, key) if getattr(t, "module", None) in (None, *chosen)]
                for key in ("variants", "mha_fwd_variants", "mha_bwd_variants")
            }
        )
        mods = None if jit.modules is None else [m for m in jit.modules if m in chosen]
        update["jit"] = jit.model_copy(update={"modules": mods, "aot": aot})
    if manifest.usage is not None:  # recorded variants of modules left out go with them
        update["usage"] = manifest.usage.model_copy(
            update={"variants": [v for v in manifest.usage.variants if v.module in chosen]}
        )
    return manifest.model_copy(update=update)


def prune(manifest: Manifest, plan: Plan) -> Manifest:
    """Drop the unnamed CK fMHA variant tables (top level and ``[jit.aot]``) of a family no module
    of the (group-selected) plan generates."""
    from qola.plan import genrules  # lazy: paid only by the callers that need it
    from qola.plan.variants import FAMILY  # lazy: paid only by the callers that need it

    runs = {
        fam
        for fam, dirs in FAMILY.items()
        for m in plan.modules
        for g in m.generators
        if g.direction in dirs and genrules.flavor_of(g.script) == "ck" and not g.dispatch_only
    }

    def kept(tables: list[Any], fam: str) -> list[Any]:
        return [t for t in tables if t.module is not None or fam in runs]

    update: dict[str, Any] = {
        "mha_fwd_variants": kept(manifest.mha_fwd_variants, "fwd"),
        "mha_bwd_variants": kept(manifest.mha_bwd_variants, "bwd"),
    }
    if manifest.jit is not None:
        aot = manifest.jit.aot.model_copy(
            update={
                "mha_fwd_variants": kept(manifest.jit.aot.mha_fwd_variants, "fwd"),
                "mha_bwd_variants": kept(manifest.jit.aot.mha_bwd_variants, "bwd"),
            }
        )
        update["jit"] = manifest.jit.model_copy(update={"aot": aot})
    return manifest.model_copy(update=update)
