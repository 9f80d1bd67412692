"""The pieces of one module's plan (:func:`qola.plan.planner.make_plan` puts them together): its
sources as listed and dropped, its generators with receipts, dropped directions and targets, the
manifest's overrides, default include dirs, the merged configs it uses, the cpp_itfs checks.

Pure: reads the tree's files, never writes, never runs a generator.
"""

from __future__ import annotations

import dataclasses
import difflib
import fnmatch
import re
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from qola.core.errors import QolaError
from qola.plan import genrules, registry
from qola.plan.manifest import Manifest, ModuleSection
from qola.plan.model import Generator
from qola.plan.tree import overrides
from qola.plan.tree.aiter import AiterTree
from qola.plan.tree.aiter_configs import MergedConfig

SOURCE_EXTS = (".cu", ".cpp")
DIRECTION_RE = re.compile(r"(?:^|\s)(?:-d|--direction|-a|--api)(?:=|\s+)(\S+)")


def expand_sources(items: list[str]) -> tuple[list[str], list[str], list[str]]:
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


def drop_sources(sources: list[str], patterns: list[str], module: str, notes: list[str], pinned: bool) -> list[str]:
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


def per_arch(cmds: Any, tree: AiterTree, archs: tuple[str, ...]) -> list[Any]:
    """Per-arch asm generators (``hsa/<gfx>/…``) once per target arch (:func:`genrules.per_arch`)."""
    out: list[Any] = []
    for cmd in list(cmds):
        argv = shlex.split(cmd) if isinstance(cmd, str) and cmd.strip() else []
        out += genrules.per_arch(cmd, argv[0], tree.hsa, archs) if argv else [cmd]
    return out


def generators_of(
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
        direction = m.group(1) if (m := DIRECTION_RE.search(cmd)) else None
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


def with_targets(
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


def overrides_of(section: ModuleSection, scope: overrides.Scope, prefix: str, where: str | None) -> dict[str, Any]:
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


def default_includes(tree: AiterTree, names: Mapping[str, Any], standalone: bool) -> list[str]:
    ck = names["CK_3RDPARTY_DIR"]
    dirs = [names["CK_HELPER_DIR"], f"{ck}/include", f"{ck}/library/include", f"{tree.csrc}/include"]
    if not standalone:
        dirs.append(f"{tree.csrc}/include/torch")
    return [d for d in dirs if Path(d).is_dir()]


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, (list, tuple)):
        return [s for v in value for s in _strings(v)]
    if isinstance(value, Mapping):
        return [s for v in value.values() for s in _strings(v)]
    return []


def configs_used(
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


def check_itfs(
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
