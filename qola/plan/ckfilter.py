"""CK ``--filter`` values that name kernels exactly, and the check that a filter qola writes makes
the generator write exactly the instances it was built from.

CK's backward generator matches its filter per *trait*, not per name: a trait (one ``dot_do_o``,
one ``dq_dk_dv`` and one ``convert_dq`` kernel) is kept only when each of its three kernel names
passes its own ``@`` component, and then its files are written, except for a kernel the trait
disables (a ``maxq`` tile's deterministic ``convert_dq``, ``b64x16``): that name is matched but never
listed nor written. A component that names a companion kind's listed names exactly therefore drops
every trait whose companion is such an unlisted name, with its ``dq_dk_dv`` kernel. A name-by-name
check on the listing cannot see that; only listing under the filter does (:func:`verify`).

So every CK filter qola writes has its companion kinds (the ``CK_KINDS`` entries with a prefix)
rewritten as "any name but the listed ones not wanted" (``*|!u1|!u2``, qola's any-of shim,
:func:`for_traits`): the listed names pass as before, unlisted ones pass too, and no unwanted file can
be written. An exact filter (:func:`exact`, ``[usage]``) names the main kind's kernels positively.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence

from qola.core.errors import QolaError
from qola.plan import genrules
from qola.plan.cknames import any_glob, kind_of
from qola.plan.listing import ANY_CK, NOT, GenEnv, is_api, kernel_name, list_blobs
from qola.plan.model import Generator

SHOW = 3  # names shown in an error
_GLOB = frozenset("*?[")


@functools.lru_cache(maxsize=64)
def _compiled(component: str) -> tuple[frozenset[str], tuple[str, ...], frozenset[str], tuple[str, ...]]:
    """(excluded names, excluded globs, names, globs) of a ``|`` component."""
    parts = component.split(ANY_CK) if ANY_CK in component else [component]
    nots = [p[1:] for p in parts if ANY_CK in component and p.startswith(NOT)]
    pos = [p for p in parts if not (ANY_CK in component and p.startswith(NOT))]

    def split(ps: list[str]) -> tuple[frozenset[str], tuple[str, ...]]:
        return frozenset(p for p in ps if not _GLOB & set(p)), tuple(p for p in ps if _GLOB & set(p))

    return (*split(nots), *split(pos))


def matches(name: str, component: str) -> bool:
    """Whether CK, run under qola's shim (templates/genwrap/filter_any.py), passes ``name`` through
    one ``@`` component: ``|`` any of, a ``!glob`` part excludes (without ``|``: CK's fnmatch)."""
    not_names, not_globs, names, globs = _compiled(component)
    if name in not_names or any_glob(not_globs)(name):
        return False
    return name in names or any_glob(globs)(name)


def _kinds(direction: str | None) -> tuple[tuple[str, str], ...]:
    return genrules.CK_KINDS.get(direction or "", ())


def _components(direction: str, filt: str) -> list[str]:
    comps = filt.split("@")
    return comps + ["*"] * (len(_kinds(direction)) - len(comps))


def for_traits(direction: str | None, filt: str, listing: Iterable[str]) -> str:
    """``filt`` (a CK ``--filter``) with each companion kind's component (a ``CK_KINDS`` entry with
    a prefix) rewritten to pass every name but the listed ones it does not pass (``*|!u1|!u2``): the
    same listed names, and every unlisted one (module doc). ``listing``: the generator's unfiltered
    stems. A filter of another direction, or one that selects no kernel, is returned as it is."""
    kinds = _kinds(direction)
    if len(kinds) < 2 or filt == genrules.dispatch_only_filter(direction):
        return filt
    assert direction is not None
    comps = _components(direction, filt)
    names = _by_kind((kernel_name(s, "ck") for s in listing if not is_api(s)), direction)
    for k, ((_, prefix), every) in enumerate(zip(kinds, names)):
        if prefix:
            unwanted = [n for n in every if not matches(n, comps[k])]
            comps[k] = ANY_CK.join(["*", *(NOT + n for n in unwanted)]) if unwanted else "*"
    return "@".join(comps)


def _by_kind(names: Iterable[str], direction: str) -> list[list[str]]:
    out: list[list[str]] = [[] for _ in _kinds(direction)]
    for name in dict.fromkeys(names):
        out[kind_of(name, direction)].append(name)
    return out


def exact(direction: str, wanted: Iterable[str], listing: Sequence[str]) -> str:
    """The ``--filter`` making CK's ``direction`` generator write the instances ``wanted`` (stems)
    and no other of ``listing`` (its unfiltered stems): see the module doc."""
    want = _by_kind((kernel_name(s, "ck") for s in wanted), direction)
    if not any(want):
        return genrules.dispatch_only_filter(direction) or genrules.NO_KERNEL
    return for_traits(direction, "@".join(ANY_CK.join(k) if k else genrules.NO_KERNEL for k in want), listing)


def selected(stems: Iterable[str], direction: str, filt: str) -> list[str]:
    """The stems of ``stems`` (a CK listing) whose kernel name passes its kind's component of
    ``filt``, one by one: what the filter was built to select."""
    comps = _components(direction, filt)
    out = []
    for s in stems:
        if not is_api(s):
            name = kernel_name(s, "ck")
            if matches(name, comps[kind_of(name, direction)]):
                out.append(s)
    return out


def _some(names: Sequence[str]) -> str:
    more = f" and {len(names) - SHOW} more" if len(names) > SHOW else ""
    return ", ".join(names[:SHOW]) + more


def verify(
    gen: Generator, env: GenEnv, filt: str, listing: Sequence[str], where: str, *, implied: bool = False
) -> None:
    """Raise QolaError unless CK's generator ``gen`` writes under ``filt`` exactly the instances of
    ``listing`` (its unfiltered stems) that ``filt`` passes name by name: the check a name-by-name
    one cannot make (module doc). A generator with one kernel kind needs none. ``implied``: the
    companion kinds were not named but left open (a variant that narrows dq_dk_dv only): CK writes
    those its selected traits pair with, so a companion the filter passes but no trait takes is no
    loss; a main-kind instance not written, or any instance written but not passed, still is."""
    kinds = _kinds(gen.direction)
    if len(kinds) < 2:
        return
    want = set(selected(listing, gen.direction or "", filt))
    got = {s for s in list_blobs(gen, env, filt) if not is_api(s)}
    if implied:
        companion = tuple(prefix for _, prefix in kinds if prefix)
        want = {s for s in want if s in got or not kernel_name(s, "ck").startswith(companion)}
    if got == want:
        return
    lost, extra = sorted(want - got), sorted(got - want)
    raise QolaError(
        f"{where}: the filter qola built for `{gen.command}` does not select what it names: "
        + "; ".join(
            [f"{len(lost)} named instance(s) not written ({_some(lost)})"] * bool(lost)
            + [f"{len(extra)} unnamed instance(s) written ({_some(extra)})"] * bool(extra)
        ),
        hint="CK writes a backward kernel only with its trait's companions (dot_do_o, convert_dq): "
        "name whole traits; if they are named, report this CK version",
    )
