"""Build hooks for torch-free libraries: version scripts, static archives, embedded code objects,
the post-link ELF audit, and the headers and consumer files that go to OUT.

:func:`extra` returns a module's :class:`~qola.compile.extras.ModuleExtra` (computed from the module's
final source list; the files it needs are in its ``writes``); :data:`RULES` are the ninja rules
those name; :func:`shared_files` are the files every module's compiles and links read.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from qola import __version__
from qola.compile import ninja
from qola.compile.elf import MAX_SHOWN, audit_artifact, demangle
from qola.compile.extras import FileWrite, ModuleExtra
from qola.compile.feature import ExtraContext, Feature, ModuleHook, PublishContext, PublishItems
from qola.compile.layout import BuildLayout, object_path
from qola.compile.link import Archiving, archive_steps, library_ldflags, python_module_ldflags, version_script
from qola.compile.pathmap import PathMap
from qola.compile.results import CompileReport, ModuleResult, Status
from qola.compile.unresolved import unresolved
from qola.core import inputs
from qola.core.errors import BuildFailed, QolaError
from qola.hooks import embed
from qola.output import kernels
from qola.output.consumers import ConsumerModule, common_header_text, consumer_files, render_config_header
from qola.plan import itfs
from qola.plan.model import ModulePlan, Plan
from qola.toolchain import Toolchain

if TYPE_CHECKING:
    from qola.compile.steps import ModuleSources

# no depfile: the edge names the .S's every .incbin file as an implicit input (qola wrote the .S)
ASM_RULE = {"command": "cc -c -x assembler $in -o $out", "description": "AS $module $out"}
ARCHIVE_RULE = {"command": "rm -f $out && $archive_cmd", "description": "AR $module $out"}
RULES = {"asm": ASM_RULE, "archive": ARCHIVE_RULE}


def isolated(mod: ModulePlan) -> bool:
    """cpp_itfs libraries carry the isolation contract; Python modules export PyInit_* only."""
    return mod.mode == "cpp_itfs" and not mod.is_python_module


def shared_files(plan: Plan, layout: BuildLayout) -> tuple[FileWrite, ...]:
    """qola_config.h (namespace baked in) and qola_common.h, which the compiles include, and the
    namespace's version script, which isolated links read."""
    inc, ns = layout.include, plan.namespace
    return (
        FileWrite(inc / "qola_config.h", render_config_header(ns, __version__)),
        FileWrite(inc / "qola_common.h", common_header_text()),
        FileWrite(layout.version_script(ns), version_script(ns)),
    )


def headers(plan: Plan, layout: BuildLayout) -> list[Path]:
    """The paths of qola_config.h and qola_common.h (published into OUT/include)."""
    return [w.path for w in shared_files(plan, layout)[:2]]


@dataclass(frozen=True)
class Linking:
    """How a library is linked: ``isolate`` (the isolation contract, :func:`isolated`) and
    ``discard_locals`` (:attr:`qola.toolchain.Toolchain.discard_locals`: a static archive drops its
    local symbols)."""

    isolate: bool = True
    discard_locals: bool = False


def extra(
    mod: ModulePlan,
    sources: Sequence[str],
    inner: ModuleExtra,
    plan: Plan,
    layout: BuildLayout,
    *,
    how: Linking = Linking(),
) -> ModuleExtra:
    """What isolation and embedding add to ``mod``, whose ``sources`` (table and generated) are
    compiled as ``inner`` (the JIT's extra) changes them; its static archive holds ``inner``'s
    objects too, and ``inner.localize_hidden`` makes the archive's hidden symbols local."""
    own = _embedded(mod, plan, layout).then(_api(mod, plan, layout))
    if mod.link == "static" and not mod.is_python_module:
        compiled = (*inner.sources(sources), *own.add_sources)
        paths = PathMap.of(plan.tree_root, layout.root)
        objs = [layout.root / o for o in _objects(mod, compiled, (*own.extra_inputs, *inner.extra_inputs), paths)]
        return own.then(_archive(mod, objs, layout, plan.namespace, localize_hidden=inner.localize_hidden, how=how))
    isolate = how.isolate
    if isolate and isolated(mod):
        vscript = layout.version_script(plan.namespace)
        link = ModuleExtra(ldflags=tuple(library_ldflags(vscript, f"{mod.md_name}.so")), implicit=(str(vscript),))
    elif isolate and mod.is_python_module:  # a Python module needs nothing but its init function
        pyscript = layout.python_version_script(mod.md_name)
        text = f"{{\n  global:\n    PyInit_{mod.md_name};\n  local:\n    *;\n}};\n"
        link = ModuleExtra(
            ldflags=tuple(python_module_ldflags(pyscript)),
            implicit=(str(pyscript),),
            writes=(FileWrite(pyscript, text),),
        )
    else:
        link = ModuleExtra()
    return own.then(link)


def _embedded(mod: ModulePlan, plan: Plan, layout: BuildLayout) -> ModuleExtra:
    """``mod``'s embedded code objects (``embed = [...]``): their assembly's edge and object, the
    header's include dir, the files, the linker flags that keep them."""
    if not mod.embed:
        return ModuleExtra()
    ns = plan.namespace
    warnings, files, texts, incbins = _embed(mod, plan, layout)
    obj = layout.embed_object(mod.name)
    return ModuleExtra(
        cflags=(f"-I{files.header.parent}", embed.aiter_define(mod.name)),
        ldflags=tuple(embed.keep_ldflags(ns, mod.name)),  # in the library even where no code looks them up
        edges=(ninja.Edge("asm", obj, (str(files.asm),), (("module", mod.name),), implicit=incbins),),
        extra_inputs=(obj,),
        writes=tuple(FileWrite(p, t) for p, t in texts),
        warnings=warnings,
    )


def _api(mod: ModulePlan, plan: Plan, layout: BuildLayout) -> ModuleExtra:
    """A cpp_itfs module's public header and the wrapper compiled into it (its API, when it has one)."""
    if mod.api is None or mod.mode != "cpp_itfs":
        return ModuleExtra()
    ns, api_dir = plan.namespace, layout.itfs_dir(mod.name)
    wrapper = api_dir / itfs.wrapper_name(mod.name)
    return ModuleExtra(
        cflags=(f"-I{api_dir}",),
        writes=(
            FileWrite(api_dir / mod.api.public_header, itfs.render_header(mod.api, ns, mod.name, mod.api.header)),
            FileWrite(wrapper, itfs.render_wrapper(mod.api, ns, mod.name)),
        ),
        add_sources=(str(wrapper),),
        host_only=(str(wrapper),),  # it forwards host calls: no device pass has anything to compile
    )


def _archive(
    mod: ModulePlan, objs: list[Path], layout: BuildLayout, ns: str, *, localize_hidden: bool, how: Linking
) -> ModuleExtra:
    """A static library's link: the archive steps over ``objs``, made local as the isolation
    contract says (``localize_hidden``: the JIT runtime's hidden symbols too)."""
    isolate = how.isolate and isolated(mod)
    steps, rsp, text = archive_steps(
        objs,
        layout.artifact(mod.artifact_name),
        ns,
        layout.archive_work(mod.name),
        how=Archiving(isolate=isolate, localize_hidden=localize_hidden and isolate, discard_locals=how.discard_locals),
    )
    return ModuleExtra(
        rule="archive",
        variables=(("archive_cmd", ninja.command_variable(steps)),),
        writes=(FileWrite(rsp, text),),
    )


def _check_tables(mod: ModulePlan, blob_dir: Path, keys: list[str], archs: tuple[str, ...]) -> None:
    """Every code object the module's generated v3 tables (``asm_<type>_configs.hpp``) name for a
    target arch is embedded, else the module fails: its entry point would find the kernel in its
    table and not its code object (:func:`qola.output.kernels.unembedded`)."""
    for table in sorted(blob_dir.glob("asm_*_configs.hpp")) if blob_dir.is_dir() else []:
        missing = kernels.unembedded(
            kernels.config_rows(
                inputs.read_checked(table, limit=inputs.MAX_SOURCE, what="generated table").decode("utf-8", "replace")
            ),
            keys,
            mod.embed,
            archs,
        )
        if missing:
            shown = ", ".join(missing[:8]) + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
            raise QolaError(
                f"module {mod.name}: {table.name} names code objects that are not embedded: {shown}",
                hint="the tree's hsa/<arch>/ lacks them, or embed = [...] leaves their kernel type out",
            )


def _embed(
    mod: ModulePlan, plan: Plan, layout: BuildLayout
) -> tuple[tuple[str, ...], embed.EmbedFiles, list[tuple[Path, str]], tuple[str, ...]]:
    """(warnings, the module's embed files, their texts, the code objects the .S includes). An arch the tree has no ``hsa/<arch>/``
    for (AITER ships no assembly kernels for it, and skips their generators) contributes nothing,
    with a warning; with no arch left the module embeds an empty set (its header and lookup still
    exist)."""
    hsa, archs, ns = Path(plan.meta_dir) / "hsa", plan.archs, plan.namespace
    present = [a for a in archs if (hsa / a).is_dir()]
    warnings = tuple(
        f"module {mod.name}: {hsa / arch} does not exist: nothing of {', '.join(mod.embed)} embedded for {arch}"
        for arch in archs
        if arch not in present
    )
    embed.check_names(ns, mod.name)
    blobs = embed.collect(hsa, present, list(mod.embed)) if present else []
    _check_tables(mod, layout.blob(mod.name), [b.key for b in blobs], archs)
    sources = embed.render(blobs, ns, mod.name)
    files, texts = embed.texts(sources, layout.embed_dir(mod.name))
    return warnings, files, texts, sources.inputs


def _objects(mod: ModulePlan, compiled: Sequence[str], inputs: Sequence[str], paths: PathMap) -> list[str]:
    """Every object of the module's link: its compiled sources' and the extra inputs."""
    objs = [object_path(mod.name, s, paths) for s in compiled]
    return objs + [o for o in dict.fromkeys(inputs) if o not in objs]


def audit(report: CompileReport, plan: Plan, only: Collection[str] | None = None) -> CompileReport:
    """``report`` with every built library audited (``only``: of these modules; the others keep
    their exports): each gets its exports; a leak fails its module (and keeps it out of OUT)."""
    mods = {m.name: m for m in plan.modules}
    audited = {
        r.name: _audited(r, mods[r.name], plan.namespace, report.toolchain.lib_dirs)
        for r in report.modules
        if r.status == Status.BUILT and r.artifact is not None and (only is None or r.name in only)
    }
    return report.with_modules(audited)


def _audited(r: ModuleResult, mod: ModulePlan, namespace: str, lib_dirs: Sequence[str]) -> ModuleResult:
    """``r`` (a built library) with its exports, or failed by what its audit found."""
    assert r.artifact is not None
    extra = (f"PyInit_{mod.md_name}",) if mod.is_python_module else ()
    try:
        result = audit_artifact(r.artifact, namespace, extra=extra, check=isolated(mod) or mod.is_python_module)
        off = kernels.switch_problems(r.artifact, mod.name) if mod.gates else []
        if off:
            raise BuildFailed("\n".join(off), hint="a library that cannot compute is not published")
        if not mod.is_python_module and r.artifact.suffix != ".a":
            _check_resolved(r.artifact, lib_dirs)
    except QolaError as exc:
        return r.failed(exc)
    return dataclasses.replace(r, exports=tuple(sorted(s.name for s in result.exports)))


def _check_resolved(artifact: Path, lib_dirs: Sequence[str]) -> None:
    """The library's undefined symbols are all defined by what it loads (:mod:`qola.compile.unresolved`):
    a link taken over by another tool (ck-jit's post-build) may have dropped ``--no-undefined``."""
    missing = unresolved(artifact, lib_dirs)
    if missing:
        names = demangle(missing[: MAX_SHOWN + 1])
        shown = names[:MAX_SHOWN] + ([f"… and {len(missing) - MAX_SHOWN} more"] if len(missing) > MAX_SHOWN else [])
        raise BuildFailed(
            f"{artifact}: {len(missing)} symbol(s) it calls are defined by nothing it loads:\n"
            + "\n".join(f"  {n}" for n in shown),
            hint="a library that cannot reach its code is not published; when a tool took the link over "
            "(ck-jit's post-build), check that its dispatch rewrite and stubs match this tree",
        )


def module_headers(report: CompileReport, plan: Plan, layout: BuildLayout) -> tuple[list[Path], list[str]]:
    """(the API and embed headers of the modules that built, the names of the failed modules' headers):
    a failed module publishes nothing, and its headers from an earlier build leave OUT/include."""
    status = {r.name: r.status for r in report.modules}
    built: list[Path] = []
    failed: list[Path] = []
    for mod in plan.modules:
        own = [Path(h) for h in mod.headers]
        if mod.api is not None and mod.mode == "cpp_itfs":
            own.append(layout.itfs_dir(mod.name) / mod.api.public_header)
        if mod.embed:
            own.append(embed.files_in(layout.embed_dir(mod.name), mod.name).header)
        (built if status.get(mod.name) == Status.BUILT else failed).extend(own)
    keep = {h.name for h in built}
    return built, sorted({h.name for h in failed} - keep)


def consumers(report: CompileReport, plan: Plan, tc: Toolchain) -> dict[str, str | None]:
    """{OUT-relative path: text} of the consumer files (CMake, pkg-config) naming the libraries that
    built; None removes the file (no library built)."""
    mods = {m.name: m for m in plan.modules}
    entries = [
        ConsumerModule(
            r.name,
            r.artifact.name,
            "static" if r.artifact.suffix == ".a" else "shared",
            tuple(tc.runtime_link_libs()),
            tuple(tc.lib_dirs),
        )
        for r in report.modules
        if r.status == Status.BUILT and r.artifact is not None and not mods[r.name].is_python_module
    ]
    if entries:
        return dict(consumer_files(plan.namespace, entries, __version__))
    if any(r.status != Status.BUILT and not mods[r.name].is_python_module for r in report.modules):
        # every library failed: the consumer files of an earlier build would name them
        return {rel: None for rel in consumer_files(plan.namespace, [], __version__) if not rel.startswith("include/")}
    return {}


def hook(ctx: ExtraContext) -> ModuleHook:
    """Stage 7's part for one build: :func:`extra` of each module, whose sources are compiled as the
    features before it (the JIT) changed them."""
    stage = ctx.stage
    how = Linking(isolate=ctx.isolate, discard_locals=stage.tc.discard_locals)

    def one(mod: ModulePlan, sources: ModuleSources, so_far: ModuleExtra) -> ModuleExtra:
        return extra(mod, sources.all, so_far, stage.plan, stage.layout, how=how)

    return one


def _audit(report: CompileReport, only: Collection[str] | None) -> CompileReport:
    return audit(report, report.plan, only)


def published(ctx: PublishContext) -> PublishItems:
    """Stage 11's part: the shared headers, the API and embed headers of the modules that built (and
    the names of the failed ones'), the consumer files."""
    plan, layout = ctx.compiled.plan, ctx.layout
    built, withdrawn = module_headers(ctx.compiled, plan, layout)
    return PublishItems(
        headers=(*headers(plan, layout), *built),
        withdrawn=tuple(withdrawn),
        texts=consumers(ctx.shown, plan, ctx.compiled.toolchain),
    )


# isolation and embedding across stages (qola.compile.feature): the extra, its rules and shared files,
# the ELF audit (with the kernels' switch check), the headers and consumer files published
FEATURE = Feature("isolation", extra=hook, rules=lambda tc: RULES, shared=shared_files, audit=_audit, publish=published)
