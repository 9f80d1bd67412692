"""``[jit]`` in ``qola build``: generated instances outside ``[jit.aot]`` are deferred to the on-demand JIT.

Two steps, called by :mod:`qola.commands.build`:

* :func:`plan_jit` (before the build): which modules the JIT applies to and, per module, the
  instance file stems ``[jit.aot]`` selects — the variant tables are resolved exactly as the
  top-level ones (:mod:`qola.variants`) and each generator lists what its AOT filter would write.
  The generators themselves still run with the top-level filter only (or none): every instance
  and the dispatch file that calls them all.
* :func:`hooks` (during the build): after codegen, per module, the generated files that are not
  AOT instances and not the dispatch (``*_api``) are deferred: their JIT copies, header bundle and
  ``index.json`` go to ``BUILD/jit-out/<md_name>/`` (:func:`qola.jit.layout.write_jit_module`),
  their stubs are compiled into the library like instances, and the runtime + table are compiled
  as host C++17 (hidden visibility) and linked with ``-ldl``. :func:`publish_items` then tells
  :func:`qola.publish.publish` to copy ``BUILD/jit-out/<md_name>`` to ``OUT/jit/<md_name>`` and
  what manifest.json records per module.

The library finds its units in ``<libdir>/../jit/<md_name>`` (``OUT/lib`` → ``OUT/jit``).
"""

from __future__ import annotations

import hashlib
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qola import ninja, variants
from qola.build import BuildReport, ModuleResult, fail, module_flags
from qola.codegen import generated_sources
from qola.errors import QolaError
from qola.manifest import Manifest
from qola.plan import ModulePlan, Plan
from qola.toolchain import Toolchain

OUT_DIR = "jit-out"  # BUILD/jit-out/<md_name>: what publish copies to OUT/jit/<md_name>
STUB_BATCH = 64
_SPECIALISATION = re.compile(rb"template\s*<\s*>")
# flags that name paths of the build machine: include dirs are bundled instead, the host compiler is the user's
_PATH_PAIRS = ("-I", "-isystem", "-iquote", "-idirafter", "-include", "-ccbin", "--compiler-bindir")


@dataclass(frozen=True)
class JitPlan:
    aot: Mapping[str, frozenset[str]]  # module -> instance stems built ahead (every module the JIT applies to)
    declared: frozenset[str]  # modules [jit.aot] names at least one variant for
    styles: Mapping[str, str]  # module -> stub style
    compiler: str | None = None  # [jit] compiler; None = the build's


def _aot_manifest(manifest: Manifest) -> Manifest:
    aot = manifest.jit.aot  # type: ignore[union-attr]
    return manifest.model_copy(update={"variants": aot.variants, "mha_fwd_variants": aot.mha_fwd_variants,
                                       "mha_bwd_variants": aot.mha_bwd_variants})  # fmt: skip


def plan_jit(plan: Plan, manifest: Manifest, env: Mapping[str, str]) -> JitPlan | None:
    """None without ``[jit]`` (or ``enabled = false``). ``plan`` is the plan *before*
    :func:`qola.variants.apply` (its generators unwrapped). Raises QolaError for a ``[jit]``
    naming a module outside the plan or a variant that matches nothing."""
    jit = manifest.jit
    if jit is None or not jit.enabled:
        return None
    names = [m.name for m in plan.modules]
    for name in jit.modules or []:
        if name not in names:
            raise QolaError(f"jit.modules: module {name!r} is not built by this manifest",
                            hint=f"modules in the plan: {', '.join(names) or 'none'}")
    mods = [m for m in plan.modules if m.generators and (jit.modules is None or m.name in jit.modules)]
    aot: dict[str, set[str]] = {m.name: set() for m in mods}
    declared: set[str] = set()
    if jit.aot.variants or jit.aot.mha_fwd_variants or jit.aot.mha_bwd_variants:
        try:
            res = variants.resolve(plan, _aot_manifest(manifest), env)
        except QolaError as exc:
            raise QolaError(f"jit.aot.{exc.message}", hint=exc.hint, where=manifest.path or None) from None
        for mod, i, sels in res.generators():
            if mod.name not in aot:
                raise QolaError(f"jit.aot: module {mod.name} has variants built ahead but the JIT does not apply "
                                "to it", hint="add it to [jit] modules or drop its [jit.aot] tables")
            filt = variants.join_filter(sels, sels[0].flavor)
            aot[mod.name] |= {s for s in variants.list_blobs(mod.generators[i], env, filt) if not variants.is_api(s)}
            declared.add(mod.name)
    styles = {m.name: _style(m) for m in mods}
    return JitPlan({k: frozenset(v) for k, v in aot.items()}, frozenset(declared), styles, jit.compiler)


def _style(mod: ModulePlan) -> str:
    """The stub style (what a stub returns when the JIT cannot give it its function)."""
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


@dataclass
class JitRecord:
    md_name: str
    jit_dir: Path  # BUILD/jit-out/<md_name>
    aot: tuple[str, ...]
    deferred: tuple[str, ...]
    style: str
    compiler: str

    def to_json(self) -> dict[str, Any]:
        return {"dir": f"jit/{self.md_name}", "style": self.style, "compiler": self.compiler,
                "aot": summary(self.aot), "deferred": summary(self.deferred)}  # fmt: skip


@dataclass
class JitHooks:
    """``extra`` / ``rules`` for :func:`qola.isolation.hooks` (``inner=``); ``records`` fill as it runs."""

    extra: Any
    rules: dict[str, dict[str, str]]
    records: dict[str, JitRecord] = field(default_factory=dict)


def _specialises(path: str) -> bool:
    try:
        return _SPECIALISATION.search(Path(path).read_bytes()) is not None
    except OSError:
        return False


def hooks(jp: JitPlan, plan: Plan, tc: Toolchain, build_dir: Path, env: Mapping[str, str]) -> JitHooks:
    """Hooks that defer every generated non-AOT instance of the modules in ``jp``.
    ``env`` is the environment the build runs children under (for the compiler's identity)."""
    from qola.jit import key as jkey  # noqa: PLC0415
    from qola.jit import layout  # noqa: PLC0415

    include_dir = build_dir / "include"
    compilers: dict[str, jkey.JitCompiler] = {}
    cxx = ninja.command_template([tc.host_cxx, "-std=c++17", "-O2", "-fPIC", "-fvisibility=hidden",
                                  "-fvisibility-inlines-hidden", "$flags", "-MD", "-MF", "$out.d", "-c", "$in",
                                  "-o", "$out"])  # fmt: skip
    rules = {"jit_cxx": {"command": cxx, "description": "CC $module $in", "depfile": "$out.d", "deps": "gcc"}}
    hk = JitHooks(None, rules)

    def compiler() -> jkey.JitCompiler:
        if "cc" not in compilers:
            compilers["cc"] = jkey.probe_compiler(jp.compiler or tc.compiler, {**env, **tc.child_env})
        return compilers["cc"]

    def extra(mod: ModulePlan, r: ModuleResult) -> dict:
        if mod.name not in jp.aot:
            return {}
        blob = build_dir / "gen" / mod.name / "blob"
        files = generated_sources(blob)
        aot_set = jp.aot[mod.name]
        instances = [f for f in files if not Path(f).stem.endswith("_api")]
        deferred = [f for f in instances if Path(f).stem not in aot_set and _specialises(f)]
        aot = tuple(sorted(Path(f).stem for f in instances if f not in deferred))
        if mod.name in jp.declared and not aot_set & {Path(f).stem for f in instances}:
            return _fail(r, f"[jit.aot] selects no instance that module {mod.name}'s generators write",
                         "check the [jit.aot] tables against the top-level variants / receipt")
        if not deferred:
            return {}
        try:
            per_source = {tuple(shlex.split(" ".join(mod.flags_for(f)))) for f in deferred}
            if len(per_source) > 1:
                raise QolaError(f"module {mod.name}: its deferred instances take different per-source flags",
                                hint="build those instances ahead ([jit.aot]) or give them the same flags")
            flags = portable_flags(module_flags(mod, tc, blob, include_dir))
            spec = layout.JitModuleSpec(
                module=mod.md_name, lang=tc.kind, arch=";".join(plan.archs), compiler=compiler(),
                flags=(*layout.shared_object_flags(tc.kind, plan.archs), *flags, *next(iter(per_source))),
                include_dirs=(*map(Path, mod.include_dirs), blob, include_dir), style=jp.styles[mod.name])
            out = layout.write_jit_module(spec, [(Path(f).stem, Path(f)) for f in deferred],
                                          out_jit=build_dir / OUT_DIR, stub_dir=build_dir / "jit" / mod.md_name,
                                          batch=STUB_BATCH)  # fmt: skip
        except QolaError as exc:
            return _fail(r, exc.message, exc.hint)
        incs = [f"-I{include_dir}", f"-I{out.include_dir}"]  # qola_config.h + qola_common.h, qola_jit.h
        edges, objs = [], []
        for src in (out.table_source, *out.runtime_sources):
            obj = ninja.object_path(mod.name, str(src))
            edges.append(("jit_cxx", obj, (str(src),), {"module": mod.name, "flags": ninja.escape_flags(incs)}))
            objs.append(obj)
        hk.records[mod.name] = JitRecord(mod.md_name, out.jit_dir, aot, tuple(sorted(Path(f).stem for f in deferred)),
                                         spec.style, spec.compiler.path)  # fmt: skip
        return {"drop_sources": deferred, "add_sources": [str(p) for p in out.stub_sources],
                "cflags": [f"-I{out.include_dir}"], "edges": edges, "extra_inputs": objs, "ldflags": ["-ldl"],
                "localize_hidden": True}  # fmt: skip

    hk.extra = extra
    return hk


def _fail(r: ModuleResult, message: str, hint: str | None) -> dict:
    fail(r, QolaError(message, hint=hint))
    return {}


def publish_items(hk: JitHooks | None, report: BuildReport) -> tuple[dict[str, Path | None], dict[str, dict]]:
    """(trees, per-module records) for :func:`qola.publish.publish`: ``jit/<md_name>`` of every built
    module with deferred units comes from the build dir; every other module's is removed from OUT."""
    trees: dict[str, Path | None] = {}
    records: dict[str, dict] = {}
    for r in report.modules:
        rec = hk.records.get(r.name) if hk else None
        if r.status == "built" and rec is not None:
            trees[f"jit/{r.md_name}"] = rec.jit_dir
            records[r.name] = {"jit": rec.to_json()}
        else:
            trees[f"jit/{r.md_name}"] = None
    return trees, records
