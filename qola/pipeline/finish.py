"""The end of a build: stage 11 (:func:`publish_out`, a new version of OUT), stage 12
(:func:`remember`, the record the next no-op and incremental build read; :func:`store`, the output
packaged with ``--publish``) and the ``--prebuilt`` path's install (:func:`install_prebuilt`).
:mod:`qola.pipeline.run` calls them; each gets what it uses, never the :class:`BuildSpec`."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qola.compile.layout import BuildLayout, gen_module_dir
from qola.core import inputs
from qola.pipeline.report import BuildReport, Reporter
from qola.pipeline.spec import Resolved
from qola.store import fastpath

if TYPE_CHECKING:
    from qola.compile.extras import ModuleExtra
    from qola.compile.rebuild import Recipe, Run
    from qola.compile.results import CompileReport
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


def publish_out(
    compiled: CompileReport,
    layout: BuildLayout,
    extras: Mapping[str, ModuleExtra],
    key: BuildKey,
    settings: Mapping[str, Any],
) -> Path:
    """Stage 11: what ``compiled`` built (its plan, its toolchain) as a new version of OUT;
    ``settings``: manifest.json's ``build``."""
    from qola.hooks import isolation  # lazy: start-up of the CLI and of the no-op path
    from qola.hooks import jit as jitbuild  # lazy: start-up of the CLI and of the no-op path
    from qola.output.publish import Contents, publish  # lazy: start-up of the CLI and of the no-op path

    plan_, tc = compiled.plan, compiled.toolchain
    trees, records = jitbuild.publish_items(compiled, extras, layout)
    built_headers, withdrawn = isolation.module_headers(compiled, plan_, layout)
    contents = Contents(
        headers=[*isolation.headers(plan_, layout), *built_headers],
        withdrawn=withdrawn,
        mode=plan_.mode,
        texts=isolation.consumers(compiled, plan_, tc),
        trees=trees,
        module_extra=records,
        source_date_epoch=(settings.get("env") or {}).get("SOURCE_DATE_EPOCH"),
        extra={
            "build_key": key.key,
            "build_key_parts": key.digests,
            "build": settings,
            "pin": plan_.pin,
            "version_check": tc.version_check,
        },
    )
    return publish(compiled, layout.out, contents)


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
    from qola.compile import rebuild  # lazy: start-up of the CLI and of the no-op path

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
        data=_data(d),
        data_dirs=[str(tree.root / "aiter" / "configs"), *embedded],
        listed_dirs=[str(layout.blob(name)) for name in gen],
        written=written,
    )
    files = fastpath.input_files(graph_inputs)
    given = [d.manifest_path, r.tree_given]
    resolved = [os.path.abspath(p) for p in [*given, *(t for t in tools if t)]]
    recorded = fastpath.Recorded(
        list(d.argv),
        r.inputs,
        fastpath.env_keys_of(texts),
        files,
        resolved,
        rebuild=None if run is None else run.to_json(),
        key=None if d.material is None else d.material.to_json(),
    )
    fastpath.record(layout.root, layout.out, recorded)


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
    from qola.hooks import isolation  # lazy: start-up of the CLI and of the no-op path

    return [
        str(layout.graph),
        str(layout.toolchain_stamp),
        *(str(w.path) for w in isolation.shared_files(d.plan, layout)),
        *(str(w.path) for e in d.extras.values() for w in e.writes),
        *(str(gen_module_dir(layout.gen_root, name) / codegen.STAMP) for name in gen),
    ]
