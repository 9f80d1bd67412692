"""A CK receipt the tree's generator does not know, and receipt 700 applied by qola.

A manifest's ``receipt = N`` rewrites ``--receipt N`` into the module's kernel generator commands
(:mod:`qola.plan.planner`). CK's fMHA ``generate.py`` selects kernels by receipt with a chain of
``if receipt == …`` tests; a receipt none of them names falls through to the default (every kernel
but fp32), silently. Transformer Engine asks for receipt 700, which exists only in a CK with
rocm-libraries PR #6867 (QoLA's AITER patch 0003); on any other CK it *enlarges* the build.

:func:`mark` asks each such generator: its ``--list_blobs`` with the receipt and without any. The
same list means the generator does not know the receipt. Then:

* receipt 700: qola applies its selection itself, through the variant filter
  (:mod:`qola.plan.variants`): the generator is marked (``Generator.qola_receipt``), every variant
  on it is narrowed by :data:`RULES` (options the kernel names carry, plus names excluded), a
  generator no variant targets gets the rule as its only variant, and a direction the receipt selects
  nothing of writes its dispatch file alone (as a dropped direction). The plan says so (a warning).
* any other receipt: an error naming the receipt and the generator.

A generator that knows the receipt (its lists differ) is left alone.

Receipt 700, as the patch defines it: fwd — fp16/bf16, row-major V, with LSE, no skip, no sink, no
logits soft-cap, no Q scale; bwd — fp16/bf16, dropout none, ``dropout_wg32`` or ``dropout_wg16``
(not their ``_storerandval`` forms); fwd_splitkv, batch_prefill, pagedkv_prefill — nothing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from qola.core.errors import QolaError
from qola.plan import genrules
from qola.plan.model import Generator, Plan

TE_RECEIPT = "700"


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
        {"dtype": ["fp16", "bf16"], "has_lse": True, "has_skip": False, "has_sink": False, "has_logits": False},
        ("vc", "squant"),
        "fp16/bf16, row-major V, with LSE, no skip, sink, logits soft-cap or static quant",
    ),
    "bwd": Rule({"dtype": ["fp16", "bf16"]}, ("storerandval",), "fp16/bf16, dropout none, wg32 or wg16"),
}


def without_receipt(gen: Generator) -> Generator:
    """The generator as it runs with no ``--receipt`` at all."""
    return dataclasses.replace(gen, command=" ".join(genrules.RECEIPT_ARG.sub("", gen.command).split()), receipt=None)


def mark(plan: Plan, listing: Callable[[Generator], list[str]]) -> Plan:
    """The plan with each CK generator that does not know the receipt its manifest asks for handled
    (see the module's docstring; a receipt the tree's own table gives is the tree's business).
    ``listing``: a generator's unfiltered ``--list_blobs`` stems."""
    mods, notes = [], []
    for mod in plan.modules:
        gens = []
        for g in mod.generators:
            if not g.asked_receipt or g.qola_receipt or g.receipt in (None, "0") or g.dispatch_only or not g.direction:
                gens.append(g)
                continue
            if genrules.flavor_of(g.script) != "ck" or listing(g) != listing(without_receipt(g)):
                gens.append(g)  # not CK's, or it knows the receipt
                continue
            if g.receipt != TE_RECEIPT:
                raise QolaError(
                    f"module {mod.name}: receipt {g.receipt} is unknown to the tree's generator `{g.command}` "
                    "(it lists the same kernels as without --receipt)",
                    hint=f"qola applies receipt {TE_RECEIPT} itself where CK lacks it; for any other, use a receipt "
                    "this CK's generate.py knows, or a CK that has it",
                )
            if g.direction in RULES:
                gens.append(dataclasses.replace(g, qola_receipt=TE_RECEIPT))
                what = f"selects {RULES[g.direction].says}, through the variant filter"
            else:
                filt = genrules.dispatch_only_filter(g.direction)
                if filt is None:
                    raise QolaError(
                        f"module {mod.name}: receipt {TE_RECEIPT} selects no kernel of direction {g.direction}, "
                        f"and qola has no dispatch-only filter for it (`{g.command}`)",
                        hint=f'drop it: drop_directions = ["{g.direction}"]',
                    )
                gens.append(dataclasses.replace(g, filter=filt, dispatch_only=True, qola_receipt=TE_RECEIPT))
                what = "selects no kernel: the generator writes its dispatch file alone"
            notes.append(
                f"module {mod.name}: the tree's CK generator does not know receipt {TE_RECEIPT} "
                f"(`{g.command}` lists the same files without it): qola applies it: {g.direction}: {what}"
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
