"""Variant matrices (``[[mha_fwd_variants]]``, ``[[mha_bwd_variants]]``, ``[[variants]]``) → generator filters.

Each declared variant (options: scalar, list, or omitted = all) expands to a de-duplicated cartesian
product; each concrete variant becomes fnmatch patterns on kernel names. For CK only the option
tokens (``lse``/``nlse``, …) are known here: which of them a kernel kind carries, their order, and
the dtypes are learned from the generator's own unfiltered ``--list_blobs``, and every pattern is
checked to select exactly the listed names whose parsed options satisfy the variant.

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
from pathlib import Path
from typing import Any

from qola.core import deadlines, inputs
from qola.core import proc as runner
from qola.core.errors import QolaError
from qola.core.fsutil import pid_tempdir
from qola.plan import genrules, listcache, receipts
from qola.plan.manifest import MAX_VARIANTS, Manifest, VariantSection
from qola.plan.planner import OUTPUT_DIR, Generator, ModulePlan, Plan
from qola.plan.registry import genwrap_script

ANY_CK, ANY_PLAIN, NOT = "|", ",", "!"  # the shim's any-of separator; a "!" part excludes what it matches
ARCH_SUFFIX = re.compile(r"_gfx[0-9a-z]+$")  # CK's per-arch filename_suffix (not part of the kernel name)
HDIM = re.compile(r"^d[0-9]+$")

FAMILY = {"fwd": ("fwd", "fwd_splitkv", "batch_prefill"), "bwd": ("bwd",)}
# slot -> (options, {token: their values}); a slot holds at most one token of a kernel name.
_Slot = tuple[tuple[str, ...], dict[str, tuple[bool, ...]]]
_BIAS: _Slot = (("has_bias", "has_alibi"), {"nbias": (False, False), "bias": (True, False), "alibi": (False, True)})


def _flag(option: str, token: str) -> _Slot:
    return (option,), {f"n{token}": (False,), token: (True,)}


SLOTS: dict[str, dict[str, _Slot]] = {
    "fwd": {
        "bias": _BIAS,
        "mask": _flag("has_mask", "mask"),
        "lse": _flag("has_lse", "lse"),
        "logits": _flag("has_logits", "logits"),
        "dropout": _flag("has_dropout", "dropout"),
        "skip": _flag("has_skip", "skip"),
        "sink": _flag("has_sink", "sink"),
    },
    "bwd": {
        "bias": _BIAS,
        "dbias": _flag("has_dbias", "dbias"),
        "mask": _flag("has_mask", "mask"),
        "dropout": _flag("has_dropout", "dropout"),
        "deterministic": _flag("deterministic", "deterministic"),
    },
}


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


def shim() -> Path:
    """The wrapper that lets CK's generate.py take a `|`-separated filter (any of)."""
    return genwrap_script("filter_any.py")


def flavor_of(gen: Generator) -> str:
    return genrules.flavor_of(gen.script)


@dataclass(frozen=True)
class GeneratorEnv(runner.TimedEnv):
    """What listing a generator's instances reads of the build's environment, resolved once: the
    environment it runs under (opaque) and ``QOLA_GENERATOR_TIMEOUT`` as set (checked when a
    generator first runs, :mod:`qola.core.deadlines`)."""

    KNOB = deadlines.GENERATOR
    listings: str | None = None  # where listings are cached (qola.plan.listcache); None: not cached

    @classmethod
    def of(cls, env: Mapping[str, str] | runner.TimedEnv) -> GeneratorEnv:
        """The view of ``env``: a mapping's children environment, deadline and listing cache."""
        if isinstance(env, GeneratorEnv):
            return env
        assert isinstance(env, Mapping), f"GeneratorEnv.of: a mapping or a GeneratorEnv, not {type(env).__name__}"
        return cls(runner.ChildEnv.of(env), env.get(cls.KNOB.variable), listcache.cache_dir(env))


GenEnv = Mapping[str, str] | GeneratorEnv  # a test's mapping, or the build's resolved view


def list_blobs(gen: Generator, env: GenEnv, filt: str | None = None, python: str = sys.executable) -> list[str]:
    """File stems the generator would write (``--list_blobs``), optionally under ``filt``. Cached
    (:mod:`qola.plan.listcache`) by the generator's sources, arguments and environment when ``env``
    names a cache dir."""
    genv = GeneratorEnv.of(env)
    extra = ["--filter", filt] if filt else []
    wrap = [str(shim())] if filt and ANY_CK in filt else []
    template = [python, *wrap, *gen.argv, "--list_blobs", "<listing>", *extra]  # the key's: no temp path
    key = listcache.key_of(template, genv.child.as_dict()) if genv.listings else None
    if key is not None and genv.listings and (hit := listcache.load(genv.listings, key)) is not None:
        return hit
    with pid_tempdir("qola-list-") as tmp:  # pid in the name: a killed run's is removed later
        out = Path(tmp) / "blobs.txt"
        argv = [a.replace(OUTPUT_DIR, str(Path(tmp) / "out")) for a in gen.argv]
        cmd = [python, *wrap, *argv, "--list_blobs", str(out), *extra]
        limit = genv.timeout()
        try:  # under the generators' deadline; its output only shown: cut past proc.LOG_KEEP, never held whole
            done = runner.run(cmd, cwd=tmp, env=genv.child, timeout=limit, keep=runner.LOG_KEEP)
        except OSError as exc:
            raise QolaError(f"cannot run `{gen.command}` to list its instances: {exc.strerror}") from None
        except runner.TimeoutExpired as exc:
            raise QolaError(
                f"listing the instances of `{gen.command}` failed ({runner.why_ended(exc)})",
                hint=f"fix the generator, or raise {deadlines.GENERATOR.variable}",
            ) from None
        if done.returncode != 0 or not out.is_file():
            raise QolaError(
                f"listing the instances of `{gen.command}` failed (exit {done.returncode}):\n"
                f"    {done.stdout.strip()[-2000:]}",
                hint="run the generator by hand with --list_blobs",
            )
        listing = inputs.read_checked(out, limit=inputs.MAX_RECORD, what="generator listing").decode()
        stems = [Path(line.strip()).stem for line in listing.splitlines() if line.strip()]
    if key is not None and genv.listings:
        listcache.store(genv.listings, key, stems)
    return stems


def is_api(stem: str) -> bool:  # CK's fmha_*_api.cpp, the example's attn_fwd_api.cu
    return stem.endswith("_api")


def kernel_name(stem: str, flavor: str) -> str:
    return ARCH_SUFFIX.sub("", stem) if flavor == "ck" else stem


def kind_of(name: str, direction: str) -> int:
    return next(
        i for i, (_, prefix) in enumerate(genrules.CK_KINDS[direction]) if not prefix or name.startswith(prefix)
    )


def _dtype(tokens: list[str]) -> str | None:  # CK names: ..._d<hdim>_<dtype>_...
    return next((tokens[i + 1] for i, tok in enumerate(tokens[:-1]) if HDIM.match(tok)), None)


@dataclass(frozen=True)
class Layout:
    """What one CK kernel kind's names carry, learned from its listing."""

    names: tuple[str, ...]
    dtypes: frozenset[str]
    slots: tuple[str, ...]  # present slots (+ "dtype"), in name order
    adjacent: tuple[bool, ...]  # slot i directly followed by slot i+1 in every name
    last: bool  # the last slot is the last token of every name


def _slot_tokens(fam: str) -> dict[str, str]:  # token -> slot
    return {tok: slot for slot, (_, toks) in SLOTS[fam].items() for tok in toks}


def learn(names: Sequence[str], fam: str, where: str) -> Layout:
    if not names:
        return Layout((), frozenset(), (), (), False)
    toks = _slot_tokens(fam)
    positions: list[dict[str, int]] = []
    for name in names:
        parts = name.split("_")
        pos = {}
        for i, tok in enumerate(parts):
            slot = "dtype" if i > 0 and HDIM.match(parts[i - 1]) and "dtype" not in pos else toks.get(tok)
            if slot is not None and slot not in pos:
                pos[slot] = i
        positions.append(pos | {"$end": len(parts) - 1})
    present = sorted({s for p in positions for s in p if s != "$end"}, key=lambda s: positions[0].get(s, 99))
    for s in present:
        if any(s not in p for p in positions):
            raise QolaError(
                f"{where}: kernel names carry the {s!r} token in some names only; qola cannot "
                "express variants over this generator's names",
                hint="report this CK version",
            )
    order = sorted(present, key=lambda s: positions[0][s])
    if any(sorted(present, key=lambda s: p[s]) != order for p in positions):
        raise QolaError(f"{where}: option tokens come in varying order in kernel names")
    adjacent = tuple(all(p[b] == p[a] + 1 for p in positions) for a, b in itertools.pairwise(order))
    last = bool(order) and all(p[order[-1]] == p["$end"] for p in positions)
    dtypes = frozenset(_dtype(n.split("_")) or "" for n in names) - {""}
    return Layout(tuple(names), dtypes, tuple(order), adjacent, last)


def parse_options(name: str, fam: str) -> dict[str, Any]:
    """Option values a kernel name states (options it does not carry are absent)."""
    parts = name.split("_")
    out: dict[str, Any] = {"dtype": _dtype(parts)} if _dtype(parts) else {}
    toks = _slot_tokens(fam)  # once per name, not per token (TE's plan: 470,000 dicts built)
    for tok in parts:
        if (slot := toks.get(tok)) is not None:
            out.update(zip(SLOTS[fam][slot][0], SLOTS[fam][slot][1][tok]))
    return out


def satisfies(name: str, fam: str, variant: Mapping[str, Any], layout: Layout) -> bool:
    stated = parse_options(name, fam)
    for opt, want in variant.items():
        slot = "dtype" if opt == "dtype" else next(s for s, (o, _) in SLOTS[fam].items() if opt in o)
        if (stated.get(opt) != want) if slot in layout.slots else want is True:
            return False  # a kind without a feature's token never has the feature
    return True


def patterns(variant: Mapping[str, Any], fam: str, layout: Layout, where: str) -> tuple[str, ...]:
    """fnmatch patterns (any of them) selecting exactly the names of ``layout`` that satisfy ``variant``."""
    choices: list[list[str | None]] = []
    for slot in layout.slots:
        if slot == "dtype":
            want = variant.get("dtype")
            column: list[str | None] = [None] if want is None else [want] if want in layout.dtypes else []
            choices.append(column)
            continue
        opts, table = SLOTS[fam][slot]
        seen = {t for n in layout.names for t in n.split("_") if t in table}
        ok: list[str | None] = [
            t for t in table if t in seen and all(variant.get(o) in (None, v) for o, v in zip(opts, table[t]))
        ]
        choices.append([None] if set(ok) == seen else ok)
    for slot in {s for o in variant for s, (opts, _) in SLOTS[fam].items() if o in opts} - set(layout.slots):
        if any(variant.get(o) is True for o in SLOTS[fam][slot][0]):
            return ()
    out = []
    for combo in itertools.product(*choices):
        idx = [i for i, tok in enumerate(combo) if tok is not None]
        if not idx:
            out.append("*")
            continue
        # slots adjacent in every name join with "_"; others may be adjacent in some names only: both joins
        seps = [("_",) if b == a + 1 and layout.adjacent[a] else ("_", "_*_") for a, b in itertools.pairwise(idx)]
        for sep in itertools.product(*seps):
            pat = "*_" + str(combo[idx[0]])
            for s, b in zip(sep, idx[1:]):
                pat += s + str(combo[b])
            out.append(pat + ("" if idx[-1] == len(combo) - 1 and layout.last else "_*"))
    got = {n for n in layout.names if any(fnmatch.fnmatchcase(n, p) for p in out)}
    want_set = {n for n in layout.names if satisfies(n, fam, variant, layout)}
    if got != want_set:
        raise QolaError(
            f"{where}: patterns {out} select {len(got)} names but {len(want_set)} satisfy the "
            "variant; this generator's name layout is not understood",
            hint="report this CK version",
        )
    return tuple(out)


NARROW = ("hdim", "mode", "name")  # options checked on names directly; the filter then names instances exactly
MODES = ("batch", "group")


def _check_value(opt: str, v: Any, dtypes: Sequence[str], where: str) -> None:
    ok, hint = {
        "dtype": (v in dtypes, f"values in this tree's generator: {', '.join(dtypes)}"),
        "hdim": (isinstance(v, int) and not isinstance(v, bool) and v > 0, "a head dimension, e.g. 128"),
        "mode": (v in MODES, "batch or group"),
        "name": (isinstance(v, str) and bool(v), "an fnmatch glob on CK kernel names, e.g. '*_npad_*'"),
    }.get(opt, (isinstance(v, bool), "true or false"))
    if not ok:
        raise QolaError(f"{where}.{opt}: {v!r} is not a value of this option", hint=hint)


def _keeps(name: str, variant: Mapping[str, Any], layout: Layout) -> bool:
    """``hdim``/``mode`` on kernel kinds whose names carry them; ``name`` (any-of globs) on each kind
    with the globs that match some name of that kind (bwd's dot_do_o/convert_dq/dq_dk_dv differ)."""
    toks = name.split("_")
    hdim = next((t for t in toks if HDIM.match(t)), None)
    if "hdim" in variant and hdim is not None and hdim != f"d{variant['hdim']}":
        return False
    mode = next((t for t in toks if t in MODES), None)
    if "mode" in variant and mode is not None and mode != variant["mode"]:
        return False
    globs = [g for g in variant.get("name", ()) if any(fnmatch.fnmatchcase(n, g) for n in layout.names)]
    return not globs or any(fnmatch.fnmatchcase(name, g) for g in globs)


def narrow(pats: tuple[str, ...], layout: Layout, variant: Mapping[str, Any]) -> tuple[str, ...]:
    """``pats`` further narrowed by the NARROW options: the exact kernel names left, when fewer."""
    if not pats or not any(k in variant for k in NARROW):
        return pats
    chosen = [n for n in layout.names if any(fnmatch.fnmatchcase(n, p) for p in pats)]
    kept = [n for n in chosen if _keeps(n, variant, layout)]
    return pats if len(kept) == len(chosen) else tuple(kept)


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
    listings: dict[tuple[str, int], list[str]] = {}
    by_command: dict[str, list[str]] = {}

    def listed(gen: Generator) -> list[str]:
        if gen.command not in by_command:
            by_command[gen.command] = list_blobs(gen, env, python=python)
        return by_command[gen.command]

    def listing(mod: ModulePlan, i: int) -> list[str]:
        listings[(mod.name, i)] = listed(mod.generators[i])
        return listings[(mod.name, i)]

    plan = receipts.mark(plan, listed)

    sels: list[Selection] = []
    targeted: dict[tuple[Any, int, str], None] = {}
    for fam, sections in (("fwd", manifest.mha_fwd_variants), ("bwd", manifest.mha_bwd_variants)):
        for n, sec in enumerate(sections):
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
            layouts = {(mod.name, i): _layouts(mod, i, fam, listing(mod, i)) for mod, i in targets}
            declared = {k: v for k, v in sec.model_dump(exclude={"module"}).items() if v is not None}
            dtypes = sorted({d for ls in layouts.values() for lay in ls for d in lay.dtypes})
            for opt, value in declared.items():
                for v in value if isinstance(value, list) else [value]:
                    _check_value(opt, v, dtypes, where)
            globs = declared.pop("name", None)  # any-of name globs: one variant, not a product
            for variant in expand(declared):
                if globs is not None:
                    variant["name"] = tuple(globs) if isinstance(globs, list) else (globs,)
                hits = 0
                for mod, i in targets:
                    found = _select(mod, i, fam, variant, layouts[(mod.name, i)], where)
                    hits += len(found)
                    sels += found
                if not hits:
                    raise QolaError(
                        f"{where} {_show(variant)} matches no instance of "
                        + "; ".join(f"{m.name}: {m.generators[i].command}" for m, i in targets),
                        hint="remove or change that variant (check its options against the receipt)",
                    )
    for mod, i, fam in _receipt_only(plan, targeted) if receipt_alone else ():  # qola's receipt alone
        rule = receipts.RULES[mod.generators[i].direction or ""]
        lays = _layouts(mod, i, fam, listing(mod, i))
        found = _select(mod, i, fam, {}, lays, f"receipt {receipts.TE_RECEIPT}")
        if not found:
            raise QolaError(
                f"module {mod.name}: receipt {receipts.TE_RECEIPT} ({rule.options}) selects no instance of "
                f"{mod.generators[i].command}",
                hint="this CK's kernel names are not understood; report it",
            )
        sels += found
    for n, table in enumerate(manifest.variants):
        sels += _generic(plan, table, n, listing)
    done = {(s.module, s.generator) for s in sels}
    for mod, i, fam in targeted:
        if (mod.name, i) not in done:
            raise QolaError(
                f"mha_{fam}_variants: no declared variant matches any instance of "
                f"{mod.name}: {mod.generators[i].command}",
                hint=f'add a variant for it, or drop_directions = ["{mod.generators[i].direction}"]',
            )
    return Resolution(plan, sels, listings)


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
        kinds = tuple(narrow(patterns(slotted, fam, lay, f"{mod.name}: {gen.command}"), lay, v) for lay in lays)
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
    return {(mod.name, i): join_filter(sels, sels[0].flavor) for mod, i, sels in res.generators()}


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
    chosen = {(mod.name, i): join_filter(sels, sels[0].flavor) for mod, i, sels in res.generators()}
    return with_filters(res.plan, chosen)
