"""Variant matrices (``[[mha_fwd_variants]]``, ``[[mha_bwd_variants]]``, ``[[variants]]``) → generator filters.

Each declared variant (options: scalar, list, or omitted = all) expands to a de-duplicated cartesian
product; each concrete variant becomes fnmatch patterns on kernel names. For CK only the option
tokens (``lse``/``nlse``, …) are known here: which of them a kernel kind carries, their order, and
the dtypes are learned from the generator's own unfiltered ``--list_blobs``, and every pattern is
checked to select exactly the listed names whose parsed options satisfy the variant. CK's backward
generator matches its filter per trait, not per name (:mod:`qola.plan.ckfilter`): each CK filter is
written for that (:meth:`Resolution.filter`) and the generator is listed under it to check it writes
what the patterns select (:meth:`Resolution.verify`).

Several variants, one run. CK's ``--filter`` is one fnmatch pattern per kernel kind
(``dot_do_o@convert_dq@dq_dk_dv``, ``combine@splitkv``) and CK writes its dispatch file from exactly
the kernels that pass the filter in *that* run, so per-variant runs into one dir would leave an API
covering only the last run. qola runs CK once through ``data/genwrap/filter_any.py``, which makes
``p1|p2`` mean any of them: CK writes the union and an API over the union. Other generators (the
example tree's) take ``,``-separated any-of patterns themselves and run unwrapped.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import itertools
import math
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from qola.core.errors import QolaError
from qola.plan import ckfilter, genrules, receipts
from qola.plan.cknames import (
    FAMILY,
    NARROW,
    SLOTS,
    Layout,
    check_value,
    kind_of,
    learn,
    narrow,
    patterns,
    stated_by,
)
from qola.plan.listing import (
    ANY_CK,
    ANY_PLAIN,
    ARCH_SUFFIX,
    NOT,
    GenEnv,
    GeneratorEnv,
    flavor_of,
    is_api,
    kernel_name,
    list_blobs,
    shim,
)
from qola.plan.manifest import MAX_VARIANTS, Manifest, VariantSection
from qola.plan.manifest import _MhaVariant as MhaVariant
from qola.plan.model import Generator, ModulePlan, Plan

__all__ = [  # with the names of qola.plan.listing and qola.plan.cknames its callers use
    "ANY_CK",
    "ANY_PLAIN",
    "ARCH_SUFFIX",
    "FAMILY",
    "NOT",
    "SLOTS",
    "GenEnv",
    "Generator",
    "GeneratorEnv",
    "Resolution",
    "Selection",
    "apply",
    "expand",
    "filters",
    "flavor_of",
    "is_api",
    "join_filter",
    "kernel_name",
    "kind_of",
    "list_blobs",
    "resolve",
    "shim",
    "with_filters",
]


@dataclass(frozen=True)
class Selection:
    """One concrete variant on one generator: any of ``patterns`` (per kernel kind) selects it."""

    module: str
    generator: int  # index into the module's generators
    source: str  # manifest key, e.g. "mha_fwd_variants[0]"
    options: tuple[tuple[str, Any], ...]
    kinds: tuple[tuple[str, ...], ...]  # per kernel kind (CK's @ components), any-of patterns
    flavor: str  # "ck" | "plain"
    exclude: tuple[str, ...] = ()  # globs no selected name matches (a receipt qola applies: qola.plan.receipts)

    @property
    def filter(self) -> str:
        return join_filter([self], self.flavor)


def join_filter(sels: Sequence[Selection], flavor: str) -> str:
    """One ``--filter`` value selecting any of ``sels`` (``,`` any-of for plain generators, ``|`` per CK kind)."""
    if flavor == "plain":
        return ANY_PLAIN.join(dict.fromkeys(p for s in sels for alts in s.kinds for p in alts))
    nots = "".join(f"{ANY_CK}{NOT}{g}" for g in dict.fromkeys(g for s in sels for g in s.exclude))
    return "@".join(_component(sels, i) + nots for i in range(max(len(s.kinds) for s in sels)))


def _component(sels: Sequence[Selection], i: int) -> str:
    alts = [p for s in sels for p in (s.kinds[i] if i < len(s.kinds) else ("*",))]
    return "*" if "*" in alts else ANY_CK.join(dict.fromkeys(alts))


def expand(options: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Cartesian product of ``options`` (scalar | list; None = omitted, i.e. unconstrained), de-duplicated."""
    items = [
        (k, list({(type(x), x): x for x in (v if isinstance(v, list) else [v])}.values()))
        for k, v in options.items()
        if v is not None
    ]
    total = math.prod(len(v) for _, v in items)  # the manifest bounds it; computed before expanding anyway
    if total > MAX_VARIANTS:
        raise QolaError(
            f"variant options expand to {total:,} variants; at most {MAX_VARIANTS:,} per table",
            hint="split the table, or leave an option out (omitted = every value)",
        )
    out = [dict(zip([k for k, _ in items], combo)) for combo in itertools.product(*(v for _, v in items))]
    return list({tuple((k, type(v).__name__, v) for k, v in d.items()): d for d in out}.values())


@dataclass
class Resolution:
    """Every selection, per (module, generator index), with the unfiltered listing it was checked against."""

    plan: Plan
    selections: list[Selection]
    listings: dict[tuple[str, int], list[str]]  # unfiltered file stems

    def generators(self) -> list[tuple[ModulePlan, int, list[Selection]]]:
        pick = [
            (m, i, [s for s in self.selections if (s.module, s.generator) == (m.name, i)])
            for m in self.plan.modules
            for i in range(len(m.generators))
        ]
        return [p for p in pick if p[2]]

    def filter(self, mod: ModulePlan, i: int, sels: Sequence[Selection]) -> str:
        """The ``--filter`` of generator ``i`` of ``mod`` selecting any of ``sels``: :func:`join_filter`,
        for CK with its companion kinds written for CK's per-trait match (:func:`ckfilter.for_traits`)."""
        filt = join_filter(sels, sels[0].flavor)
        if sels[0].flavor != "ck":
            return filt
        return ckfilter.for_traits(mod.generators[i].direction, filt, self.listings[(mod.name, i)])

    def verify(self, env: GenEnv, chosen: Mapping[tuple[str, int], str]) -> None:
        """Raise QolaError where a CK generator, listed under its ``chosen`` :meth:`filter`, would
        not write exactly what the filter selects name by name (:func:`ckfilter.verify`)."""
        genv = GeneratorEnv.of(env).for_plan(self.plan)
        for mod, i, sels in self.generators():
            if sels[0].flavor == "ck":
                where = f"module {mod.name}: {', '.join(dict.fromkeys(s.source for s in sels))}"
                listing = self.listings[(mod.name, i)]
                ckfilter.verify(mod.generators[i], genv, chosen[(mod.name, i)], listing, where, implied=True)


def _modules_for(plan: Plan, wanted: str | None, where: str) -> list[ModulePlan]:
    if wanted is None:
        return list(plan.modules)
    mod = next((m for m in plan.modules if m.name == wanted), None)
    if mod is None:
        raise QolaError(
            f"{where}.module: module {wanted!r} is not built by this manifest",
            hint=f"modules in the plan: {', '.join(m.name for m in plan.modules) or 'none'}",
        )
    return [mod]


def _show(variant: Mapping[str, Any]) -> str:
    return "{" + ", ".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in variant.items()) + "}"


class _Lister:
    """Each generator's unfiltered listing, once per command; what each (module, generator) was
    checked against is kept for the :class:`Resolution`."""

    def __init__(self, env: GenEnv, python: str) -> None:
        self.env, self.python = env, python
        self.listings: dict[tuple[str, int], list[str]] = {}
        self.by_command: dict[str, list[str]] = {}

    def listed(self, gen: Generator) -> list[str]:
        if gen.command not in self.by_command:
            self.by_command[gen.command] = list_blobs(gen, self.env, python=self.python)
        return self.by_command[gen.command]

    def listing(self, mod: ModulePlan, i: int) -> list[str]:
        self.listings[(mod.name, i)] = self.listed(mod.generators[i])
        return self.listings[(mod.name, i)]


_Targeted = dict[tuple[Any, int, str], None]


def resolve(
    plan: Plan, manifest: Manifest, env: GenEnv, python: str = sys.executable, *, receipt_alone: bool = True
) -> Resolution:
    """Check every declared variant against its generators' unfiltered instance lists.

    Raises QolaError for a section naming a module outside the plan, an option value outside its
    space, a variant matching no instance, and a generator left with no variant. A receipt the
    manifest asks for that a CK generator does not know is handled first (:func:`receipts.mark`):
    the resolution's plan is the marked one; ``receipt_alone``: a generator under qola's receipt that
    no variant targets is selected by the receipt alone (what it generates; not what a subset such
    as ``[jit.aot]`` names).
    """
    lister = _Lister(GeneratorEnv.of(env).for_plan(plan), python)  # the generation's environment
    plan = receipts.mark(plan, lister.listed)
    sels: list[Selection] = []
    targeted: _Targeted = {}
    for fam, sections in (("fwd", manifest.mha_fwd_variants), ("bwd", manifest.mha_bwd_variants)):
        for n, sec in enumerate(sections):
            sels += _fmha_section(plan, (fam, n, sec), lister, targeted)
    for mod, i, fam in _receipt_only(plan, targeted) if receipt_alone else ():  # qola's receipt alone
        sels += _by_receipt(mod, i, fam, lister)
    for n, table in enumerate(manifest.variants):
        sels += _generic(plan, table, n, lister.listing)
    done = {(s.module, s.generator) for s in sels}
    for mod, i, fam in targeted:
        if (mod.name, i) not in done:
            raise QolaError(
                f"mha_{fam}_variants: no declared variant matches any instance of "
                f"{mod.name}: {mod.generators[i].command}",
                hint=f'add a variant for it, or drop_directions = ["{mod.generators[i].direction}"]',
            )
    return Resolution(plan, sels, lister.listings)


def _fmha_section(
    plan: Plan, section: tuple[str, int, MhaVariant], lister: _Lister, targeted: _Targeted
) -> list[Selection]:
    """The selections of ``mha_<fam>_variants[n]`` on the CK fMHA generators it targets (added to ``targeted``)."""
    fam, n, sec = section
    where = f"mha_{fam}_variants[{n}]"
    targets = [
        (m, i)
        for m in _modules_for(plan, sec.module, where)
        for i, g in enumerate(m.generators)
        if g.direction in FAMILY[fam] and flavor_of(g) == "ck" and not g.dispatch_only
    ]
    if not targets:
        raise QolaError(
            f"{where}: no module{' ' + sec.module if sec.module else ''} in the plan runs "
            f"CK's fMHA {fam} generator (directions {', '.join(FAMILY[fam])})",
            hint="variants filter CK's generate.py; check [[modules]] and drop_directions",
        )
    targeted.update({(m, i, fam): None for m, i in targets})
    layouts = {(mod.name, i): _layouts(mod, i, fam, lister.listing(mod, i)) for mod, i in targets}
    declared = {k: v for k, v in sec.model_dump(exclude={"module"}).items() if v is not None}
    dtypes = sorted({d for ls in layouts.values() for lay in ls for d in lay.dtypes})
    for opt, value in declared.items():
        for v in value if isinstance(value, list) else [value]:
            check_value(opt, v, dtypes, where)
    globs = declared.pop("name", None)  # any-of name globs: one variant, not a product
    sels: list[Selection] = []
    for variant in expand(declared):
        if globs is not None:
            variant["name"] = tuple(globs) if isinstance(globs, list) else (globs,)
        found = [s for mod, i in targets for s in _select(mod, i, fam, variant, layouts[(mod.name, i)], where)]
        if not found:
            raise QolaError(
                f"{where} {_show(variant)} matches no instance of "
                + "; ".join(f"{m.name}: {m.generators[i].command}" for m, i in targets),
                hint="remove or change that variant (check its options against the receipt)",
            )
        sels += found
    return sels


def _by_receipt(mod: ModulePlan, i: int, fam: str, lister: _Lister) -> list[Selection]:
    """A generator under qola's receipt that no variant targets: what the receipt selects."""
    rule = receipts.RULES[mod.generators[i].direction or ""]
    lays = _layouts(mod, i, fam, lister.listing(mod, i))
    found = _select(mod, i, fam, {}, lays, f"receipt {receipts.TE_RECEIPT}")
    if not found:
        raise QolaError(
            f"module {mod.name}: receipt {receipts.TE_RECEIPT} ({rule.options}) selects no instance of "
            f"{mod.generators[i].command}",
            hint="this CK's kernel names are not understood; report it",
        )
    return found


def _layouts(mod: ModulePlan, i: int, fam: str, names: list[str]) -> list[Layout]:
    """Per kernel kind of CK generator ``i`` of ``mod``, what its listed names carry."""
    gen = mod.generators[i]
    direction = gen.direction
    assert direction is not None  # a generator of a direction in FAMILY[fam]
    by_kind: list[list[str]] = [[] for _ in genrules.CK_KINDS[direction]]
    for stem in names:
        if not is_api(stem):
            name = kernel_name(stem, "ck")
            by_kind[kind_of(name, direction)].append(name)
    return [learn(sorted(set(k)), fam, f"{mod.name}: {gen.command}") for k in by_kind]


def _select(
    mod: ModulePlan, i: int, fam: str, variant: Mapping[str, Any], lays: list[Layout], where: str
) -> list[Selection]:
    """The selections of one concrete variant on CK generator ``i`` (none: it matches no instance);
    a receipt qola applies on the generator narrows the variant (:func:`receipts.narrowed`)."""
    gen = mod.generators[i]
    rule = receipts.RULES.get(gen.direction or "") if gen.qola_receipt else None
    out = []
    for v in [dict(variant)] if rule is None else receipts.narrowed(variant, rule):
        slotted = {k: x for k, x in v.items() if k not in NARROW}
        kinds = tuple(
            narrow(patterns(stated_by(slotted, fam, lays, lay), fam, lay, f"{mod.name}: {gen.command}"), lay, v)
            for lay in lays
        )
        if all(kinds):
            exclude = rule.exclude if rule else ()
            out.append(Selection(mod.name, i, where, tuple(v.items()), kinds, "ck", exclude))
    return out


def _receipt_only(plan: Plan, targeted: Mapping[tuple[Any, int, str], None]) -> list[tuple[ModulePlan, int, str]]:
    """CK generators under a receipt qola applies that no declared variant targets."""
    seen = {(m.name, i) for m, i, _ in targeted}
    return [
        (m, i, fam)
        for m in plan.modules
        for i, g in enumerate(m.generators)
        for fam in FAMILY
        if g.qola_receipt
        and not g.dispatch_only
        and g.direction in FAMILY[fam]
        and (m.name, i) not in seen
        and g.direction in receipts.RULES
    ]


def _generic(
    plan: Plan, sec: VariantSection, n: int, listing: Callable[[ModulePlan, int], list[str]]
) -> list[Selection]:
    where = f"variants[{n}]"
    mod = _modules_for(plan, sec.module, where)[0]
    gens = [
        i
        for i, g in enumerate(mod.generators)
        if not g.dispatch_only and (sec.generator is None or sec.generator in g.command)
    ]
    if not gens:
        raise QolaError(
            f"{where}.generator: {sec.generator!r} is in no generator command of module {mod.name}",
            hint="its generators: " + ("; ".join(g.command for g in mod.generators) or "none"),
        )
    holes = set(re.findall(r"\{(\w+)\}", sec.pattern))
    for opt in list(sec.options) + list(sec.tokens):
        if opt not in holes:
            raise QolaError(f"{where}: option {opt!r} has no {{{opt}}} placeholder in pattern {sec.pattern!r}")
    space = {o: [_key(k) for k in t] for o, t in sec.tokens.items()}
    for opt, value in sec.options.items():
        for v in value if isinstance(value, list) else [value]:
            if opt in space and _key(v) not in space[opt]:
                raise QolaError(
                    f"{where}.options.{opt}: {v!r} is not in its option space",
                    hint=f"values with a token: {', '.join(space[opt])}",
                )
    out = []
    for variant in expand(dict(sec.options)):
        pat = sec.pattern
        for hole in holes:
            chosen = variant.get(hole)
            tok = "*" if chosen is None else sec.tokens.get(hole, {}).get(_key(chosen), _key(chosen))
            pat = pat.replace(f"{{{hole}}}", tok)
        hits = 0
        for i in gens:
            flavor = flavor_of(mod.generators[i])
            names = [kernel_name(s, flavor) for s in listing(mod, i) if not is_api(s)]
            kinds = tuple((p,) for p in pat.split("@")) if flavor == "ck" else ((pat,),)
            if any(fnmatch.fnmatchcase(nm, p) for nm in names for alts in kinds for p in alts):
                hits += 1
                out.append(Selection(mod.name, i, where, tuple(variant.items()), kinds, flavor))
        if not hits:
            raise QolaError(
                f"{where} {_show(variant)}: pattern {pat!r} matches no instance of module {mod.name}",
                hint="check the pattern against the generator's --list_blobs output",
            )
    return out


def _key(v: Any) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


def filters(plan: Plan, manifest: Manifest, env: GenEnv) -> dict[tuple[str, int], str]:
    """(module, generator index) -> the ``--filter`` value selecting every declared variant."""
    res = resolve(plan, manifest, env)
    return {(mod.name, i): res.filter(mod, i, sels) for mod, i, sels in res.generators()}


def with_filters(plan: Plan, chosen: Mapping[tuple[str, int], str]) -> Plan:
    """The plan with each chosen generator's ``filter`` set; a CK generator whose filter names several
    patterns per kernel kind runs under the any-of shim (its ``wrapper``)."""
    mods = []
    for mod in plan.modules:
        gens = []
        for i, g in enumerate(mod.generators):
            if g.dispatch_only:  # a dropped direction keeps its no-kernel filter
                gens.append(g)
                continue
            filt = chosen.get((mod.name, i))
            wrap = str(shim()) if filt is not None and ANY_CK in filt and flavor_of(g) == "ck" else None
            gens.append(dataclasses.replace(g, filter=filt, wrapper=wrap))
        mods.append(dataclasses.replace(mod, generators=tuple(gens)))
    return dataclasses.replace(plan, modules=tuple(mods))


def apply(plan: Plan, manifest: Manifest, env: GenEnv) -> Plan:
    """The plan with the declared variants' generator filters (each checked against the generator's
    own listing), after a manifest receipt the tree's CK generator does not know is handled
    (:func:`qola.plan.receipts.mark`). No variants and no receipt applied: the plan as it is."""
    asked = any(g.asked_receipt for m in plan.modules for g in m.generators)
    if not (manifest.variants or manifest.mha_fwd_variants or manifest.mha_bwd_variants or asked):
        return plan
    res = resolve(plan, manifest, env)
    chosen = {(mod.name, i): res.filter(mod, i, sels) for mod, i, sels in res.generators()}
    res.verify(env, chosen)
    return with_filters(res.plan, chosen)
