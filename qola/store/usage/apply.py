"""``[usage]`` in the plan: each named variant is checked against its module's variant universe (what
the module's generators list at this tree commit, under the manifest's own variant tables), then
built ahead exactly.

* A module the JIT applies to (``[jit]``): its recorded variants join ``[jit.aot]``'s, every other
  generated instance stays deferred.
* Any other module: its generators run with a filter naming exactly the recorded variants (the
  dispatch then calls only those); a generator of the module with no recorded variant writes its
  dispatch alone (CK: :data:`qola.plan.genrules.NO_KERNEL`).

Modules that ``[usage]`` does not name are planned as the manifest says otherwise. A name outside
the universe (a temp file, a typo, a variant of another commit) is an error naming the module, the
name, the nearest real names and the tree commit.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from qola.core.errors import QolaError
from qola.plan import ckfilter, genrules, variants
from qola.plan.manifest import Manifest
from qola.plan.model import Generator, ModulePlan, Plan
from qola.plan.tree.files import read_text

if TYPE_CHECKING:
    from qola.plan.variants import GenEnv

MAX_SCRIPT = genrules.MAX_SCRIPT


def listable(gen: Generator) -> bool:
    """Whether ``gen`` lists its instances (``--list_blobs``): CK's fMHA generator for a direction it
    writes kernels for, or a script whose own source declares the option."""
    if gen.dispatch_only:
        return False
    if variants.flavor_of(gen) == "ck":
        return gen.direction in genrules.CK_KINDS
    try:
        return "--list_blobs" in read_text(gen.script, limit=MAX_SCRIPT, what="generator script")
    except (OSError, QolaError):
        return False


def universe(mod: ModulePlan, env: GenEnv) -> dict[int, tuple[list[str], list[str]]]:
    """generator index -> (every instance stem it can write, those the manifest's filter keeps)."""
    out = {}
    for i, g in enumerate(mod.generators):
        if listable(g):
            every = [s for s in variants.list_blobs(g, env) if not variants.is_api(s)]
            kept = every if g.filter is None else [s for s in variants.list_blobs(g, env, g.filter)
                                                   if not variants.is_api(s)]  # fmt: skip
            out[i] = (every, kept)
    return out


def _refuse(mod: ModulePlan, name: str, known: Sequence[str], commit: str | None, where: str) -> QolaError:
    near = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
    at = f"tree commit {commit}" if commit else "this tree (not a git checkout)"
    return QolaError(
        f"{where}: {name!r} is not a variant of module {mod.name} at {at}",
        hint=(f"nearest: {', '.join(near)}; " if near else "")
        + "a usage set names generated instances exactly (no temp files, no globs); records from another "
        "commit of the tree must be merged against that commit",
    )


def check(plan: Plan, by_module: Mapping[str, Sequence[str]], env: GenEnv,
          where: str = "usage") -> dict[str, dict[int, list[str]]]:  # fmt: skip
    """module -> generator index -> the named stems it writes (for CK with each name's twins for the
    build's other archs: the same kernel). Raises QolaError for a module outside
    the plan or without listable generators, a name outside the module's universe, and a name the
    manifest's own variant tables exclude."""
    return _check(plan, by_module, env, where)[0]


_Universes = dict[str, dict[int, tuple[list[str], list[str]]]]


def _check(plan: Plan, by_module: Mapping[str, Sequence[str]], env: GenEnv,
           where: str) -> tuple[dict[str, dict[int, list[str]]], _Universes]:  # fmt: skip
    """:func:`check`, with each named module's :func:`universe`."""
    mods = {m.name: m for m in plan.modules}
    out: dict[str, dict[int, list[str]]] = {}
    unis: _Universes = {}
    for module, names in sorted(by_module.items()):
        mod = mods.get(module)
        if mod is None:
            raise QolaError(
                f"{where}: module {module!r} is not built by this manifest",
                hint=f"modules in the plan: {', '.join(sorted(mods)) or 'none'}",
            )
        uni = unis[module] = universe(mod, variants.GeneratorEnv.of(env).for_plan(plan))  # the generation's env
        if not uni:
            raise QolaError(
                f"{where}: module {module} has no generated variants to choose from",
                hint="[usage] names instances of modules whose generators list them",
            )
        every = {s: i for i, (all_, _) in uni.items() for s in all_}
        kept = {s for _, k in uni.values() for s in k}
        per: dict[int, list[str]] = {i: [] for i in uni}
        for name in sorted(set(names)):
            if name not in every:
                raise _refuse(mod, name, sorted(every), plan.tree_commit, where)
            if name not in kept:
                raise QolaError(
                    f"{where}: variant {name!r} of module {module} is excluded by the manifest's variant tables",
                    hint="widen [[variants]] / [[mha_*_variants]] or drop the name",
                )
            per[every[name]].append(name)
        for i, chosen in per.items():  # CK: a kernel's _gfx9/_gfx950 twin is the same kernel for another arch
            if chosen and variants.flavor_of(mod.generators[i]) == "ck":
                kernels = {variants.kernel_name(n, "ck") for n in chosen}
                per[i] = sorted({*chosen, *(s for s in uni[i][1] if variants.kernel_name(s, "ck") in kernels)})
        out[module] = per
    return out, unis


def exact_filter(gen: Generator, names: Sequence[str], listing: Sequence[str]) -> tuple[str, str | None]:
    """(``--filter``, wrapper) making ``gen`` write exactly ``names`` (stems) plus its dispatch;
    ``listing``: its unfiltered stems (CK: :func:`qola.plan.ckfilter.exact`)."""
    if variants.flavor_of(gen) != "ck":
        return (",".join(names) if names else genrules.NO_KERNEL), None
    filt = ckfilter.exact(gen.direction or "", names, listing)
    return filt, (str(variants.shim()) if variants.ANY_CK in filt else None)


def by_module(manifest: Manifest) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for v in manifest.usage.variants if manifest.usage else ():
        out.setdefault(v.module, []).append(v.name)
    return out


def apply(plan: Plan, manifest: Manifest, env: GenEnv) -> Plan:
    """The plan with ``[usage]`` applied (see the module doc); as it is without ``[usage]`` variants.
    Call after the variant filters and the JIT split are in the plan."""
    wanted = by_module(manifest)
    if not wanted:
        return plan
    chosen, unis = _check(plan, wanted, env, "usage")
    genv = variants.GeneratorEnv.of(env).for_plan(plan)
    mods = []
    for mod in plan.modules:
        per = chosen.get(mod.name)
        if per is None:
            mods.append(mod)
        elif mod.jit is not None:
            ahead = tuple(sorted(set(mod.jit.ahead) | {n for names in per.values() for n in names}))
            mods.append(dataclasses.replace(mod, jit=dataclasses.replace(mod.jit, ahead=ahead)))
        else:
            gens = list(mod.generators)
            for i, names in per.items():
                every = unis[mod.name][i][0]
                filt, wrap = exact_filter(gens[i], names, every)
                gens[i] = dataclasses.replace(gens[i], filter=filt, wrapper=wrap)
                if variants.flavor_of(gens[i]) == "ck":  # CK writes kernels by trait: list to be sure
                    ckfilter.verify(gens[i], genv, filt, every, f"usage: module {mod.name}")
            mods.append(dataclasses.replace(mod, generators=tuple(gens)))
    return dataclasses.replace(plan, modules=tuple(mods))
