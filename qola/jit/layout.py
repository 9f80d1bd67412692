"""Write OUT/jit/<module>/ and the sources the library needs for its deferred units.

The build calls :func:`render_jit_module` once per module with the deferred instance
files (and writes what it returns with the build's other files); :func:`write_jit_module`
renders and writes in one call. The files:

    OUT/jit/<module>/src/<unit><ext>     JIT copies (instance + extern "C" entries)
    OUT/jit/<module>/headers.tar.gz      header closure of all units (deterministic)
    OUT/jit/<module>/index.json          for tools: units, keys, flags, compiler, arch
    <stub_dir>/<unit><ext> (or batches)  stubs: compile into the library like instances
    <stub_dir>/qola_jit_table_<module>.cpp   the runtime's table: compile into the library

and returns their paths plus the runtime sources (:func:`runtime_sources`) that every
library with deferred units compiles once.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from qola.compile.includes import HeaderScanner
from qola.core import inputs
from qola.core.errors import QolaError
from qola.core.fsutil import replace_tree, write_if_changed
from qola.jit import cxx, schema, stubs, table
from qola.jit import format as fmt
from qola.jit import headers as hdr
from qola.jit import key as jkey
from qola.jit.cxx import CxxError
from qola.plan import registry


@dataclass(frozen=True)
class JitModuleSpec:
    module: str  # module name: OUT/jit/<module>, table symbol module_<ident>
    lang: str  # "hip" | "cuda" | "cxx"
    arch: str  # e.g. "gfx942" or "sm_90" (several: ";"-joined); part of the key
    compiler: jkey.JitCompiler  # the build's compiler (qola.jit.key.probe_compiler)
    flags: tuple[str, ...]  # full unit flags except bundled -I, -o and the source;
    #                         start from shared_object_flags(lang, archs)
    include_dirs: tuple[Path, ...] = ()  # bundled into headers.tar.gz, in search order
    style: str = "generic"  # stub style: "example_attn" | "ck_fmha" | "generic"
    jit_dir_rel: str = ""  # from the library's dir to OUT/jit/<module>; default ../jit/<module>
    manifest_name: str = ""  # the module's manifest name (usage records, coverage messages); default module
    build_key: str = ""  # the build key of the output (usage records); "" when unknown (dry run)


@dataclass(frozen=True)
class JitUnitRecord:
    name: str
    source_rel: str
    source_sha256: str
    entry_symbol: str
    n_funcs: int
    content_key: str
    key: str  # with the build's compiler


@dataclass(frozen=True)
class JitModuleOutput:
    module: str
    jit_dir: Path
    index: Path
    table_source: Path
    stub_sources: tuple[Path, ...]
    runtime_sources: tuple[Path, ...]
    include_dir: Path  # holds qola_jit.h; also needs qola_common.h + qola_config.h
    units: tuple[JitUnitRecord, ...]
    ahead: tuple[tuple[Path, Path], ...] = ()  # (instance file, its recorded copy): compile the copy instead


def runtime_dir() -> Path:
    return registry.runtime_dir() / "jit"


def runtime_sources() -> tuple[Path, ...]:
    """Compile these once into every library that has deferred units (C++17, -fPIC)."""
    d = runtime_dir()
    return tuple(d / f for f in ("qola_jit.cpp", "qola_jit_store.cpp", "qola_jit_sys.cpp", "qola_jit_files.cpp",
                                "qola_jit_sha256.cpp", "qola_jit_usage.cpp"))  # fmt: skip


def shared_object_flags(lang: str, archs: Sequence[str]) -> list[str]:
    """Flags that make a unit a self-contained, loadable shared object whose entries bind to
    its own code (-Bsymbolic) rather than to the library's stubs of the same name."""
    if lang == "hip":
        return ["-x", "hip", *(f"--offload-arch={a}" for a in archs), "-fPIC", "-shared",
                "-fvisibility=hidden", "-Wl,-Bsymbolic"]  # fmt: skip
    if lang == "cuda":
        gencode = [f"-gencode=arch=compute_{a[3:]},code={a}" for a in archs]
        return ["-x", "cu", *gencode, "-Xcompiler", "-fPIC,-fvisibility=hidden", "-shared", "-Xlinker", "-Bsymbolic"]
    if lang == "cxx":
        return ["-fPIC", "-shared", "-fvisibility=hidden", "-Wl,-Bsymbolic"]
    raise QolaError(f"unknown JIT language {lang!r}", hint="use hip, cuda or cxx")


@dataclass(frozen=True)
class JitModuleFiles:
    """What :func:`render_jit_module` computed: the files to write and where they will be."""

    output: JitModuleOutput
    tree: tuple[tuple[str, bytes], ...]  # OUT/jit/<module>/: (relative path, bytes), replaced as a whole
    sources: tuple[tuple[Path, str], ...]  # stubs and table (written only when changed)


def write_jit_module(spec: JitModuleSpec, units: Sequence[tuple[str, Path]], *, out_jit: Path,
                     stub_dir: Path, batch: int = 1) -> JitModuleOutput:  # fmt: skip
    """:func:`render_jit_module`, then its files written: ``out_jit/<module>`` replaced whole, the
    stubs and the table written only when they change (stable mtimes for ninja)."""
    files = render_jit_module(spec, units, out_jit=out_jit, stub_dir=stub_dir, batch=batch)
    replace_tree(files.output.jit_dir, files.tree)
    for path, text in files.sources:
        write_if_changed(path, text)
    return files.output


@dataclass(frozen=True)
class Ahead:
    """Units built ahead and recorded ([usage] record_ahead): (unit name, instance file), and the dir
    their recorded copies go to (default: the stub dir)."""

    units: Sequence[tuple[str, Path]] = ()
    dir: Path | None = None


def render_jit_module(spec: JitModuleSpec, units: Sequence[tuple[str, Path]], *, out_jit: Path,
                      stub_dir: Path, batch: int = 1, ahead: Ahead | None = None) -> JitModuleFiles:  # fmt: skip
    """OUT/jit/<module>/ for ``units`` = (unit name, instance file) and the stubs + table for
    ``stub_dir``, computed (the instance files and their headers are read; nothing is written).
    ``batch`` > 1 puts that many units' stubs in one source when the files allow it (they always
    do for CK fMHA and the example tree), else one stub per unit. ``ahead``: units built ahead and
    recorded: each file with a function specialisation gets its recorded copy in ``ahead.dir``
    (same file name) and a row of the table; the others are left as they are.
    With no ``units``, the tree is only ``index.json`` (nothing to publish: the runtime never reads
    OUT/jit for an ahead unit)."""
    ahead = ahead or Ahead()
    style = stubs.STYLES.get(spec.style)
    if style is None:
        raise QolaError(f"unknown stub style {spec.style!r}", hint=f"use one of {', '.join(stubs.STYLES)}")
    names = [u for u, _ in units]
    if len(set(names)) != len(names):
        raise QolaError(f"module {spec.module}: duplicate JIT unit names")
    include_dirs = [Path(os.path.abspath(d)) for d in spec.include_dirs]
    bundle, unit_headers, with_srcdir = _closures(units, include_dirs)
    flags = [*hdr.include_flags(len(include_dirs), with_srcdir), *spec.flags] if units else []
    tree: dict[str, bytes] = {}
    stubbed = [_stubbed(spec, style, unit, Path(path)) for unit, path in units]
    records = []
    for st, (unit, _) in zip(stubbed, units, strict=True):
        tree[st.source_rel] = data = st.stub.jit_text.encode()
        headers = jkey.headers_digest(unit_headers[unit].items())
        ckey = jkey.content_key(source=data, headers=headers, flags=flags, arch=spec.arch, lang=spec.lang)
        records.append(JitUnitRecord(unit, st.source_rel, jkey.sha256_hex(data), st.stub.entry_symbol,
                                     len(st.stub.specs), ckey, jkey.entry_key(ckey, spec.compiler.identity)))  # fmt: skip
    sources = _stub_sources(spec, style, stubbed, stub_dir, batch)
    stub_sources = tuple(path for path, _ in sources)
    heads = table.Headers()
    if bundle:
        tree[fmt.BUNDLE] = hdr.tar_gz_bytes(bundle.items())
        heads = table.Headers(fmt.BUNDLE, jkey.sha256_hex(tree[fmt.BUNDLE]), jkey.headers_digest(bundle.items()))
    tree[fmt.INDEX] = _index(spec, flags, (heads, len(bundle)), records, stubbed)
    copies, ahead_rows = [], []
    for unit, path in ahead.units:
        copy = _recorded_copy(spec.module, unit, Path(path), ahead.dir or stub_dir)
        if copy is not None:
            sources.append((copy[0], copy[1]))
            copies.append((Path(path), copy[0]))
            ahead_rows.append((unit, copy[2]))
    table_source = stub_dir / f"qola_jit_table_{stubs.module_ident(spec.module)}.cpp"
    sources.append((table_source, table.render_table(spec, records, flags, heads, ahead_rows)))
    final = out_jit / spec.module
    output = JitModuleOutput(
        module=spec.module, jit_dir=final, index=final / fmt.INDEX, table_source=table_source,
        stub_sources=stub_sources, runtime_sources=runtime_sources(), include_dir=runtime_dir(),
        units=tuple(records), ahead=tuple(copies),
    )  # fmt: skip
    return JitModuleFiles(output, tuple(sorted(tree.items())), tuple(sources))


def _closures(
    units: Sequence[tuple[str, Path]], include_dirs: list[Path]
) -> tuple[dict[str, bytes], dict[str, dict[str, bytes]], bool]:
    """(every unit's headers, each unit's headers, whether any lies in a unit's own dir)."""
    scanner = HeaderScanner(include_dirs)
    bundle: dict[str, bytes] = {}
    unit_headers: dict[str, dict[str, bytes]] = {}
    with_srcdir = False
    for unit, given in units:
        path = Path(os.path.abspath(given))
        files = {}
        for h in scanner.closure(path):
            rel = hdr.bundle_path(h, include_dirs, path.parent)
            files[rel] = scanner.read(h)
            with_srcdir |= rel.startswith(hdr.SRCDIR + "/")
        bundle.update(files)
        unit_headers[unit] = files
    return bundle, unit_headers, with_srcdir


@dataclass(frozen=True)
class _Stubbed:
    """One unit read and stubbed: its name, text, suffix, its JIT copy's path in OUT/jit and the stub."""

    unit: str
    text: str
    suffix: str
    source_rel: str
    stub: stubs.UnitStubs


def _stubbed(spec: JitModuleSpec, style: stubs.StubStyle, unit: str, path: Path) -> _Stubbed:
    text = inputs.read_checked(path, limit=inputs.MAX_SOURCE, what="JIT unit").decode()
    try:
        st = stubs.stub_unit(text, module=spec.module, unit=unit, style=style)
    except CxxError as exc:
        raise QolaError(f"cannot stub JIT unit {unit} ({path}): {exc}") from None
    return _Stubbed(unit, text, path.suffix, f"{fmt.SOURCES}/{unit}{path.suffix}", st)


def _stub_sources(
    spec: JitModuleSpec, style: stubs.StubStyle, stubbed: list[_Stubbed], stub_dir: Path, batch: int
) -> list[tuple[Path, str]]:
    """The stubs' sources: ``batch`` units in one where the files allow it, else one per unit."""
    ident = stubs.module_ident(spec.module)
    sources: list[tuple[Path, str]] = []
    for k in range(0, len(stubbed), max(1, batch)):
        group = stubbed[k : k + max(1, batch)]
        try:
            if len(group) == 1:
                raise CxxError("single")
            text = stubs.stub_batch([(g.unit, g.text) for g in group], module=spec.module, style=style)
            sources.append((stub_dir / f"qola_jit_stubs_{ident}_{k // batch}{group[0].suffix}", text))
        except CxxError:
            sources += [(stub_dir / f"{g.unit}{g.suffix}", g.stub.stub_text) for g in group]
    return sources


def _index(
    spec: JitModuleSpec,
    flags: list[str],
    headers: tuple[table.Headers, int],
    records: list[JitUnitRecord],
    stubbed: list[_Stubbed],
) -> bytes:
    """OUT/jit/<module>/index.json: for tools."""
    heads, count = headers
    index = {
        "format": fmt.INDEX_FORMAT, "version": fmt.INDEX_VERSION, "module": spec.module, "lang": spec.lang,
        "arch": spec.arch, "style": spec.style,
        "compiler": {"path": spec.compiler.path, "identity": spec.compiler.identity, "version": spec.compiler.version},
        "headers": {"bundle": heads.bundle, "sha256": heads.sha256, "digest": heads.digest, "files": count},
        "flags": flags,
        "units": [
            {"name": r.name, "source": r.source_rel, "source_sha256": r.source_sha256,
             "entry_symbol": r.entry_symbol, "functions": [f"{s.ret} {s.specialised_name()}({', '.join(s.param_types)})"
                                                           for s in st.stub.specs],
             "content_key": r.content_key, "key": r.key}
            for r, st in zip(records, stubbed, strict=True)
        ],
    }  # fmt: skip
    return (json.dumps(index, indent=1) + "\n").encode()


def _recorded_copy(module: str, unit: str, path: Path, ahead_dir: Path) -> tuple[Path, str, int] | None:
    """(where, text, number of functions) of the recorded copy of ``path``; None for a file with no
    function specialisation (a dispatch, a class specialisation): it is compiled as it is."""
    text = inputs.read_checked(path, limit=inputs.MAX_SOURCE, what="source").decode()
    try:
        if not cxx.find_specializations(text):
            return None
        copy, n = stubs.record_ahead(text, module=module, unit=unit)
    except CxxError as exc:
        raise QolaError(
            f"cannot record ahead unit {unit} ({path}): {exc}",
            hint="build without [usage] record_ahead, or defer the unit to the JIT ([jit])",
        ) from None
    return ahead_dir / path.name, copy, n


def read_index(jit_dir: Path) -> schema.JitIndex:
    """``<jit_dir>/index.json``, read as an untrusted file (regular, bounded) and shape-checked."""
    path = jit_dir / fmt.INDEX
    hint = "is this an OUT/jit/<module> dir? rebuild the output dir if it is"
    try:
        data = schema.read_json(path)
    except QolaError as exc:
        raise QolaError(exc.message, hint=exc.hint or hint) from None
    if not isinstance(data, dict) or data.get("format") != fmt.INDEX_FORMAT or data.get("version") != fmt.INDEX_VERSION:
        raise QolaError(f"{path} is not a qola JIT index (version {fmt.INDEX_VERSION})", hint=hint)
    return schema.JitIndex.parse(data, str(path))
