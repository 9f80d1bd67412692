"""CK's kernel names as the variant matrices read them: the option tokens each kernel family
carries (:data:`SLOTS`), the layout of a generator's names learned from its own listing
(:func:`learn`), the options a name has, and the fnmatch patterns that select a variant.
"""

from __future__ import annotations

import fnmatch
import functools
import itertools
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from qola.core.errors import QolaError
from qola.plan import genrules


def is_hdim(token: str) -> bool:
    """``token`` is a head-dimension token (``d128``: ``d`` and ASCII digits), without a regex match
    per token (a plan of TE's manifest tests half a million tokens)."""
    digits = token[1:]
    return token[:1] == "d" and digits.isascii() and digits.isdigit()


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


@functools.lru_cache(maxsize=256)
def any_glob(globs: tuple[str, ...]) -> Callable[[str], bool]:
    """Whether a name matches any of ``globs`` (``fnmatch.fnmatchcase``): one compiled pattern for
    all of them, not one match per glob and name (TE's plan: half a million matches)."""
    if not globs:
        return lambda name: False
    match = re.compile("|".join(f"(?:{fnmatch.translate(g)})" for g in globs)).match
    return lambda name: match(name) is not None


def kind_of(name: str, direction: str) -> int:
    return next(
        i for i, (_, prefix) in enumerate(genrules.CK_KINDS[direction]) if not prefix or name.startswith(prefix)
    )


def _dtype(tokens: list[str]) -> str | None:  # CK names: ..._d<hdim>_<dtype>_...
    return next((tokens[i + 1] for i, tok in enumerate(tokens[:-1]) if is_hdim(tok)), None)


@dataclass(frozen=True)
class Layout:
    """What one CK kernel kind's names carry, learned from its listing."""

    names: tuple[str, ...]
    dtypes: frozenset[str]
    slots: tuple[str, ...]  # present slots (+ "dtype"), in name order
    adjacent: tuple[bool, ...]  # slot i directly followed by slot i+1 in every name
    last: bool  # the last slot is the last token of every name
    tokens: frozenset[str] = frozenset()  # every ``_``-separated token of every name


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
            slot = "dtype" if i > 0 and is_hdim(parts[i - 1]) and "dtype" not in pos else toks.get(tok)
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
    tokens = frozenset(t for n in names for t in n.split("_"))
    return Layout(tuple(names), dtypes, tuple(order), adjacent, last, tokens)


@functools.lru_cache(maxsize=65536)
def parse_options(name: str, fam: str) -> Mapping[str, Any]:
    """Option values a kernel name states (options it does not carry are absent); read-only (one
    answer per name: a plan asks once per variant and name)."""
    parts = name.split("_")
    out: dict[str, Any] = {"dtype": _dtype(parts)} if _dtype(parts) else {}
    toks = _slot_tokens(fam)  # once per name, not per token (TE's plan: 470,000 dicts built)
    for tok in parts:
        if (slot := toks.get(tok)) is not None:
            out.update(zip(SLOTS[fam][slot][0], SLOTS[fam][slot][1][tok]))
    return out


def _checks(fam: str, variant: Mapping[str, Any], layout: Layout) -> tuple[tuple[str, Any, bool], ...]:
    """Per option of ``variant``: (option, wanted value, whether ``layout``'s names carry its slot)."""
    out = []
    for opt, want in variant.items():
        slot = "dtype" if opt == "dtype" else next(s for s, (o, _) in SLOTS[fam].items() if opt in o)
        out.append((opt, want, slot in layout.slots))
    return tuple(out)


def _satisfied(stated: Mapping[str, Any], checks: Sequence[tuple[str, Any, bool]]) -> bool:
    # an option a kind's names do not carry: never true there (a kind without a feature's token
    # never has the feature)
    return all((stated.get(opt) == want) if carried else want is not True for opt, want, carried in checks)


def stated_by(variant: Mapping[str, Any], fam: str, layouts: Sequence[Layout], layout: Layout) -> dict[str, Any]:
    """``variant`` as one kernel kind of a generator's traits reads it: an option whose token this
    kind's names lack but another kind's carry (bwd's ``deterministic``: on dq_dk_dv and convert_dq,
    not on dot_do_o) does not narrow this kind; CK writes a trait's kinds together. An option no
    kind carries stays (a kind without a feature's token never has the feature)."""
    carried = {s for lay in layouts for s in lay.slots}
    out = {}
    for opt, value in variant.items():
        slot = next((s for s, (opts, _) in SLOTS[fam].items() if opt in opts), None)
        if slot is None or slot in layout.slots or slot not in carried:
            out[opt] = value
    return out


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
        seen = layout.tokens & table.keys()
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
    hit = any_glob(tuple(out))
    got = {n for n in layout.names if hit(n)}
    checks = _checks(fam, variant, layout)  # once per variant, not per name
    want_set = {n for n in layout.names if _satisfied(parse_options(n, fam), checks)}
    if got != want_set:
        raise QolaError(
            f"{where}: patterns {out} select {len(got)} names but {len(want_set)} satisfy the "
            "variant; this generator's name layout is not understood",
            hint="report this CK version",
        )
    return tuple(out)


NARROW = ("hdim", "mode", "name")  # options checked on names directly; the filter then names instances exactly
MODES = ("batch", "group")


def check_value(opt: str, v: Any, dtypes: Sequence[str], where: str) -> None:
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
    hdim = next((t for t in toks if is_hdim(t)), None)
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
    hit = any_glob(pats)
    chosen = [n for n in layout.names if hit(n)]
    kept = [n for n in chosen if _keeps(n, variant, layout)]
    return pats if len(kept) == len(chosen) else tuple(kept)
