"""A CK receipt the tree's generator does not know, and receipt 700 applied by qola.

A manifest's ``receipt = N`` rewrites ``--receipt N`` into the module's kernel generator commands
(:mod:`qola.plan.planner`). CK's fMHA ``generate.py`` selects kernels by receipt with a chain of
``if receipt == …`` tests; a receipt none of them names falls through to the default (every kernel
but fp32), silently. Transformer Engine asks for receipt 700, which exists only in a CK with
rocm-libraries PR #6867 (QoLA's AITER patch 0003); on any other CK it *enlarges* the build.

:func:`mark` asks each such generator script whether it knows the receipt: its ``--list_blobs``
with the receipt and without any, for each direction the plan runs it with. A script knows the
receipt when any direction's list changes with it (a receipt may leave one direction's kernels as
they are: the bwd kernels of CK's receipt 600 are every kernel but fp32, as with no receipt). A script
none of whose lists changes does not know the receipt. Then:

* receipt 700: qola applies its selection itself, through the variant filter
  (:mod:`qola.plan.variants`): the generator is marked (``Generator.qola_receipt``), every variant
  on it is narrowed by :data:`RULES` (options the kernel names carry, plus names excluded), a
  generator no variant targets gets the rule as its only variant, and a direction the receipt selects
  nothing of writes its dispatch file alone (as a dropped direction). The plan says so (a warning
  naming the rule and the QoLA patches it follows, :data:`SOURCE`).
* any other receipt: an error naming the receipt and the generator.

A generator other than CK's that refuses the receipt (its listing fails with it, not without it)
is an error at plan time too, with the generator's own words (:func:`_rejected`).

A script that knows the receipt is left alone, every direction of it, with one exception: a CK whose
own receipt 700 is upstream's (rocm-libraries PR #6867, QoLA's 0003 alone), which leaves out the fwd
sink kernels QoLA's 0011 puts back (TE reaches them through ``softmax_offset``): known by its
listings (the fwd kernels with a sink it lists without the receipt, none of them with it), its fwd
generator runs without ``--receipt`` and qola applies its own receipt 700 there (:func:`_no_sink`),
and the plan says so.

Receipt 700, as QoLA applies it today — its AITER patch 0003 (a port of rocm-libraries PR #6867)
with its patch 0011 ("te-receipt-700-include-sink"), which drops 0003's no-sink condition because
TE reaches sink kernels through ``softmax_offset``: fwd — fp16/bf16, row-major V, with LSE, no skip,
no logits soft-cap, no Q scale, with or without a sink; bwd — fp16/bf16, dropout none,
``dropout_wg32`` or ``dropout_wg16`` (not their ``_storerandval`` forms); fwd_splitkv, batch_prefill,
pagedkv_prefill — nothing.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from qola.core.errors import QolaError
from qola.plan import genrules
from qola.plan.model import Generator, Plan

TE_RECEIPT = "700"
# where qola's rule for receipt 700 comes from (said in the plan's note)
SOURCE = "QoLA's AITER patches 0003 and 0011 (sink kernels included)"


@dataclass(frozen=True)
class Rule:
    """One direction's selection under a receipt, in the variant filter's terms."""

    options: Mapping[str, Any]  # variant options every selected kernel has (a list: any of)
    tokens: tuple[str, ...] = ()  # name tokens no selected kernel carries ("vc": ``..._vc_...``)
    says: str = ""  # the selection, in words

    @property
    def exclude(self) -> tuple[str, ...]:
        """fnmatch globs on kernel names no selected kernel matches (a token inside or at the end)."""
        return tuple(g for t in self.tokens for g in (f"*_{t}_*", f"*_{t}"))


# direction -> its rule; a direction absent here selects nothing. The options are the ones kernel
# names carry as tokens (qola.plan.cknames.SLOTS); V layout (``_vr_``/``_vc_``), static quant
# (``_squant_``, the Q scale of CKs before ``qscale``) and the bwd dropout's stored random values are
# excluded by name.
RULES: dict[str, Rule] = {
    "fwd": Rule(
        {"dtype": ["fp16", "bf16"], "has_lse": True, "has_skip": False, "has_logits": False},
        ("vc", "squant"),
        "fp16/bf16, row-major V, with LSE, no skip, logits soft-cap or static quant, with or without a sink",
    ),
    "bwd": Rule({"dtype": ["fp16", "bf16"]}, ("storerandval",), "fp16/bf16, dropout none, wg32 or wg16"),
}


def without_receipt(gen: Generator) -> Generator:
    """The generator as it runs with no ``--receipt`` at all."""
    return dataclasses.replace(gen, command=" ".join(genrules.RECEIPT_ARG.sub("", gen.command).split()), receipt=None)


def with_receipt(gen: Generator, receipt: str) -> Generator:
    """The generator as it runs with ``--receipt receipt``: its own receipt argument replaced in
    place (the same command, so the same cached listing, where it asks for that receipt already)."""
    if genrules.RECEIPT_ARG.search(gen.command):
        cmd = genrules.RECEIPT_ARG.sub(lambda m: f"{m.group(1)}{m.group(2)}{receipt}", gen.command, count=1)
    else:
        cmd = f"{gen.command} --receipt {receipt}"
    return dataclasses.replace(gen, command=cmd, receipt=receipt)


Listing = Callable[[Generator], list[str]]


def _asks(g: Generator) -> bool:
    """A generator whose receipt, the manifest's, must be checked against CK's generator."""
    return (
        g.asked_receipt
        and not g.qola_receipt
        and g.receipt not in (None, "0")
        and not g.dispatch_only
        and bool(g.direction)
        and genrules.flavor_of(g.script) == "ck"
    )


def _rejected(g: Generator, listing: Listing) -> str | None:
    """What a generator other than CK's says when it refuses the receipt the manifest asks of it: its
    listing with the receipt fails where the one without succeeds (a generator that lists neither
    way, or takes no ``--list_blobs``, is left to the build)."""
    if not (g.asked_receipt and g.receipt not in (None, "0") and g.direction and not g.dispatch_only):
        return None
    if genrules.flavor_of(g.script) == "ck":
        return None  # CK's falls through to its default instead: :func:`_known`
    try:
        listing(g)
        return None
    except QolaError as exc:
        said = exc.message
    try:
        listing(without_receipt(g))
    except QolaError:
        return None
    return said


def _known(plan: Plan, listing: Listing) -> dict[tuple[str, str], bool]:
    """(script, receipt) -> whether the script knows the receipt: any direction the plan runs it
    with lists other files with the receipt than without (the asking generators are asked first)."""
    asked = {(g.script, g.receipt or ""): None for m in plan.modules for g in m.generators if _asks(g)}
    out = {}
    for script, receipt in asked:
        probes: dict[str | None, Generator] = {}
        for g in sorted(
            (g for m in plan.modules for g in m.generators if g.script == script and g.direction),
            key=lambda g: g.receipt != receipt,
        ):
            probes.setdefault(g.direction, with_receipt(g, receipt))
        out[(script, receipt)] = any(listing(g) != listing(without_receipt(g)) for g in probes.values())
    return out


SINK_TOKEN = re.compile(r"_sink(?:_|$)")  # a fwd kernel with a softmax sink (``_nsink``: without)


def _no_sink(g: Generator, listing: Listing) -> bool:
    """``g`` (a fwd generator whose script knows receipt 700) runs CK's own receipt 700 without the
    sink kernels QoLA's 0011 keeps: the script lists sink kernels without the receipt, and none with it."""
    if g.direction != "fwd" or g.receipt != TE_RECEIPT:
        return False
    every = listing(without_receipt(g))
    return any(SINK_TOKEN.search(n) for n in every) and not any(SINK_TOKEN.search(n) for n in listing(g))


def _applied(mod: str, g: Generator) -> tuple[Generator, str]:
    """``g`` under qola's receipt 700, and what the plan says of it."""
    if g.direction in RULES:
        what = f"selects {RULES[g.direction].says}, through the variant filter"
        return dataclasses.replace(g, qola_receipt=TE_RECEIPT), what
    filt = genrules.dispatch_only_filter(g.direction or "")
    if filt is None:
        raise QolaError(
            f"module {mod}: receipt {TE_RECEIPT} selects no kernel of direction {g.direction}, "
            f"and qola has no dispatch-only filter for it (`{g.command}`)",
            hint=f'drop it: drop_directions = ["{g.direction}"]',
        )
    what = "selects no kernel: the generator writes its dispatch file alone"
    return dataclasses.replace(g, filter=filt, dispatch_only=True, qola_receipt=TE_RECEIPT), what


def mark(plan: Plan, listing: Listing) -> Plan:
    """The plan with each CK generator script that does not know the receipt its manifest asks for
    handled (see the module's docstring; a receipt the tree's own table gives is the tree's business).
    ``listing``: a generator's unfiltered ``--list_blobs`` stems."""
    known = _known(plan, listing)
    mods, notes = [], []
    for mod in plan.modules:
        gens = []
        for g in mod.generators:
            if (said := _rejected(g, listing)) is not None:
                raise QolaError(
                    f"module {mod.name}: receipt {g.receipt} is rejected by the tree's generator, which lists its "
                    f"instances without it: {said}",
                    hint="use a receipt this generator knows (its --help lists them), or drop receipt from the "
                    "module's [[modules]] entry",
                )
            if _asks(g) and known[(g.script, g.receipt or "")] and _no_sink(g, listing):
                marked, what = _applied(mod.name, without_receipt(g))
                gens.append(marked)
                notes.append(
                    f"module {mod.name}: the tree's CK generator knows receipt {TE_RECEIPT} by upstream's rule, "
                    f"which leaves out the sink kernels (`{g.command}`); qola applies its own receipt {TE_RECEIPT} "
                    f"as {SOURCE}: {g.direction}: {what}"
                )
                continue
            if not _asks(g) or known[(g.script, g.receipt or "")]:
                gens.append(g)  # not asked, not CK's, or the script knows the receipt
                continue
            if g.receipt != TE_RECEIPT:
                raise QolaError(
                    f"module {mod.name}: receipt {g.receipt} is unknown to the tree's generator `{g.command}` "
                    "(no direction of it lists other kernels than without --receipt)",
                    hint=f"qola applies receipt {TE_RECEIPT} itself where CK lacks it; for any other, use a receipt "
                    "this CK's generate.py knows, or a CK that has it",
                )
            marked, what = _applied(mod.name, g)
            gens.append(marked)
            notes.append(
                f"module {mod.name}: the tree's CK generator does not know receipt {TE_RECEIPT} "
                f"(`{g.command}` lists the same files without it): qola applies it as {SOURCE}: "
                f"{g.direction}: {what}"
            )
        mods.append(dataclasses.replace(mod, generators=tuple(gens)))
    if not notes:
        return plan
    return dataclasses.replace(plan, modules=tuple(mods), warnings=(*plan.warnings, *notes))


def narrowed(variant: Mapping[str, Any], rule: Rule) -> list[dict[str, Any]]:
    """``variant`` within ``rule``: the concrete variants left (a list option of the rule expands;
    a value the rule excludes leaves none)."""
    out: list[dict[str, Any]] = [dict(variant)]
    for opt, allowed in rule.options.items():
        values = allowed if isinstance(allowed, list) else [allowed]
        nxt = []
        for v in out:
            if opt in v:
                if v[opt] in values:
                    nxt.append(v)
            else:
                nxt += [{**v, opt: a} for a in values]
        out = nxt
    return out
