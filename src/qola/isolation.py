"""Build hooks for torch-free libraries: version scripts, static archives, embedded code objects,
the post-link ELF audit, and the headers and consumer files that go to OUT.

``hooks(...)`` returns the ``extra`` / ``extra_rules`` pair :func:`qola.build.run_build` takes.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from qola import __version__, embed
from qola.audit import audit_artifact
from qola.build import BuildReport, ModuleResult, fail
from qola.consumers import ConsumerModule, common_header_text, consumer_files, render_config_header
from qola.errors import QolaError
from qola.fsutil import inside
from qola.link import static_archive_steps, version_script, write_if_changed
from qola.plan import ModulePlan, Plan
from qola.toolchain import Toolchain

ASM_RULE = {"command": "cc -c -x assembler $in -o $out -Wa,--MD,$out.d", "depfile": "$out.d", "deps": "gcc",
            "description": "AS $module $out"}
ARCHIVE_RULE = {"command": "rm -f $out && $archive_cmd", "description": "AR $module $out"}


def isolated(mod: ModulePlan) -> bool:
    """cpp_itfs libraries carry the isolation contract; Python modules export PyInit_* only."""
    return mod.mode == "cpp_itfs" and not mod.is_python_module


@dataclass(frozen=True)
class Hooks:
    extra: Callable[[ModulePlan, ModuleResult], dict]
    rules: dict[str, dict[str, str]]


def hooks(plan: Plan, tc: Toolchain, build_dir: Path, *, isolate: bool = True,
          inner: Hooks | None = None) -> Hooks:
    """``inner`` (the JIT's, :mod:`qola.jitbuild`) runs first; its sources and objects go into the
    static archive too, and its ``localize_hidden`` makes the archive's hidden symbols local."""
    ns = plan.namespace
    vscript = write_if_changed(build_dir / "link" / f"{ns}.version", version_script(ns))
    hsa = Path(plan.meta_dir) / "hsa"

    def extra(mod: ModulePlan, r: ModuleResult) -> dict:
        more: dict = {"cflags": [], "ldflags": [], "extra_inputs": [], "implicit": [], "edges": []}
        if inner is not None:
            for k, v in inner.extra(mod, r).items():
                more[k] = list(more.get(k, [])) + list(v) if isinstance(v, (list, tuple)) else v
        if mod.embed:
            try:
                files = _embed(mod, r, hsa, plan.archs, build_dir, ns)
            except QolaError as exc:
                fail(r, exc)
                return {}
            obj = f"obj/{mod.name}/qola_embedded_{mod.name}.o"
            more["edges"].append(("asm", obj, (str(files.asm),), {"module": mod.name}))
            more["extra_inputs"].append(obj)
            more["cflags"] += [f"-I{files.header.parent}", embed.aiter_define(mod.name)]
        try:  # names from the table never leave the build dir (checked at plan time too)
            archive, work = inside(build_dir, "lib", f"{mod.md_name}.a"), inside(build_dir, "link", mod.name)
            pyversion = inside(build_dir, "link", f"{mod.md_name}.pyversion")
        except QolaError as exc:
            fail(r, exc)
            return {}
        if mod.link == "static" and not mod.is_python_module:
            objs = [Path(build_dir) / ninja_obj for ninja_obj in _objects(mod, r, more)]
            steps = static_archive_steps(objs, archive, ns, work, isolate=isolate and isolated(mod))
            if more.get("localize_hidden") and isolate and isolated(mod):
                steps = [s[:1] + ["--localize-hidden"] + s[1:] if s[0].endswith("objcopy") else s for s in steps]
            more["rule"] = "archive"
            more["variables"] = {"archive_cmd": " && ".join(shlex.join(s) for s in steps)}
        elif isolate and isolated(mod):
            more["ldflags"] += [f"-Wl,--version-script={vscript}", f"-Wl,-soname,{mod.md_name}.so"]
            more["implicit"].append(str(vscript))
        elif isolate and mod.is_python_module:  # a Python module needs nothing but its init function
            pyscript = write_if_changed(pyversion,
                                        f"{{\n  global:\n    PyInit_{mod.md_name};\n  local:\n    *;\n}};\n")
            more["ldflags"].append(f"-Wl,--version-script={pyscript}")
            more["implicit"].append(str(pyscript))
        return more

    return Hooks(extra, {"asm": ASM_RULE, "archive": ARCHIVE_RULE, **(inner.rules if inner else {})})


def _embed(mod: ModulePlan, r: ModuleResult, hsa: Path, archs: tuple[str, ...], build_dir: Path,
           ns: str) -> embed.EmbedFiles:
    """The module's embed files. An arch the tree has no ``hsa/<arch>/`` for (AITER ships no assembly
    kernels for it, and skips their generators) contributes nothing, with a warning; with no arch
    left the module embeds an empty set (its header and lookup still exist)."""
    present = [a for a in archs if (hsa / a).is_dir()]
    for arch in archs:
        if arch not in present:
            msg = (f"module {mod.name}: {hsa / arch} does not exist: nothing of {', '.join(mod.embed)} "
                   f"embedded for {arch}")
            r.warnings.append(msg)
            r.log.append(f"warning: {msg}")
    out = build_dir / "embed" / mod.name
    if present:
        return embed.embed(hsa, present, list(mod.embed), out, ns, mod.name)
    return embed.write(embed.render([], ns, mod.name), out)


def _objects(mod: ModulePlan, r: ModuleResult, more: dict) -> list[str]:
    """Every object of the module's link: its sources' (less dropped, plus added ones) and extra inputs."""
    from qola import ninja  # noqa: PLC0415

    gen = Path(r.artifact).parent.parent / "gen" / mod.name / "blob" if r.artifact else None
    srcs = list(mod.sources) + (sorted(str(p) for p in gen.rglob("*") if p.suffix in (".cu", ".cpp")) if gen else [])
    drop = set(more.get("drop_sources", ()))
    srcs = [s for s in srcs if s not in drop] + list(more.get("add_sources", ()))
    objs = [ninja.object_path(mod.name, s) for s in srcs]
    if mod.embed:
        objs.append(f"obj/{mod.name}/qola_embedded_{mod.name}.o")
    return objs + [o for o in more.get("extra_inputs", ()) if o not in objs]


def audit(report: BuildReport, plan: Plan) -> None:
    """Audit every built library; a leak fails its module (and keeps it out of OUT)."""
    mods = {m.name: m for m in plan.modules}
    for r in report.modules:
        if r.status != "built" or r.artifact is None:
            continue
        mod = mods[r.name]
        extra = (f"PyInit_{mod.md_name}",) if mod.is_python_module else ()
        try:
            result = audit_artifact(r.artifact, plan.namespace, extra=extra,
                                    check=isolated(mod) or mod.is_python_module)
        except QolaError as exc:
            fail(r, exc)
            continue
        r.exports = sorted(s.name for s in result.exports)


def headers(plan: Plan, build_dir: Path) -> list[Path]:
    """qola_common.h and qola_config.h (namespace baked in), written now: the compiles include them."""
    inc = build_dir / "include"
    return [write_if_changed(inc / "qola_config.h", render_config_header(plan.namespace, __version__)),
            write_if_changed(inc / "qola_common.h", common_header_text())]


def module_headers(report: BuildReport, plan: Plan, build_dir: Path) -> tuple[list[Path], list[str]]:
    """(the API and embed headers of the modules that built, the names of the failed modules' headers):
    a failed module publishes nothing, and its headers from an earlier build leave OUT/include."""
    status = {r.name: r.status for r in report.modules}
    built: list[Path] = []
    failed: list[Path] = []
    for mod in plan.modules:
        own = [Path(h) for h in mod.headers]
        if mod.embed:
            own.append(build_dir / "embed" / mod.name / f"qola_embedded_{mod.name}.h")
        (built if status.get(mod.name) == "built" else failed).extend(own)
    keep = {h.name for h in built}
    return built, sorted({h.name for h in failed} - keep)


def consumers(report: BuildReport, plan: Plan, tc: Toolchain) -> dict[str, str | None]:
    """{OUT-relative path: text} of the consumer files (CMake, pkg-config) naming the libraries that
    built; None removes the file (no library built)."""
    mods = {m.name: m for m in plan.modules}
    entries = [
        ConsumerModule(r.name, r.artifact.name, "static" if r.artifact.suffix == ".a" else "shared",
                       tuple(tc.runtime_link_libs()), tuple(tc.lib_dirs))
        for r in report.modules
        if r.status == "built" and r.artifact is not None and not mods[r.name].is_python_module
    ]
    if entries:
        return consumer_files(plan.namespace, entries, __version__)
    if any(r.status != "built" and not mods[r.name].is_python_module for r in report.modules):
        # every library failed: the consumer files of an earlier build would name them
        return {rel: None for rel in consumer_files(plan.namespace, [], __version__) if not rel.startswith("include/")}
    return {}
