"""The end of a build: stage 11 (:func:`publish_out`, a new version of OUT), stage 12
(:func:`remember`, the record the next no-op and incremental build read; :func:`store`, the output
packaged with ``--publish``) and the ``--prebuilt`` path's install (:func:`install_prebuilt`).
:mod:`qola.pipeline.run` calls them; each gets what it uses, never the :class:`BuildSpec`."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from qola.compile.layout import BuildLayout, gen_module_dir
from qola.core import inputs
from qola.core.errors import QolaError
from qola.pipeline.prepare import Resolved
from qola.pipeline.report import BuildReport, Reporter
from qola.store import fastpath

if TYPE_CHECKING:
    from qola.compile.extras import ModuleExtra
    from qola.compile.feature import Record
    from qola.compile.rebuild import Recipe, Run
    from qola.compile.results import CompileReport, ModuleResult
    from qola.pipeline.record import BuildRecord
    from qola.plan.model import Plan
    from qola.store.key import BuildKey, Material
    from qola.store.prebuilt import Packaged
    from qola.toolchain import Toolchain


def install_prebuilt(
    source: str, layout: BuildLayout, key: BuildKey, namespace: str, ui: Reporter
) -> BuildReport | None:
    """``--prebuilt``: the archive of ``key`` installed as a new version of OUT (None: there is none;
    the build goes on). OUT already holding that key is up to date."""
    from qola.output.publish import MANIFEST_JSON  # lazy: start-up of the CLI and of the no-op path
    from qola.store import prebuilt  # lazy: start-up of the CLI and of the no-op path
    from qola.store.key import recorded_key  # lazy: start-up of the CLI and of the no-op path

    try:  # prepare() completed any half-switched publish; this build holds OUT's lock
        held = recorded_key(json.loads(inputs.read_record(layout.out / MANIFEST_JSON)))
    except (OSError, ValueError, AttributeError):
        held = None
    if held == key.key:
        ui.note(f"{layout.out} already holds build key {key.key[:16]}…")
        return BuildReport(layout, key=key.key)
    try:
        installed = prebuilt.install(source, namespace, key.key, layout.out, layout.root)
    except prebuilt.Missing as exc:
        ui.note(f"no prebuilt archive for build key {key.key[:16]}… ({exc}): building")
        return None
    return BuildReport(layout, manifest_json=layout.out / MANIFEST_JSON, key=key.key, prebuilt=installed)


def store(publish_to: str | None, layout: BuildLayout, compiled: CompileReport) -> Packaged | None:
    """``--publish DIR``: the finished output packaged into DIR (only a build where every module built)."""
    if not publish_to or not compiled.ok:
        return None
    from qola.store import prebuilt  # lazy: start-up of the CLI and of the no-op path

    return prebuilt.package(layout.out, Path(publish_to))


@dataclass(frozen=True)
class Published:
    """What stage 11 did: OUT/manifest.json of the new version (None: nothing published) and the
    line that says what a failed module left in OUT."""

    manifest_json: Path | None
    note: str | None = None
    logs: Path | None = None  # nothing published: where the failed modules' logs are (in the build dir)

    def report(self, layout: BuildLayout, compiled: CompileReport, key: str, packaged: Packaged | None) -> BuildReport:
        """The build's report with this publish's outcome."""
        return BuildReport(
            layout, compiled, self.manifest_json, key=key, packaged=packaged, note=self.note, logs=self.logs
        )


def _failed_logs(compiled: CompileReport, layout: BuildLayout) -> Path:
    """The failed modules' logs written into ``BUILD/logs`` (nothing is published: OUT/logs holds the
    previous version's); private, as published logs are."""
    from qola.core.fsutil import atomic_write  # lazy: start-up of the CLI and of the no-op path

    where = layout.root / "logs"
    where.mkdir(parents=True, exist_ok=True)
    for r in compiled.modules:
        if not r.built:
            atomic_write(where / f"{r.name}.log", ("\n".join(r.log) + "\n").encode(), mode=0o600)
    return where


def publish_out(
    compiled: CompileReport,
    layout: BuildLayout,
    extras: Mapping[str, ModuleExtra],
    key: BuildKey,
    settings: BuildRecord,
    keep_going: bool = False,
) -> Published:
    """Stage 11: what ``compiled`` built (its plan, its toolchain) as a new version of OUT;
    ``settings``: manifest.json's ``build``. A failed module never takes a good library out of OUT:
    without ``keep_going`` a build with any failed module publishes nothing (OUT keeps its version
    whole); with it, the modules that built are published and a failed one keeps the library the
    previous version holds (:func:`_kept`), else it is absent. What goes in besides the libraries
    is every feature's publish items (:data:`qola.pipeline.features.FEATURES`, in order)."""
    from qola.compile.feature import PublishContext, published  # lazy: start-up of the CLI and of the no-op path
    from qola.output.publish import Contents, publish  # lazy: start-up of the CLI and of the no-op path
    from qola.pipeline import features  # lazy: start-up of the CLI and of the no-op path

    failed = [r.name for r in compiled.modules if not r.built]
    if failed and not keep_going:
        had = (layout.out / "manifest.json").is_file()
        return Published(
            None,
            f"nothing published: {', '.join(failed)} failed; {layout.out} "
            + ("keeps its previous version whole" if had else "was not written")
            + " (--keep-going publishes the modules that built)",
            _failed_logs(compiled, layout),
        )
    plan_, tc = compiled.plan, compiled.toolchain
    kept = _kept(layout.out, compiled, failed)
    shown = (
        compiled
        if not kept
        else dataclasses.replace(
            compiled, modules=tuple(kept[r.name][0] if r.name in kept else r for r in compiled.modules)
        )
    )
    items = published(features.FEATURES, PublishContext(compiled, shown, extras, layout))
    withdrawn = items.withdrawn
    old_headers = [layout.out / "include" / h for h in withdrawn if kept and (layout.out / "include" / h).is_file()]
    records = {**items.records, **{name: {"kept": rec} for name, (_, rec) in kept.items()}}
    contents = Contents(
        headers=[*items.headers, *old_headers],
        withdrawn=[h for h in withdrawn if layout.out / "include" / h not in old_headers],
        mode=plan_.mode,
        texts=items.texts,
        trees=items.trees,
        module_extra=records,
        source_date_epoch=settings.env.get("SOURCE_DATE_EPOCH"),
        extra={
            "build_key": key.key,
            "build_key_parts": key.digests,
            "build": settings.to_json(),
            "pin": plan_.pin,
            "version_check": None if tc.version_check is None else tc.version_check.to_json(),
        },
    )
    return Published(publish(shown, layout.out, contents), _kept_note(failed, sorted(kept)))


def _kept_note(failed: Sequence[str], kept: Sequence[str]) -> str | None:
    """--keep-going's line: which failed modules kept the previous version's library, which are absent."""
    if not failed:
        return None
    absent = [name for name in failed if name not in kept]
    parts = [f"kept the previous version: {', '.join(kept)}"] if kept else []
    parts += [f"absent: {', '.join(absent)}"] if absent else []
    return "--keep-going: failed module(s) " + "; ".join(parts)


def _kept(out: Path, compiled: CompileReport, failed: Sequence[str]) -> dict[str, tuple[ModuleResult, Record]]:
    """The failed modules whose library OUT's current version holds, unaltered (its recorded sha256):
    {name: (a built result whose artifact is that library, what manifest.json says of it)}."""
    from qola.compile.results import Status  # lazy: start-up of the CLI and of the no-op path
    from qola.core.fsutil import inside  # lazy: start-up of the CLI and of the no-op path

    if not failed:
        return {}
    try:
        data = json.loads(inputs.read_record(out / "manifest.json"))
        old = {m["name"]: m for m in data.get("modules") or [] if isinstance(m, dict) and m.get("status") == "built"}
    except (OSError, ValueError, AttributeError, KeyError, TypeError):
        return {}
    kept: dict[str, tuple[ModuleResult, Record]] = {}
    for r in compiled.modules:
        rec = old.get(r.name)
        if r.name not in failed or rec is None or not isinstance(rec.get("artifact"), str):
            continue
        try:
            lib = inside(out, rec["artifact"])
            digest = inputs.sha256_checked(lib, limit=1 << 40, what="library")[0]
        except (OSError, ValueError, QolaError):
            continue
        if digest != rec.get("sha256") or lib.name != Path(rec["artifact"]).name:
            continue
        note = f"this build failed ({r.error or 'failed'}); the previous version's library is kept"
        result = dataclasses.replace(
            r, status=Status.BUILT, artifact=lib, exports=tuple(rec.get("exports") or ()), warnings=(*r.warnings, note)
        )
        kept[r.name] = (result, {"build_key": data.get("build_key"), "error": r.error or "failed"})
    return kept


@dataclass(frozen=True)
class Derived:
    """What a successful build was derived from, for :func:`remember`: the command line, the
    manifest and ``--usage`` files as it named them, stage 1's resolution, the plan, the toolchain,
    each module's extra, the build key's material."""

    argv: Sequence[str]
    manifest_path: str
    usage_files: Sequence[str]
    resolved: Resolved
    plan: Plan
    toolchain: Toolchain
    extras: Mapping[str, ModuleExtra]
    material: Material | None = None


def remember(d: Derived, recipe: Recipe | None = None, run: Run | None = None) -> None:
    """Record what this (successful) build was derived from, for the next no-op, and (``recipe``,
    ``run``) what the incremental path needs. The manifest and tree paths as the command line (or manifest)
    named them: symlinks re-pointed to another manifest or tree are noticed."""
    from qola.compile import overlay, rebuild  # lazy: start-up of the CLI and of the no-op path

    r, plan_, tc = d.resolved, d.plan, d.toolchain
    layout = r.settings.layout
    assert layout is not None  # a build's settings have one
    tree = r.prepared.tree
    tree_files, texts = r.table
    tools = [tc.compiler, tc.host_cxx, r.settings.launcher]
    gen = [m.name for m in plan_.modules if m.generators]
    written = _written(d, layout, gen)
    rebuild.save(layout.root, recipe)
    if recipe is not None:
        written.append(str(layout.root / rebuild.RECIPE))
    embedded = [str(Path(plan_.meta_dir) / "hsa" / a / t) for m in plan_.modules for a in plan_.archs for t in m.embed]
    graph_inputs = fastpath.GraphInputs(
        manifest=r.prepared.manifest.path,
        tree_files=tree_files,
        dirs=_dirs(plan_, tree.hsa),
        generator_scripts=[g.script for m in plan_.modules for g in m.generators],
        tools=tools,
        data=[*_data(d), *overlay.origins(plan_)],  # the tree files qola's fixes stage: ninja sees the copies
        data_dirs=[str(tree.root / "aiter" / "configs"), *embedded],
        listed_dirs=[str(layout.blob(name)) for name in gen],
        written=written,
    )
    files = fastpath.input_files(graph_inputs)
    env_keys = fastpath.env_keys_of(texts, {m.name for m in plan_.modules})
    given = [d.manifest_path, r.tree_given]
    resolved = [os.path.abspath(p) for p in [*given, *(t for t in tools if t)]]
    recorded = fastpath.Recorded(
        list(d.argv),
        r.inputs,
        env_keys,
        files,
        resolved,
        rebuild=run,
        key=d.material,
        gen_env=_generator_env([layout.blob(name) for name in gen], env_keys),
    )
    fastpath.record(layout.root, layout.out, recorded)


def _generator_env(blobs: list[Path], env_keys: list[str]) -> dict[str, str | None]:
    """The variables the generators looked up when they last ran (those qola sets for them and
    those the record names anyway left out), each by the fingerprint of the value they read: the
    no-op record digests them (a change to one is no no-op)."""
    from qola.compile.codegen import recorded_variables  # lazy: start-up of the CLI and of the no-op path

    found: dict[str, str | None] = {}
    for blob in blobs:
        found.update(recorded_variables(blob))
    return {k: v for k, v in sorted(found.items()) if k not in env_keys}


def _dirs(plan_: Plan, hsa: Path) -> list[str]:
    """The directories whose listings the build read: its sources', its include dirs, the tree's hsa/."""
    dirs = {str(Path(src).parent) for m in plan_.modules for src in m.sources}
    dirs |= {d for m in plan_.modules for d in m.include_dirs}
    if any(m.embed for m in plan_.modules):
        dirs.add(str(hsa))
    return sorted(dirs)


def _data(d: Derived) -> list[str]:
    """The data files generators and the plan read: the tuned-config CSVs (merged configs' sources,
    files named in generators' commands), the API read from the tree, the usage fragments."""
    plan_ = d.plan
    data = [f for m in plan_.modules for c in m.configs for f in (*c.sources, c.untuned) if f]
    data += [
        a for m in plan_.modules for g in m.generators for a in g.argv[1:] if os.path.isabs(a) and os.path.isfile(a)
    ]
    data += [f for m in plan_.modules if m.api is not None for f in m.api.reads]  # the API read from the tree
    manifest = d.resolved.prepared.manifest
    usage = manifest.usage  # the usage fragments ([usage] files, --usage): their variants are the set
    return data + [str(manifest.base_dir / f) for f in (usage.files if usage else [])] + list(d.usage_files)


def _written(d: Derived, layout: BuildLayout, gen: list[str]) -> list[str]:
    """What stages 6-8 wrote and read back: the generated dirs (their stamps), the graph's own files
    (build.ninja, the toolchain stamp, the shared headers, every hook's file)."""
    from qola.compile import codegen  # lazy: start-up of the CLI and of the no-op path
    from qola.compile.feature import shared_of  # lazy: start-up of the CLI and of the no-op path
    from qola.pipeline import features  # lazy: start-up of the CLI and of the no-op path

    return [
        str(layout.graph),
        str(layout.toolchain_stamp),
        *(str(w.path) for w in shared_of(features.FEATURES, d.plan, layout)),
        *(str(w.path) for e in d.extras.values() for w in e.writes),
        *(str(gen_module_dir(layout.gen_root, name) / codegen.STAMP) for name in gen),
    ]
