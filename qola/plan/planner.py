"""Manifest + kernel tree → :class:`Plan`: frozen, JSON-serialisable, one entry per module.

Pure: reads the tree's files, never writes, never runs a generator.
"""

from __future__ import annotations

import dataclasses
import difflib
import fnmatch
import os
import re
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import qola
from qola.core import settings
from qola.core.errors import QolaError
from qola.core.rules import git_rev_problem
from qola.plan import genrules, itfs, needs, registry
from qola.plan.manifest import Manifest, ModuleSection, vendor
from qola.plan.model import DEFAULT_MODE, Generator, JitSplit, ModulePlan, Plan
from qola.plan.tree import overrides
from qola.plan.tree import sources as tree_sources
from qola.plan.tree.aiter import TABLE, AiterTree, git_head, load_table, namespace, resolve_entry, unknown_keys
from qola.plan.tree.aiter_configs import MergedConfig, merge
from qola.plan.tree.aiter_core import cc_switch_flags

if TYPE_CHECKING:
    from qola.checkout.git import GitEnv

__all__ = [
    "OUTPUT_DIR",
    "Generator",
    "JitSplit",
    "ModulePlan",
    "Plan",
    "choose_archs",
    "default_mode",
    "check_pin",
    "make_plan",
]

SOURCE_EXTS = (".cu", ".cpp")
OUTPUT_DIR = "{}"  # AITER's placeholder for a generator's output dir
_DIRECTION_RE = re.compile(r"(?:^|\s)(?:-d|--direction|-a|--api)(?:=|\s+)(\S+)")


def choose_archs(cli_archs: Sequence[str] | None, manifest: Manifest, env: Mapping[str, str]) -> tuple[str, ...]:
    """``--arch`` > ``[build].architectures`` > ``GPU_ARCHS`` (:data:`qola.core.settings.ARCHS`:
    ``;``-separated lists, an ``--arch ""`` naming nothing is as if it were not given, as in QoLA)."""
    return settings.resolve(settings.ARCHS, cli_archs, manifest.build.architectures, env).value


def default_mode(cli_mode: str | None, manifest: Manifest) -> str:
    """The mode of modules without their own: ``--mode`` > ``[build].mode`` > ``pybind``
    (the one place this is decided; :attr:`Plan.mode` carries it)."""
    return settings.resolve(settings.MODE, cli_mode, manifest.build.mode, default=lambda: DEFAULT_MODE).value


def check_pin(
    manifest: Manifest,
    tree: AiterTree,
    allow_unpinned: bool,
    *,
    want: str | None = None,
    want_from: str = "[qola] aiter_commit",
    chosen: str | None = None,
    git_env: GitEnv | None = None,
) -> tuple[str | None, list[str], dict[str, Any]]:
    """(tree commit or None, warnings, the pin record for manifest.json). ``want``: the commit asked
    for (``--aiter-commit``; default the manifest's pin; a tag or branch is resolved in the tree).
    A mismatch is an error, unless ``allow_unpinned`` or ``chosen`` (why the tree is the user's
    explicit choice: ``--skip-checkout``, ``NVTE_AITER_SOURCE_DIR``): then a warning, recorded.
    ``git_env``: what asking the tree for a tag or branch runs git under (None: an empty environment)."""
    want = want or manifest.qola.aiter_commit
    source = (want_from if want != manifest.qola.aiter_commit else "[qola] aiter_commit") if want else None
    problem = git_rev_problem(want) if want else None
    if problem:
        raise QolaError(f"{source} {want!r} {problem}")
    head, unreadable = git_head(tree, git_env)
    record: dict[str, Any] = {"expected": want, "actual": head, "source": source, "tree_chosen_by": chosen}
    if unreadable is not None:  # a git checkout whose commit git will not tell: a pin is not taken on trust
        record["status"] = "unknown"
        msg = f"{tree.root} is a git checkout, but its commit cannot be read: {unreadable}"
        if not want:
            return None, [msg], record
        if chosen or allow_unpinned:
            why = f"the tree is the one {chosen} chose" if chosen else "--allow-unpinned"
            return None, [msg + f"; {source} {want} is not verified ({why}; recorded in manifest.json)"], record
        raise QolaError(
            msg + f"; {source} pins {want}, which qola cannot verify",
            hint="install git, or mark the tree safe (git config --global --add safe.directory "
            f"{tree.root}) if another user owns it; or build it as it is with --skip-checkout "
            "(a recorded warning) or --allow-unpinned",
        )
    if head is None:
        record["status"] = "unknown"
        note = f"{tree.root} is not a git checkout (an sdist?): its commit cannot be checked"
        return None, [note + (f" against aiter_commit {want}" if want else "")], record
    if not want:
        record["status"] = "unpinned"
        return head, [], record
    if _same_commit(tree, head, want, git_env):
        record["status"] = "match"
        return head, [], record
    record["status"] = "mismatch"
    msg = f"tree {tree.root} is at commit {head}, but {source} pins {want}"
    if chosen:
        return (
            head,
            [msg + f" (the tree is the one {chosen} chose: built as it is, the mismatch is recorded in manifest.json)"],
            record,
        )
    if not allow_unpinned:
        raise QolaError(
            msg,
            hint=f"check it out (qola checkout --aiter-root {tree.root} --manifest …), build it as "
            "it is with --skip-checkout (a recorded warning), update aiter_commit, or pass --allow-unpinned",
        )
    return head, [msg + " (--allow-unpinned)"], record


def _same_commit(tree: AiterTree, head: str, want: str, env: GitEnv | None) -> bool:
    if re.fullmatch(r"[0-9a-f]{4,40}", want) and head.startswith(want):
        return True
    from qola.checkout import git  # lazy: a tag or branch: ask the tree

    try:
        done = git.run(tree.root, "rev-parse", "--verify", "--quiet", f"{want}^{{commit}}", env=env or {}, check=False)
    except QolaError:
        return False
    return done.returncode == 0 and done.stdout.strip() == head


def _nearest(name: str, keys: list[str]) -> str:
    close = difflib.get_close_matches(name, keys, n=3, cutoff=0.5)
    return f"nearest table keys: {', '.join(close)}" if close else "no similar table key"


def _expand_sources(items: list[str]) -> tuple[list[str], list[str], list[str]]:
    """Files as given; directories expand to their .cu/.cpp files (not recursive), as AITER.
    Returns (found, missing, skipped: listed files that are not sources, never silently)."""
    found: list[str] = []
    missing: list[str] = []
    skipped: list[str] = []
    for item in items:
        p = Path(item)
        if p.is_dir():
            found += sorted(str(c) for c in p.iterdir() if c.is_file() and c.suffix in SOURCE_EXTS)
        elif p.suffix in SOURCE_EXTS:
            (found if p.exists() else missing).append(str(p))
        else:
            skipped.append(str(p))
    return found, missing, skipped


def _drop(sources: list[str], patterns: list[str], module: str, notes: list[str], pinned: bool) -> list[str]:
    """Remove matching sources. A pattern matching none of them is an error when the tree is the
    commit the manifest pins (the manifest was written for this tree); otherwise a warning: trees
    differ between AITER versions, and QoLA manifests name files of the version they were written for."""
    kept = list(sources)
    for pat in patterns:
        hit = [s for s in kept if fnmatch.fnmatch(Path(s).name, pat) or s.endswith("/" + pat.lstrip("/"))]
        if not hit:
            names = sorted({Path(s).name for s in sources})
            close = difflib.get_close_matches(pat, names, n=3, cutoff=0.4)
            near = (
                f"nearest source names: {', '.join(close)}"
                if close
                else f"its sources: {', '.join(names[:8])}{' …' if len(names) > 8 else ''}"
                if names
                else "the module lists no sources in this tree (its instances come from generators)"
            )
            msg = f"modules.{module}.drop_srcs: {pat!r} matches none of the module's sources"
            if pinned:
                raise QolaError(msg, hint=f"{near}; remove or fix the pattern (a file name or glob)")
            notes.append(f"{msg} ({near}); an error when the tree is the commit the manifest pins")
        kept = [s for s in kept if s not in hit]
    return kept


def _per_arch(cmds: Any, tree: AiterTree, archs: tuple[str, ...]) -> list[Any]:
    """Per-arch asm generators (``hsa/<gfx>/…``) once per target arch (:func:`genrules.per_arch`)."""
    out: list[Any] = []
    for cmd in list(cmds):
        argv = shlex.split(cmd) if isinstance(cmd, str) and cmd.strip() else []
        out += genrules.per_arch(cmd, argv[0], tree.hsa, archs) if argv else [cmd]
    return out


def _generators(
    cmds: list[str],
    section: ModuleSection | None,
    name: str,
    notes: list[str],
    table_directions: set[str] | frozenset[str] = frozenset(),
    no_ck: bool = False,
) -> tuple[Generator, ...]:
    """Generators of ``cmds`` with the module's receipt and ``drop_directions`` applied. A dropped
    direction that no command has is an error, unless the manifest's ``blob_gen_cmd`` replaced the
    table's commands and the table had it (QoLA's manifests drop it twice: a note)."""
    gens = []
    for cmd in cmds:
        if not isinstance(cmd, str) or not cmd.strip():
            continue
        direction = m.group(1) if (m := _DIRECTION_RE.search(cmd)) else None
        receipt = r.group(3) if (r := genrules.RECEIPT_ARG.search(cmd)) else None
        asked = False
        if section is not None and section.receipt is not None and direction is not None:
            # the manifest's receipt: a new one for the table's command, or on the manifest's own commands
            asked = receipt != str(section.receipt) or section.blob_gen_cmd is not None
            receipt = str(section.receipt)
            if genrules.RECEIPT_ARG.search(cmd):
                cmd = genrules.RECEIPT_ARG.sub(lambda mm: f"{mm.group(1)}{mm.group(2)}{receipt}", cmd, count=1)
            else:
                cmd = f"{cmd} --receipt {receipt}"
        gens.append(Generator(cmd, direction, receipt, asked_receipt=asked))
    drops = list(section.drop_directions) if section else []
    have = {g.direction for g in gens}
    replaced = [d for d in drops if d not in have and d in table_directions]
    if replaced:
        notes.append(
            f"modules.{name}.drop_directions: {replaced}: the manifest's blob_gen_cmd already replaced "
            "the table's commands of these directions (nothing left to drop)"
        )
    unknown = [d for d in drops if d not in have and d not in replaced]
    if unknown:
        shown = sorted(d for d in have if d)
        raise QolaError(
            f"modules.{name}.drop_directions: {unknown} match no generator command of the module",
            hint=f"its generator directions are: {', '.join(shown) or 'none'}",
        )
    kept = []
    for g in gens:
        left = _dropped(g, no_ck) if g.direction in drops else g
        if left is not None:
            kept.append(left)
    return tuple(kept)


def _targets(
    gens: tuple[Generator, ...], archs: tuple[str, ...], added: tuple[str, ...], hsa_dir: Path
) -> tuple[Generator, ...]:
    """Each generator with the archs it generates for (:func:`genrules.targets_of`): CK's fMHA
    generator gets ``--targets`` from the plan's archs when its own argument list declares it."""
    out = []
    for g in gens:
        cmd, targets = genrules.with_targets(g.command, g.script, archs, hsa_dir)
        out.append(
            dataclasses.replace(g, command=cmd, targets=targets, origin="registry" if g.command in added else None)
        )
    return tuple(out)


def ck_free(flags_cc: list[str], env: Mapping[str, str]) -> bool:
    """AITER's switch (``aiter/jit/core.py``): a module is built without CK when its ``flags_extra_cc``
    define ``ENABLE_CK=0``, or, when none of them names ENABLE_CK, when the environment's ``ENABLE_CK`` is 0."""
    named = [f for f in flags_cc if "ENABLE_CK" in f]
    if named:
        return any(re.search(r"-DENABLE_CK=0+(\s|$)", f) for f in named)
    return env.get("ENABLE_CK", "1").strip() in ("0", "00")


def _dropped(gen: Generator, no_ck: bool = False) -> Generator | None:
    """A dropped direction of CK's generator writes its dispatch alone (no kernel; AITER's API still
    calls it) unless the module is built CK-free (its API calls no CK dispatch, and CK's headers may
    not compile for its targets: dropped entirely, as QoLA does); any other generator of a dropped
    direction is not run (None)."""
    ck = genrules.flavor_of(gen.script) == "ck" and not no_ck
    filt = genrules.dispatch_only_filter(gen.direction) if ck else None
    return None if filt is None else dataclasses.replace(gen, filter=filt, dispatch_only=True)


def _overrides(section: ModuleSection, scope: overrides.Scope, prefix: str, where: str | None) -> dict[str, Any]:
    """The manifest's values that replace table values: plain values or expression strings, resolved
    as :mod:`qola.plan.tree.overrides` says (relative paths against the meta dir)."""
    out: dict[str, Any] = {
        key: getattr(section, key)
        for key in ("flags_extra_hip_per_source", "md_name", "is_python_module", "is_standalone", "torch_exclude")
        if getattr(section, key) is not None
    }
    if section.flags_extra_hip_per_source is not None:
        overrides.check_plain_flags(section.flags_extra_hip_per_source, prefix, where)
    out.update(overrides.resolve_all({key: getattr(section, key) for key in overrides.KINDS}, scope, prefix, where))
    return out


def _default_includes(tree: AiterTree, names: Mapping[str, Any], standalone: bool) -> list[str]:
    ck = names["CK_3RDPARTY_DIR"]
    dirs = [names["CK_HELPER_DIR"], f"{ck}/include", f"{ck}/library/include", f"{tree.csrc}/include"]
    if not standalone:
        dirs.append(f"{tree.csrc}/include/torch")
    return [d for d in dirs if Path(d).is_dir()]


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


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, (list, tuple)):
        return [s for v in value for s in _strings(v)]
    if isinstance(value, Mapping):
        return [s for v in value.values() for s in _strings(v)]
    return []


def _configs_used(
    name: str, entry: Mapping[str, Any], merges: Mapping[str, MergedConfig], notes: list[str]
) -> tuple[MergedConfig, ...]:
    """The merged configs the module's values name; only generator commands can use them."""
    used = []
    for path, cfg in sorted(merges.items()):
        keys = [k for k, v in entry.items() if any(path in s for s in _strings(v))]
        if keys:
            used.append(cfg)
        if [k for k in keys if k != "blob_gen_cmd"]:
            notes.append(
                f"module {name}: {path} (a merged tuned config) appears in {keys}; qola writes it for "
                "generator commands only"
            )
    return tuple(used)


def _check_itfs(
    name: str, entry: Mapping[str, Any], section: ModuleSection | None, manifest: Manifest, in_table: bool
) -> None:
    """cpp_itfs builds a torch-free library, never a Python module. A manifest asking for both is an
    error; so is a table module that is a Python module (its sources are pybind glue) unless qola's
    registry has its cpp_itfs wrapper or the manifest declares it ``is_python_module = false``."""
    if section is not None and section.is_python_module:
        raise QolaError(
            f"modules.{name}: is_python_module = true contradicts mode cpp_itfs (a torch-free C/C++ library)",
            hint='drop is_python_module, or build the module with mode = "pybind"',
            where=manifest.path or None,
        )
    if section is not None and section.is_python_module is False:
        return
    if in_table and entry["is_python_module"] and registry.entry(name) is None:
        raise QolaError(
            f"module {name!r} is a Python extension module in the tree's table (is_python_module is true) "
            "and qola has no cpp_itfs wrapper for it: its pybind sources cannot build as a torch-free library",
            hint='build it with mode = "pybind" in its [[modules]] entry, or declare it torch-free there: '
            "is_python_module = false (with srcs or drop_srcs that leave out its pybind sources)",
            where=manifest.path or None,
        )


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


def make_plan(
    manifest: Manifest,
    tree: AiterTree,
    *,
    archs: tuple[str, ...],
    cli_mode: str | None = None,
    env: Mapping[str, str],
    hip_version: str | None = None,
    tree_commit: str | None = None,
    warnings: list[str] | None = None,
    pin: Mapping[str, Any] | None = None,
) -> Plan:
    table = load_table(tree)
    mode_default = default_mode(cli_mode, manifest)
    space = namespace(tree, archs=archs, env=env, hip_version=hip_version)
    names = space.names
    scope = overrides.Scope(names, tree.meta_dir, (str(tree.root), str(names["CK_DIR"])))
    tree_roots = tree_sources.real_roots([tree.root, str(names["CK_DIR"])])
    own_roots = tree_sources.real_roots([Path(qola.__file__).parent])  # qola's templates and runtime
    searched: list[str] = []
    named_roots: tuple[str, ...] = ()
    ns = manifest.qola.namespace
    notes = list(warnings or [])
    wanted = [m.name for m in manifest.modules] or _all_modules(table, names, env, notes)
    want = manifest.qola.aiter_commit
    pinned = bool(want and tree_commit and tree_commit.startswith(want))
    plans = []
    unknown: dict[str, list[str]] = {}
    merged: dict[str, MergedConfig] = {}
    for name in wanted:
        section = manifest.module(name)
        if name in table:
            entry = resolve_entry(name, table[name], names, notes)
            for key in unknown_keys(table[name]):
                unknown.setdefault(key, []).append(name)
        elif section is not None and (section.srcs is not None or section.blob_gen_cmd is not None):
            entry = resolve_entry(name, {}, names)
        else:
            raise QolaError(
                f"module {name!r} is not in the tree's module table and not declared in full in the manifest",
                hint=f"{_nearest(name, list(table))}; or give it srcs/blob_gen_cmd in its [[modules]] entry",
                where=manifest.path or None,
            )
        table_directions = {m.group(1) for cmd in entry["blob_gen_cmd"] if (m := _DIRECTION_RE.search(cmd))}
        if section is not None:
            prefix = f"modules[{manifest.modules.index(section)}]"
            given = _overrides(section, scope, prefix, manifest.path or None)
            named_roots += tree_sources.manifest_roots(
                [str(s) for k in ("srcs", "add_srcs") for s in (given.get(k) or [])]
                + [c.split()[0] for c in given.get("blob_gen_cmd") or [] if isinstance(c, str) and c.strip()],
                tree_roots,
            )
            entry.update(given)
        mode = section.mode if section is not None and section.mode else mode_default
        srcs = [str(s) for s in entry["srcs"]] + [str(s) for s in entry.get("add_srcs", [])]
        sources, missing, skipped = _expand_sources(srcs)
        if missing:
            notes.append(
                f"module {name}: {len(missing)} source(s) listed for it do not exist: "
                + ", ".join(Path(m).name for m in missing)
            )
        if skipped:
            notes.append(
                f"module {name}: {len(skipped)} listed source(s) are not {' or '.join(SOURCE_EXTS)} files "
                "and are not compiled: " + ", ".join(skipped)
            )
        sources = _drop(sources, list(section.drop_srcs) if section else [], name, notes, pinned)
        cpp_itfs = mode == "cpp_itfs"
        if cpp_itfs:
            _check_itfs(name, entry, section, manifest, name in table)
        standalone = bool(entry["is_standalone"])
        includes = _default_includes(tree, names, standalone) + [str(i) for i in entry["extra_include"]]
        reg = registry.entry(name) if cpp_itfs else None
        headers: list[str] = []
        explicit = section.embed_dirs if section else None
        embed = list(explicit) if explicit is not None else []
        api = None
        need = needs.Needs()
        if reg is not None:  # what the module needs to contain kernels, where its sources ask (qola.plan.needs)
            need = needs.needs(
                name,
                reg,
                sources,
                [*map(str, entry["flags_extra_cc"]), *map(str, entry["flags_extra_hip"])],
                [str(c) for c in entry["blob_gen_cmd"] if isinstance(c, str)],
                lambda expr: resolve_entry(name, {"blob_gen_cmd": [expr]}, names)["blob_gen_cmd"][0],
            )
            entry["flags_extra_hip"] = [*entry["flags_extra_hip"], *need.flags]
            notes += need.notes
        flags_hip = [f for f in map(str, entry["flags_extra_hip"]) if f.strip()]
        flags_cc = [f for f in map(str, entry["flags_extra_cc"]) if f.strip()]
        flags_cc += cc_switch_flags(space.core, flags_cc, env)  # -DENABLE_CK=1 …, where the tree's build adds them
        generators = _generators(
            _per_arch(entry["blob_gen_cmd"], tree, archs),
            section,
            name,
            notes,
            table_directions if section is not None and section.blob_gen_cmd is not None else set(),
            no_ck=ck_free(flags_cc, env),
        )
        # the registry's generators come after the module's (overridden) list, its drop_directions and
        # receipt, as QoLA appends its registry's add_blob_gen_cmd
        generators += _generators(_per_arch(list(need.generators), tree, archs), None, name, notes)
        if reg is not None:
            sources = reg.apply_sources(sources)
            includes += reg.include_dirs()
            headers = [h for h in reg.header_paths(tree.meta_dir) if Path(h).is_file()]
            embed = embed if explicit is not None else list(reg.embed)
            if reg.api_header is not None:
                api = itfs.resolve(
                    name,
                    tree.meta_dir,
                    includes,
                    reg.api_header,
                    reg.exports,
                    reg.public_header or f"qola_{name}.h",
                    reg.provides,
                    reg.api_includes,
                    notes,
                    dict(reg.entry_macros),
                )
        elif cpp_itfs:
            includes.append(str(registry.data_dir()))
        ldflags = entry["extra_ldflags"] or []
        configs = _configs_used(name, entry, space.merges, notes)
        for cfg in configs:
            if cfg.path not in merged:  # merge once now (pure) so that a bad CSV fails the plan, not the build
                merged[cfg.path] = cfg
                notes += merge(cfg).notes
        if entry.get("third_party"):
            notes.append(
                f"module {name}: third_party {entry['third_party']} is not fetched by qola (AITER clones "
                "it at build time); place it under the tree's 3rdparty/ and add its include dir"
            )
        allowed = tree_roots + own_roots + named_roots
        scripts = [g.script for g in generators if os.path.isabs(g.script)]
        tree_sources.check_sources(name, sources, allowed)
        tree_sources.check_sources(name, scripts, allowed, what="generator script", use="run it")
        searched += tree_sources.search_dirs(sources + scripts, includes)
        plans.append(
            ModulePlan(
                name=name,
                md_name=f"{ns}_{entry['md_name'] or name}",
                table_md_name=entry["md_name"] or name,
                mode=mode,
                link=(section.link if section and section.link else manifest.build.link),
                sources=tuple(sources),
                flags_extra_cc=tuple(flags_cc),
                flags_extra_hip=tuple(flags_hip),
                include_dirs=tuple(dict.fromkeys(includes)),
                generators=_targets(generators, archs, need.generators, tree.hsa),
                torch_exclude=True if cpp_itfs else bool(entry["torch_exclude"]),
                is_python_module=False if cpp_itfs else bool(entry["is_python_module"]),
                is_standalone=standalone,
                hip_clang_path=entry["hip_clang_path"] if entry["hip_clang_path"] else None,
                extra_ldflags=tuple(ldflags if isinstance(ldflags, list) else shlex.split(str(ldflags))),
                embed=tuple(embed),
                missing_sources=tuple(missing),
                headers=tuple(headers),
                per_source_flags=tuple(
                    (str(k), tuple(str(f) for f in (v if isinstance(v, list) else [v])))
                    for k, v in (entry.get("flags_extra_hip_per_source") or {}).items()  # table order: AITER's
                ),
                configs=configs,
                api=api,
                gates=need.gates,
            )
        )
    _check_unique(plans, manifest)
    tree_sources.check_search_dirs(searched, tree_roots, tree_roots + own_roots + named_roots)
    for key, mods in unknown.items():
        shown = ", ".join(mods[:3]) + (f" and {len(mods) - 3} more" if len(mods) > 3 else "")
        notes.append(
            f"{TABLE}: key {key!r} ({shown}) is not one AITER's get_args_of_build knows; passed through, unused by qola"
        )
    return Plan(
        namespace=ns,
        vendor=vendor(archs[0]) or "",
        archs=archs,
        tree_root=str(tree.root),
        meta_dir=str(tree.meta_dir),
        tree_commit=tree_commit,
        manifest_path=manifest.path,
        manifest_sha256=manifest.sha256,
        modules=tuple(plans),
        warnings=tuple(notes),
        mode=mode_default,
        pin=dict(pin) if pin is not None else None,
    )
