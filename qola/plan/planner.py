"""Manifest + kernel tree → :class:`Plan`: frozen, JSON-serialisable, one entry per module.

Pure: reads the tree's files, never writes, never runs a generator.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import qola
from qola.core.errors import QolaError
from qola.plan import fixes as fixes_mod
from qola.plan import itfs, needs, registry
from qola.plan.manifest import Manifest, ModuleSection, vendor
from qola.plan.model import DEFAULT_MODE, OUTPUT_DIR, Generator, JitSplit, ModulePlan, Plan
from qola.plan.module_parts import (
    DIRECTION_RE,
    SOURCE_EXTS,
    check_itfs,
    ck_free,
    configs_used,
    default_includes,
    drop_sources,
    expand_sources,
    generators_of,
    overrides_of,
    per_arch,
    with_targets,
)
from qola.plan.pin import PinAsk, check_pin
from qola.plan.tree import overrides
from qola.plan.tree import sources as tree_sources
from qola.plan.tree.aiter import TABLE, AiterTree, Namespace, load_table, namespace, resolve_entry, unknown_keys
from qola.plan.tree.aiter_configs import MergedConfig, merge
from qola.plan.tree.aiter_core import cc_switch_flags

__all__ = [
    "OUTPUT_DIR",
    "Generator",
    "JitSplit",
    "ModulePlan",
    "PinAsk",
    "Plan",
    "PlanInputs",
    "check_pin",
    "ck_free",
    "make_plan",
]


def _nearest(name: str, keys: list[str]) -> str:
    close = difflib.get_close_matches(name, keys, n=3, cutoff=0.5)
    return f"nearest table keys: {', '.join(close)}" if close else "no similar table key"


def _all_modules(
    table: Mapping[str, Mapping[str, Any]], names: Mapping[str, Any], env: Mapping[str, str], notes: list[str]
) -> list[str]:
    """AITER's "all": every module but the ``*tune`` ones and, unless ``AITER_ENABLE_EXPERIMENTAL``
    is a non-zero integer, those whose ``is_experimental`` is true (AITER main)."""
    try:
        experimental = int(env.get("AITER_ENABLE_EXPERIMENTAL", "0")) != 0
    except ValueError:
        experimental = False
    wanted = []
    for key, raw in table.items():
        if key.endswith("tune"):
            continue
        if not experimental and "is_experimental" in raw:
            flag = resolve_entry(key, {"is_experimental": raw["is_experimental"]}, names)["is_experimental"]
            if flag:
                notes.append(f"module {key} is experimental: left out (set AITER_ENABLE_EXPERIMENTAL=1 to build it)")
                continue
        wanted.append(key)
    return wanted


def _check_unique(plans: list[ModulePlan], manifest: Manifest) -> None:
    """Two modules with one library name would overwrite each other's library, log and JIT dir."""
    seen: dict[str, str] = {}
    for mod in plans:
        other = seen.setdefault(mod.md_name, mod.name)
        if other != mod.name:
            raise QolaError(
                f"modules {other!r} and {mod.name!r} both build {mod.md_name!r} (the same md_name): "
                "their libraries would overwrite each other",
                hint="give one of them another md_name in its [[modules]] entry, or build only one",
                where=manifest.path or None,
            )


@dataclasses.dataclass(frozen=True)
class PlanInputs:
    """What a plan is made for besides the manifest and the tree: the target ``archs``, the
    environment the tree's expressions read (``env``), the mode of modules without their own
    (``mode``: :data:`qola.core.settings.MODE`, resolved once), the HIP version,
    the tree's commit and pin record (:func:`qola.plan.pin.check_pin`) and the warnings so far."""

    archs: tuple[str, ...]
    env: Mapping[str, str]
    mode: str | None = None  # None (a plan made without the settings): [build].mode > pybind
    hip_version: str | None = None
    tree_commit: str | None = None
    warnings: Sequence[str] | None = None
    pin: Mapping[str, Any] | None = None
    fixes: Sequence[str] | None = None  # [qola] fixes / --fixes (qola.core.settings.FIXES); None: every fix
    fixes_from: str | None = None  # where that came from, for its error


@dataclasses.dataclass
class _Planning:
    """One :func:`make_plan`: what every module reads, and what the modules add to."""

    manifest: Manifest
    tree: AiterTree
    inputs: PlanInputs
    table: Mapping[str, Mapping[str, Any]]
    space: Namespace
    notes: list[str]
    mode_default: str
    pinned: bool
    tree_roots: tuple[str, ...]
    own_roots: tuple[str, ...] = ()
    named_roots: tuple[str, ...] = ()
    searched: list[str] = dataclasses.field(default_factory=list)
    unknown: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    merged: dict[str, MergedConfig] = dataclasses.field(default_factory=dict)

    @property
    def names(self) -> dict[str, Any]:
        return self.space.names

    @property
    def scope(self) -> overrides.Scope:
        return overrides.Scope(self.names, self.tree.meta_dir, (str(self.tree.root), str(self.names["CK_DIR"])))


def make_plan(manifest: Manifest, tree: AiterTree, inputs: PlanInputs) -> Plan:
    """The plan of the manifest's modules (every module of the tree's table when it names none)."""
    p = _start(manifest, tree, inputs)
    wanted = [m.name for m in manifest.modules] or _all_modules(p.table, p.names, inputs.env, p.notes)
    plans = [_module(p, name) for name in wanted]
    _check_unique(plans, manifest)
    tree_sources.check_search_dirs(p.searched, p.tree_roots, p.tree_roots + p.own_roots + p.named_roots)
    for key, mods in p.unknown.items():
        shown = ", ".join(mods[:3]) + (f" and {len(mods) - 3} more" if len(mods) > 3 else "")
        p.notes.append(
            f"{TABLE}: key {key!r} ({shown}) is not one AITER's get_args_of_build knows; passed through, unused by qola"
        )
    uses = _fixes(p, plans)
    return Plan(
        namespace=manifest.qola.namespace,
        vendor=vendor(inputs.archs[0]) or "",
        archs=inputs.archs,
        tree_root=str(tree.root),
        meta_dir=str(tree.meta_dir),
        tree_commit=inputs.tree_commit,
        manifest_path=manifest.path,
        manifest_sha256=manifest.sha256,
        modules=tuple(plans),
        warnings=tuple(p.notes),
        mode=p.mode_default,
        pin=dict(inputs.pin) if inputs.pin is not None else None,
        fixes=uses,
    )


def _fixes(p: _Planning, plans: list[ModulePlan]) -> tuple[fixes_mod.FixUse, ...]:
    """The fixes of :mod:`qola.plan.fixes` on this tree, each for the modules that read its file: a
    module compiles it (its sources) or can include it (the file's directory is on its include path);
    a note for each fix the tree already has and each whose code is found changed."""
    chosen = fixes_mod.chosen(p.inputs.fixes, p.inputs.fixes_from)
    meta = Path(p.tree.meta_dir)
    readers: dict[str, tuple[str, ...]] = {}
    for fix in chosen:
        path = os.path.realpath(meta / fix.file)
        where = os.path.dirname(path)
        readers[fix.file] = tuple(
            m.name
            for m in plans
            if any(os.path.realpath(s) == path for s in m.sources)
            or any(os.path.realpath(d) == where for d in m.include_dirs)
        )
    uses = fixes_mod.decide(chosen, meta, readers)
    for u in uses:
        if u.status == fixes_mod.CHANGED:
            p.notes.append(f"{u.note}: module(s) {', '.join(u.modules)} fail (or leave it out: [qola] fixes)")
        elif u.note:
            p.notes.append(u.note)
    return uses


def _start(manifest: Manifest, tree: AiterTree, inputs: PlanInputs) -> _Planning:
    space = namespace(tree, archs=inputs.archs, env=inputs.env, hip_version=inputs.hip_version)
    want = manifest.qola.aiter_commit
    return _Planning(
        manifest=manifest,
        tree=tree,
        inputs=inputs,
        table=load_table(tree),
        space=space,
        notes=list(inputs.warnings or []),
        mode_default=inputs.mode or manifest.build.mode or DEFAULT_MODE,
        pinned=bool(want and inputs.tree_commit and inputs.tree_commit.startswith(want)),
        tree_roots=tree_sources.real_roots([tree.root, str(space.names["CK_DIR"])]),
        own_roots=tree_sources.real_roots([Path(qola.__file__).parent]),  # qola's templates and runtime
    )


@dataclasses.dataclass
class _Module:
    """One module being planned: its manifest section and its (overridden) table entry."""

    name: str
    section: ModuleSection | None
    entry: dict[str, Any]
    table_directions: set[str]  # the table's generator directions, before the manifest's blob_gen_cmd


def _entry(p: _Planning, name: str) -> _Module:
    """The module's table entry with the manifest's overrides."""
    section = p.manifest.module(name)
    if name in p.table:
        entry = resolve_entry(name, p.table[name], p.names, p.notes)
        for key in unknown_keys(p.table[name]):
            p.unknown.setdefault(key, []).append(name)
    elif section is not None and (section.srcs is not None or section.blob_gen_cmd is not None):
        entry = resolve_entry(name, {}, p.names)
    else:
        raise QolaError(
            f"module {name!r} is not in the tree's module table and not declared in full in the manifest",
            hint=f"{_nearest(name, list(p.table))}; or give it srcs/blob_gen_cmd in its [[modules]] entry",
            where=p.manifest.path or None,
        )
    table_directions = {m.group(1) for cmd in entry["blob_gen_cmd"] if (m := DIRECTION_RE.search(cmd))}
    if section is not None:
        prefix = f"modules[{p.manifest.modules.index(section)}]"
        given = overrides_of(section, p.scope, prefix, p.manifest.path or None)
        p.named_roots += tree_sources.manifest_roots(
            [str(s) for k in ("srcs", "add_srcs") for s in (given.get(k) or [])]
            + [c.split()[0] for c in given.get("blob_gen_cmd") or [] if isinstance(c, str) and c.strip()],
            p.tree_roots,
        )
        entry.update(given)
    return _Module(name, section, entry, table_directions)


def _sources(p: _Planning, m: _Module) -> tuple[list[str], list[str]]:
    """(the module's sources, those listed that do not exist), with notes for the missing and skipped."""
    srcs = [str(s) for s in m.entry["srcs"]] + [str(s) for s in m.entry.get("add_srcs", [])]
    sources, missing, skipped = expand_sources(srcs)
    if missing:
        p.notes.append(
            f"module {m.name}: {len(missing)} source(s) listed for it do not exist: "
            + ", ".join(Path(x).name for x in missing)
        )
    if skipped:
        p.notes.append(
            f"module {m.name}: {len(skipped)} listed source(s) are not {' or '.join(SOURCE_EXTS)} files "
            "and are not compiled: " + ", ".join(skipped)
        )
    drops = list(m.section.drop_srcs) if m.section else []
    return drop_sources(sources, drops, m.name, p.notes, p.pinned), missing


def _needs(p: _Planning, m: _Module, reg: registry.RegistryEntry | None, sources: list[str]) -> needs.Needs:
    """What the module needs to contain kernels, where its sources ask (:mod:`qola.plan.needs`);
    its flags join the entry's ``flags_extra_hip``."""
    if reg is None:
        return needs.Needs()
    entry, name = m.entry, m.name
    need = needs.needs(
        name,
        reg,
        sources,
        [*map(str, entry["flags_extra_cc"]), *map(str, entry["flags_extra_hip"])],
        [str(c) for c in entry["blob_gen_cmd"] if isinstance(c, str)],
        lambda expr: resolve_entry(name, {"blob_gen_cmd": [expr]}, p.names)["blob_gen_cmd"][0],
    )
    entry["flags_extra_hip"] = [*entry["flags_extra_hip"], *need.flags]
    p.notes += need.notes
    return need


def _generators(p: _Planning, m: _Module, extra: tuple[str, ...], no_ck: bool) -> tuple[Generator, ...]:
    """The module's (overridden) generators, then the registry's (``extra``), as QoLA appends its
    registry's add_blob_gen_cmd after the module's list, its drop_directions and receipt."""
    archs, section = p.inputs.archs, m.section
    replaced = m.table_directions if section is not None and section.blob_gen_cmd is not None else set()
    own = per_arch(m.entry["blob_gen_cmd"], p.tree, archs)
    gens = generators_of(own, section, m.name, p.notes, replaced, no_ck=no_ck)
    gens += generators_of(per_arch(list(extra), p.tree, archs), None, m.name, p.notes)
    return with_targets(gens, archs, extra, p.tree.hsa)


@dataclasses.dataclass
class _Registered:
    """What qola's registry gives a cpp_itfs module (:mod:`qola.plan.registry`)."""

    sources: list[str]
    includes: list[str]
    headers: list[str]
    embed: list[str]
    api: itfs.Api | None = None


def _registered(
    p: _Planning, m: _Module, reg: registry.RegistryEntry | None, sources: list[str], includes: list[str]
) -> _Registered:
    explicit = m.section.embed_dirs if m.section else None
    embed = list(explicit) if explicit is not None else []
    if reg is None:
        return _Registered(sources, includes, [], embed)
    includes = includes + reg.include_dirs()
    api = None
    if reg.api_header is not None:
        spec = itfs.ApiSpec(
            m.name,
            reg.api_header,
            reg.exports,
            reg.public_header or f"qola_{m.name}.h",
            reg.provides,
            reg.api_includes,
            dict(reg.entry_macros),
            reg.exports_if_declared,
        )
        api = itfs.resolve(spec, p.tree.meta_dir, includes, p.notes)
    return _Registered(
        sources=reg.apply_sources(sources),
        includes=includes,
        headers=[h for h in reg.header_paths(p.tree.meta_dir) if Path(h).is_file()],
        embed=embed if explicit is not None else list(reg.embed),
        api=api,
    )


def _configs(p: _Planning, m: _Module) -> tuple[MergedConfig, ...]:
    configs = configs_used(m.name, m.entry, p.space.merges, p.notes)
    for cfg in configs:
        if cfg.path not in p.merged:  # merge once now (pure) so that a bad CSV fails the plan, not the build
            p.merged[cfg.path] = cfg
            p.notes += merge(cfg).notes
    return configs


def _module(p: _Planning, name: str) -> ModulePlan:
    """One module's plan."""
    m = _entry(p, name)
    entry, section = m.entry, m.section
    mode = section.mode if section is not None and section.mode else p.mode_default
    sources, missing = _sources(p, m)
    cpp_itfs = mode == "cpp_itfs"
    if cpp_itfs:
        check_itfs(name, entry, section, p.manifest, name in p.table)
    standalone = bool(entry["is_standalone"])
    includes = default_includes(p.tree, p.names, standalone) + [str(i) for i in entry["extra_include"]]
    reg = registry.entry(name) if cpp_itfs else None
    need = _needs(p, m, reg, sources)
    flags_hip = [f for f in map(str, entry["flags_extra_hip"]) if f.strip()]
    flags_cc = [f for f in map(str, entry["flags_extra_cc"]) if f.strip()]
    flags_cc += cc_switch_flags(
        p.space.core, flags_cc, p.inputs.env
    )  # -DENABLE_CK=1 …, where the tree's build adds them
    generators = _generators(p, m, need.generators, ck_free(flags_cc, p.inputs.env))
    got = _registered(p, m, reg, sources, includes)
    if reg is None and cpp_itfs:
        got.includes.append(str(registry.data_dir()))
    configs = _configs(p, m)
    if entry.get("third_party"):
        p.notes.append(
            f"module {name}: third_party {entry['third_party']} is not fetched by qola (AITER clones "
            "it at build time); place it under the tree's 3rdparty/ and add its include dir"
        )
    _check_confined(p, name, got.sources, generators, got.includes)
    ldflags = entry["extra_ldflags"] or []
    return ModulePlan(
        name=name,
        md_name=f"{p.manifest.qola.namespace}_{entry['md_name'] or name}",
        table_md_name=entry["md_name"] or name,
        mode=mode,
        link=(section.link if section and section.link else p.manifest.build.link),
        sources=tuple(got.sources),
        flags_extra_cc=tuple(flags_cc),
        flags_extra_hip=tuple(flags_hip),
        include_dirs=tuple(dict.fromkeys(got.includes)),
        generators=generators,
        torch_exclude=True if cpp_itfs else bool(entry["torch_exclude"]),
        is_python_module=False if cpp_itfs else bool(entry["is_python_module"]),
        is_standalone=standalone,
        hip_clang_path=entry["hip_clang_path"] if entry["hip_clang_path"] else None,
        extra_ldflags=tuple(ldflags if isinstance(ldflags, list) else shlex.split(str(ldflags))),
        embed=tuple(got.embed),
        missing_sources=tuple(missing),
        headers=tuple(got.headers),
        per_source_flags=_per_source_flags(entry),
        configs=configs,
        api=got.api,
        gates=need.gates,
    )


def _per_source_flags(entry: Mapping[str, Any]) -> tuple[tuple[str, tuple[str, ...]], ...]:
    return tuple(
        (str(k), tuple(str(f) for f in (v if isinstance(v, list) else [v])))
        for k, v in (entry.get("flags_extra_hip_per_source") or {}).items()  # table order: AITER's
    )


def _check_confined(
    p: _Planning, name: str, sources: list[str], generators: tuple[Generator, ...], includes: list[str]
) -> None:
    """The module's sources and generator scripts lie under the tree, qola or what the manifest names."""
    allowed = p.tree_roots + p.own_roots + p.named_roots
    scripts = [g.script for g in generators if os.path.isabs(g.script)]
    tree_sources.check_sources(name, sources, allowed)
    tree_sources.check_sources(name, scripts, allowed, what="generator script", use="run it")
    p.searched += tree_sources.search_dirs(sources + scripts, includes)
