"""``[jit]`` in ``qola build``: generated instances outside ``[jit.aot]`` are deferred to the on-demand JIT.

Two steps, called by :mod:`qola.pipeline.run`:

* :func:`plan_jit` (planning): which modules the JIT applies to and, per module, the instance file
  stems ``[jit.aot]`` selects — the variant tables are resolved exactly as the top-level ones
  (:mod:`qola.plan.variants`) and each generator lists what its AOT filter would write. The result is
  each module's :class:`qola.plan.model.JitSplit` in the Plan. The generators themselves still run
  with the top-level filter only (or none): every instance and the dispatch file that calls them all.
* :func:`extra` (after codegen, per module, given its generated files): the generated files that
  are not AOT instances and not the dispatch (``*_api``) are deferred: their JIT copies, header
  bundle and ``index.json`` (a tree for ``BUILD/jit-out/<md_name>/``, :func:`qola.jit.layout.render_jit_module`),
  their stubs compiled into the library like instances, and the runtime + table compiled as host
  C++17 (hidden visibility) and linked with ``-ldl``. It computes; the pipeline writes.
  With ``record_ahead`` (``[usage] record_ahead``), each instance built ahead that specialises a
  function is compiled as its recorded copy (:func:`qola.jit.stubs.record_ahead`, in
  ``BUILD/jit/<md_name>/ahead/``) and the runtime + table are linked even when nothing is deferred.
  :func:`publish_items` then tells :func:`qola.output.publish.publish` to copy ``BUILD/jit-out/<md_name>``
  to ``OUT/jit/<md_name>`` and what manifest.json records per module.

The library finds its units in ``<libdir>/../jit/<md_name>`` (``OUT/lib`` → ``OUT/jit``).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import re
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qola.compile import ninja
from qola.compile.extras import FileWrite, ModuleExtra, TreeWrite
from qola.compile.feature import ExtraContext, Feature, ModuleHook, PublishContext, PublishItems, Record
from qola.compile.layout import BuildLayout, object_path
from qola.compile.pathmap import PathMap
from qola.compile.results import Status
from qola.compile.steps import Stage, module_flags
from qola.core import inputs
from qola.core.errors import QolaError
from qola.jit import key as jkey
from qola.jit import layout as jlayout
from qola.plan.model import JitSplit, ModulePlan, Plan
from qola.toolchain import Toolchain

if TYPE_CHECKING:
    from qola.compile.steps import ModuleSources
    from qola.plan.manifest import Manifest
    from qola.plan.variants import GenEnv
    from qola.toolchain.env import ToolchainEnv

STUB_BATCH = 64
# an explicit specialisation of a function (what jit.stubs stubs), not of a class: AITER's asm v3
# dispatch files specialise structs (``template<> struct FmhaFwdV3Name<…>``) and are no instance
_SPECIALISATION = re.compile(rb"template\s*<\s*>\s*(?!(?:struct|class|union)\b)[A-Za-z_]")
# flags that name paths of the build machine: include dirs are bundled instead, the host compiler is the user's
_PATH_PAIRS = ("-I", "-isystem", "-iquote", "-idirafter", "-include", "-ccbin", "--compiler-bindir")


def _aot_manifest(manifest: Manifest) -> Manifest:
    aot = manifest.jit.aot  # type: ignore[union-attr]
    return manifest.model_copy(update={"variants": aot.variants, "mha_fwd_variants": aot.mha_fwd_variants,
                                       "mha_bwd_variants": aot.mha_bwd_variants})  # fmt: skip


def switched(manifest: Manifest, jit: bool | None) -> Manifest:
    """``manifest`` as ``qola build --jit on|off`` asks (None: as it is). ``on``: its ``[jit]`` enabled,
    or, without one, an empty ``[jit]`` (every generated instance of every module with generators
    deferred; dispatch files and the tree's own sources stay ahead); ``off``: ``[jit] enabled = false``.
    The switch is then part of the manifest the build key hashes, as when the file says it."""
    from qola.plan.manifest import JitSection  # lazy: the incremental path publishes without the planner

    if jit is None or (manifest.jit is None and not jit):
        return manifest
    section = manifest.jit or JitSection()
    return manifest.model_copy(update={"jit": section.model_copy(update={"enabled": jit})})


def plan_jit(plan: Plan, manifest: Manifest, env: GenEnv) -> Plan:
    """The plan with each module the JIT applies to carrying its :class:`JitSplit`, and with
    ``[usage] record_ahead`` every module with generators marked ``record_ahead``; the plan as it
    is otherwise (no ``[jit]``, or ``enabled = false``). Generator filters of the plan do not matter
    (listings use each generator's own command). Raises QolaError for a ``[jit]`` naming a module
    outside the plan or a variant that matches nothing."""
    if manifest.usage is not None and manifest.usage.record_ahead:
        plan = dataclasses.replace(
            plan, modules=tuple(dataclasses.replace(m, record_ahead=bool(m.generators)) for m in plan.modules)
        )
    jit = manifest.jit
    if jit is None or not jit.enabled:
        return plan
    from qola.plan import variants  # lazy: the incremental path publishes without the planner

    names = [m.name for m in plan.modules]
    for name in jit.modules or []:
        if name not in names:
            raise QolaError(
                f"jit.modules: module {name!r} is not built by this manifest",
                hint=f"modules in the plan: {', '.join(names) or 'none'}",
            )
    mods = [m for m in plan.modules if m.generators and (jit.modules is None or m.name in jit.modules)]
    aot: dict[str, set[str]] = {m.name: set() for m in mods}
    declared: set[str] = set()
    if jit.aot.variants or jit.aot.mha_fwd_variants or jit.aot.mha_bwd_variants:
        try:
            res = variants.resolve(plan, _aot_manifest(manifest), env, receipt_alone=False)
        except QolaError as exc:
            raise QolaError(f"jit.aot.{exc.message}", hint=exc.hint, where=manifest.path or None) from None
        for mod, i, sels in res.generators():
            if mod.name not in aot:
                raise QolaError(
                    f"jit.aot: module {mod.name} has variants built ahead but the JIT does not apply to it",
                    hint="add it to [jit] modules or drop its [jit.aot] tables",
                )
            filt = res.filter(mod, i, sels)
            genv = variants.GeneratorEnv.of(env).for_plan(plan)  # the generation's environment (issue 41)
            aot[mod.name] |= {s for s in variants.list_blobs(mod.generators[i], genv, filt) if not variants.is_api(s)}
            declared.add(mod.name)
    splits = {m.name: JitSplit(tuple(sorted(aot[m.name])), m.name in declared, _style(m), jit.compiler) for m in mods}
    return dataclasses.replace(
        plan, modules=tuple(dataclasses.replace(m, jit=splits.get(m.name, m.jit)) for m in plan.modules)
    )


def _style(mod: ModulePlan) -> str:
    """The stub style (what a stub returns when the JIT cannot give it its function)."""
    from qola.plan import variants  # lazy: the incremental path publishes without the planner (pydantic)

    if any(variants.flavor_of(g) == "ck" for g in mod.generators):
        return "ck_fmha"
    if any((Path(g.script).parent / "attn_fwd_kernel.h").is_file() for g in mod.generators):
        return "example_attn"  # examples/kernels/csrc/attn: attn_fwd_<T> returns ATTN_FWD_*
    return "generic"


def portable_flags(flags: Sequence[str]) -> list[str]:
    """``flags`` less those naming build-machine paths (include dirs, host compiler)."""
    out: list[str] = []
    skip = False
    for f in flags:
        if skip:
            skip = False
        elif f in _PATH_PAIRS:
            skip = True
        elif not f.startswith(("-I", "-isystem", "-iquote", "-idirafter", "-ccbin=", "--compiler-bindir=")):
            out.append(f)
    return out


def summary(names: Sequence[str]) -> dict[str, Any]:
    names = sorted(names)
    return {"count": len(names), "sha256": hashlib.sha256("\n".join(names).encode()).hexdigest(), "names": names}


@dataclass(frozen=True)
class JitRecord:
    md_name: str
    jit_dir: Path  # BUILD/jit-out/<md_name>
    aot: tuple[str, ...]
    deferred: tuple[str, ...]
    style: str
    compiler: str

    def to_json(self) -> dict[str, Any]:
        return {"dir": BuildLayout.jit_rel(self.md_name), "style": self.style, "compiler": self.compiler,
                "aot": summary(self.aot), "deferred": summary(self.deferred)}  # fmt: skip


def _specialises(path: str) -> bool:
    try:
        return _SPECIALISATION.search(inputs.read_checked(path, limit=inputs.MAX_SOURCE, what="source")) is not None
    except (OSError, QolaError):
        return False


def rules(tc: Toolchain) -> dict[str, dict[str, str]]:
    """The ninja rule of the JIT runtime and table: host C++17, hidden visibility."""
    cxx = ninja.command_template([tc.host_cxx, "-std=c++17", "-O2", "-fPIC", "-fvisibility=hidden",
                                  "-fvisibility-inlines-hidden", "$flags", "-MD", "-c", "$in", "-o", "$out"])  # fmt: skip
    return {"jit_cxx": {"command": cxx, "description": "CC $module $in", "depfile": ninja.DEPFILE, "deps": "gcc"}}


def split(mod: ModulePlan, generated: Sequence[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(stems built ahead, deferred files) of ``mod``'s generated files under its JIT split."""
    from qola.plan import variants  # lazy: the incremental path publishes without the planner (pydantic)

    assert mod.jit is not None
    ahead = set(mod.jit.ahead)
    instances = [f for f in generated if not variants.is_api(Path(f).stem)]
    deferred = tuple(f for f in instances if Path(f).stem not in ahead and _specialises(f))
    gone = set(deferred)
    return tuple(sorted(Path(f).stem for f in instances if f not in gone)), deferred


def extra(
    mod: ModulePlan,
    generated: Sequence[str],
    stage: Stage,
    compiler: Callable[[], jkey.JitCompiler],
    build_key: str = "",
) -> ModuleExtra:
    """What deferring ``mod``'s non-AOT instances and recording its ahead ones (``record_ahead``) add
    to it (nothing when none is deferred or recorded).
    ``generated``: the module's generated files; ``compiler``: the JIT compiler's identity (probed
    on first need); ``build_key``: the output's, for usage records (docs/usage.md)."""
    if mod.jit is None and not mod.record_ahead:
        return ModuleExtra()
    aot, deferred = _deferred(mod, generated)
    recorded = _recorded(generated, deferred) if mod.record_ahead else ()
    if not deferred and not recorded:
        return ModuleExtra()
    spec = _spec(mod, stage, deferred, compiler, build_key)
    layout = stage.layout
    files = jlayout.render_jit_module(
        spec,
        [(Path(f).stem, Path(f)) for f in deferred],
        out_jit=layout.jit_out,
        stub_dir=layout.jit_stubs(mod.md_name),
        batch=STUB_BATCH,
        ahead=jlayout.Ahead([(Path(f).stem, Path(f)) for f in recorded], layout.jit_ahead(mod.md_name)),
    )
    out = files.output
    edges = _runtime_edges(mod.name, out, layout.include, PathMap.of(stage.plan.tree_root, layout.root))
    record = None
    if deferred:
        deferred_names = tuple(sorted(Path(f).stem for f in deferred))
        record = JitRecord(mod.md_name, out.jit_dir, aot, deferred_names, spec.style, spec.compiler.path)
    # a copy's quoted includes resolve from its original's dir, as the original's did
    originals = tuple((str(copy), (_quote_dir(stage.tc.kind, orig.parent),)) for orig, copy in out.ahead)
    as_given = {Path(f): f for f in recorded}
    return ModuleExtra(
        drop_sources=(*deferred, *(as_given[orig] for orig, _ in out.ahead)),
        add_sources=(*(str(p) for p in out.stub_sources), *(str(copy) for _, copy in out.ahead)),
        cflags=(f"-I{out.include_dir}",),
        source_flags=originals,
        edges=edges,
        extra_inputs=tuple(e.out for e in edges),
        ldflags=("-ldl",),
        localize_hidden=True,
        writes=tuple(FileWrite(p, t) for p, t in files.sources),
        trees=(TreeWrite(out.jit_dir, files.tree),) if deferred else (),
        jit=record,
    )


def _deferred(mod: ModulePlan, generated: Sequence[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(stems built ahead, deferred files) of ``mod`` (nothing deferred without ``[jit]``:
    ``record_ahead`` alone builds every instance ahead). Refused: a ``[jit.aot]`` that selects none
    of the generated instances."""
    if mod.jit is None:
        return (), ()
    aot, deferred = split(mod, generated)
    if mod.jit.declared and not set(mod.jit.ahead) & {Path(f).stem for f in generated}:
        raise QolaError(
            f"[jit.aot] selects no instance that module {mod.name}'s generators write",
            hint="check the [jit.aot] tables against the top-level variants / receipt",
        )
    return aot, deferred


def _spec(
    mod: ModulePlan, stage: Stage, deferred: Sequence[str], compiler: Callable[[], jkey.JitCompiler], build_key: str
) -> jlayout.JitModuleSpec:
    """The JIT module of ``mod``: its deferred instances' compiler and flags (one set: instances
    with different per-source flags are refused); a table of recorded units only when none is deferred."""
    per_source = {tuple(shlex.split(" ".join(mod.flags_for(f)))) for f in deferred}
    if len(per_source) > 1:
        raise QolaError(
            f"module {mod.name}: its deferred instances take different per-source flags",
            hint="build those instances ahead ([jit.aot]) or give them the same flags",
        )
    plan, tc, layout = stage.plan, stage.tc, stage.layout
    blob, include_dir = layout.blob(mod.name), layout.include
    if deferred:
        flags = portable_flags(module_flags(mod, tc, blob, include_dir))
        jit_flags = (*jlayout.shared_object_flags(tc.kind, plan.archs), *flags, *next(iter(per_source)))
        jc = compiler()
    else:  # nothing deferred: the table only names the recorded units (no compiler is ever run)
        jit_flags, jc = (), jkey.JitCompiler(tc.compiler, "", "")
    return jlayout.JitModuleSpec(
        module=mod.md_name,
        lang=tc.kind,
        arch=";".join(plan.archs),
        compiler=jc,
        flags=jit_flags,
        include_dirs=(*map(Path, mod.include_dirs), blob, include_dir),
        style=mod.jit.style if mod.jit is not None else _style(mod),
        manifest_name=mod.name,
        build_key=build_key,
    )


def _runtime_edges(
    module: str, out: jlayout.JitModuleOutput, include_dir: Path, paths: PathMap
) -> tuple[ninja.Edge, ...]:
    """The host C++ edges of the JIT's table and runtime (linked into the module)."""
    incs = [f"-I{include_dir}", f"-I{out.include_dir}"]  # qola_config.h + qola_common.h, qola_jit.h
    bound = (("module", module), ("flags", ninja.escape_flags(incs)))
    return tuple(
        ninja.Edge("jit_cxx", object_path(module, str(src), paths), (str(src),), bound)
        for src in (out.table_source, *out.runtime_sources)
    )


def _recorded(generated: Sequence[str], deferred: Sequence[str]) -> tuple[str, ...]:
    """The generated instances built ahead whose recorded copies are compiled instead ([usage]
    record_ahead): those that specialise a function (a dispatch, a class specialisation: as they are)."""
    from qola.plan import variants  # lazy: the incremental path publishes without the planner (pydantic)

    gone = set(deferred)
    return tuple(f for f in generated if f not in gone and not variants.is_api(Path(f).stem) and _specialises(f))


def _quote_dir(kind: str, path: Path) -> str:
    """The flag that adds ``path`` to the quoted-include search (nvcc has no -iquote: -I there)."""
    return f"-I{path}" if kind == "cuda" else f"-iquote{path}"


def compiler_of(plan: Plan, tc: Toolchain, env: ToolchainEnv) -> Callable[[], jkey.JitCompiler]:
    """The JIT compiler's identity, probed once on first call (``[jit] compiler``, else the build's);
    ``env``: the toolchain's view (PATH, the probe's timeout, the environment children run under)."""
    name = next((m.jit.compiler for m in plan.modules if m.jit is not None and m.jit.compiler), None)
    return functools.cache(lambda: jkey.probe_compiler(name or tc.compiler, env.with_child(tc.child_env)))


def publish_items(ctx: PublishContext) -> PublishItems:
    """Stage 11's part, for :func:`qola.output.publish.publish`: ``jit/<md_name>`` of every built
    module with deferred units comes from the build dir (its ``jit`` record into manifest.json);
    every other module's is removed from OUT."""
    trees: dict[str, Path | None] = {}
    records: dict[str, Record] = {}
    for r in ctx.compiled.modules:
        ex = ctx.extras.get(r.name)
        rec = ex.jit if ex is not None else None
        if r.status == Status.BUILT and rec is not None:
            trees[ctx.layout.jit_rel(r.md_name)] = rec.jit_dir
            records[r.name] = {"jit": rec.to_json()}
        else:
            trees[ctx.layout.jit_rel(r.md_name)] = None
    return PublishItems(trees=trees, records=records)


def hook(ctx: ExtraContext) -> ModuleHook:
    """Stage 7's part for one build: :func:`extra` of each module (the JIT compiler probed once, on
    first need)."""
    compiler = compiler_of(ctx.stage.plan, ctx.stage.tc, ctx.env)

    def one(mod: ModulePlan, sources: ModuleSources, so_far: ModuleExtra) -> ModuleExtra:
        return extra(mod, sources.generated, ctx.stage, compiler, ctx.build_key)

    return one


# the JIT across stages (qola.compile.feature): its split in the plan, its extra, rules and publish items
FEATURE = Feature("jit", plan=plan_jit, extra=hook, rules=rules, publish=publish_items)
