"""The end of a build: stage 11 (:func:`publish_out`, a new version of OUT), stage 12
(:func:`remember`, the record the next no-op and incremental build read; :func:`store`, the output
packaged with ``--publish``) and the ``--prebuilt`` path's install (:func:`install_prebuilt`).
:mod:`qola.pipeline.run` calls them; each gets what it uses, never the :class:`BuildSpec`."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qola.compile.layout import BuildLayout
from qola.core import inputs
from qola.pipeline.report import BuildReport, Reporter
from qola.pipeline.spec import Resolved
from qola.store import fastpath

if TYPE_CHECKING:
    from qola.compile.extras import ModuleExtra
    from qola.compile.rebuild import Recipe, Run
    from qola.compile.steps import CompileReport
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
    plan_: Plan,
    tc: Toolchain,
    layout: BuildLayout,
    extras: Mapping[str, ModuleExtra],
    key: BuildKey,
    settings: Mapping[str, Any],
) -> Path:
    from qola.hooks import isolation  # lazy: start-up of the CLI and of the no-op path
    from qola.hooks import jit as jitbuild  # lazy: start-up of the CLI and of the no-op path
    from qola.output.publish import Contents, publish  # lazy: start-up of the CLI and of the no-op path

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


def remember(
    argv: Sequence[str],
    manifest_path: str,
    usage_files: Sequence[str],
    r: Resolved,
    plan_: Plan,
    tc: Toolchain,
    extras: Mapping[str, ModuleExtra],
    recipe: Recipe | None,
    run: Run | None,
    *,
    material: Material | None = None,
) -> None:
    """Record what this (successful) build was derived from, for the next no-op, and (``recipe``,
    ``run``) what the incremental path needs. The manifest and tree paths as the command line (or manifest)
    named them: symlinks re-pointed to another manifest or tree are noticed."""
    from qola.compile import (
        codegen,  # lazy: start-up of the CLI and of the no-op path
        rebuild,  # lazy: start-up of the CLI and of the no-op path
    )
    from qola.compile.layout import gen_module_dir  # lazy: start-up of the CLI and of the no-op path
    from qola.hooks import isolation  # lazy: start-up of the CLI and of the no-op path

    prepared, s = r.prepared, r.settings
    tree = prepared.tree
    given = [manifest_path, r.tree_given]
    tree_files, texts = r.table
    dirs = {str(Path(src).parent) for m in plan_.modules for src in m.sources}
    dirs |= {d for m in plan_.modules for d in m.include_dirs}
    if any(m.embed for m in plan_.modules):
        dirs.add(str(tree.hsa))
    scripts = [g.script for m in plan_.modules for g in m.generators]
    # the tuned-config CSVs generators read: merged configs' sources, files named in their commands,
    # and the tree's configs dir (a new per-model CSV joins a merge)
    data = [f for m in plan_.modules for c in m.configs for f in (*c.sources, c.untuned) if f]
    data += [
        a for m in plan_.modules for g in m.generators for a in g.argv[1:] if os.path.isabs(a) and os.path.isfile(a)
    ]
    data += [f for m in plan_.modules if m.api is not None for f in m.api.reads]  # the API read from the tree
    usage = prepared.manifest.usage  # the usage fragments ([usage] files, --usage): their variants are the set
    data += [str(prepared.manifest.base_dir / f) for f in (usage.files if usage else [])] + list(usage_files)
    tools = [tc.compiler, tc.host_cxx, s.launcher]
    layout = s.layout
    assert layout is not None  # a build's settings have one
    # what stages 6-8 wrote and read back: the generated dirs (listings and stamps), the graph's own
    # files, the embedded code objects (their bytes decide the embed index)
    gen = [m.name for m in plan_.modules if m.generators]
    written = [
        str(layout.graph),
        str(layout.toolchain_stamp),
        *(str(w.path) for w in isolation.shared_files(plan_, layout)),
        *(str(w.path) for e in extras.values() for w in e.writes),
        *(str(gen_module_dir(layout.gen_root, name) / codegen.STAMP) for name in gen),
    ]
    embedded = [str(Path(plan_.meta_dir) / "hsa" / a / t) for m in plan_.modules for a in plan_.archs for t in m.embed]
    rebuild.save(layout.root, recipe)
    if recipe is not None:
        written.append(str(layout.root / rebuild.RECIPE))
    graph_inputs = fastpath.GraphInputs(
        manifest=prepared.manifest.path,
        tree_files=tree_files,
        dirs=sorted(dirs),
        generator_scripts=scripts,
        tools=tools,
        data=data,
        data_dirs=[str(tree.root / "aiter" / "configs"), *embedded],
        listed_dirs=[str(layout.blob(name)) for name in gen],
        written=written,
    )
    files = fastpath.input_files(graph_inputs)
    resolved = [os.path.abspath(p) for p in [*given, *(t for t in tools if t)]]
    recorded = fastpath.Recorded(
        list(argv),
        r.inputs,
        fastpath.env_keys_of(texts),
        files,
        resolved,
        rebuild=None if run is None else run.to_json(),
        key=None if material is None else material.to_json(),
    )
    fastpath.record(layout.root, layout.out, recorded)
