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

from qola.core import inputs
from qola.core.errors import QolaError
from qola.core.fsutil import replace_tree, write_if_changed
from qola.jit import cxx, libtable, schema, stubs
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


def _c(s: str) -> str:
    if not s.isascii():
        raise QolaError(f"non-ASCII text in a JIT table: {s!r}")
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _init(fields: Sequence[str], values: dict[str, str]) -> str:
    """A C aggregate initializer: ``values`` in the struct's declaration order (qola.jit.format)."""
    assert set(values) == set(fields), sorted(set(values) ^ set(fields))
    return ",\n     ".join(values[f] for f in fields)


def render_table(spec: JitModuleSpec, records: Sequence[JitUnitRecord], flags: Sequence[str],
                 headers: str, headers_sha: str, headers_digest: str = "",
                 ahead: Sequence[tuple[str, int]] = ()) -> str:  # fmt: skip
    """The runtime's table (a C struct) and the same table as text in section .qola_jit, which
    ``qola jit`` reads back from the library (:mod:`qola.jit.libtable`). ``ahead``: (unit, number of
    functions) of the recorded units built ahead ([usage] record_ahead; their rows name the unit and
    the arch only, and the text record does not list them: ``qola jit`` has nothing to build)."""
    ident = stubs.module_ident(spec.module)
    jit_rel = spec.jit_dir_rel or f"../jit/{spec.module}"
    ordered = sorted(records, key=lambda r: r.name.encode())
    record = libtable.render_record({
        "module": spec.module, "jit_dir_rel": jit_rel, "lang": spec.lang, "arch": spec.arch,
        "compiler": spec.compiler.path, "compiler_id": spec.compiler.identity, "headers": headers,
        "headers_sha256": headers_sha, "headers_digest": headers_digest, "flags": list(flags),
        "units": [{"name": r.name, "source": r.source_rel, "source_sha256": r.source_sha256,
                   "entry_symbol": r.entry_symbol, "content_key": r.content_key, "n_funcs": r.n_funcs}
                  for r in ordered],
    })  # fmt: skip
    record_lines = "\n".join("    " + _c(line + "\n") for line in record.splitlines())
    rows = [
        "    {" + _init(fmt.ENTRY_STRUCT, {
            "name": _c(r.name), "entry_symbol": _c(r.entry_symbol), "source_rel": _c(r.source_rel),
            "source_sha256": _c(r.source_sha256), "content_key": _c(r.content_key), "flags": "k_flags",
            "arch": "k_arch", "n_funcs": f"{r.n_funcs}u"}) + "},"
        for r in ordered
    ]  # fmt: skip
    ahead_rows = [
        "    {" + _init(fmt.ENTRY_STRUCT, {
            "name": _c(name), "entry_symbol": '""', "source_rel": '""', "source_sha256": '""', "content_key": '""',
            "flags": '""', "arch": "k_arch", "n_funcs": f"{n}u"}) + "},"
        for name, n in sorted(ahead, key=lambda a: a[0].encode())
    ]  # fmt: skip
    if len({name for name, _ in ahead}) != len(ahead):
        raise QolaError(f"module {spec.module}: duplicate ahead unit names")
    arrays = "".join(
        f"const qola_jit_entry {var}[] = {{\n" + "\n".join(rows) + "\n};\n"
        for var, rows in (("k_entries", rows), ("k_ahead", ahead_rows))
        if rows
    )
    module = _init(fmt.MODULE_STRUCT, {
        "name": _c(spec.module), "jit_dir_rel": _c(jit_rel), "lang": _c(spec.lang),
        "compiler": _c(spec.compiler.path), "compiler_id": _c(spec.compiler.identity), "headers": _c(headers),
        "headers_sha256": _c(headers_sha), "headers_digest": _c(headers_digest),
        "entries": "k_entries" if rows else "nullptr", "n_entries": f"{len(records)}u", "record": "k_record",
        "manifest_name": _c(spec.manifest_name or spec.module), "build_key": _c(spec.build_key),
        "ahead": "k_ahead" if ahead_rows else "nullptr", "n_ahead": f"{len(ahead_rows)}u"})  # fmt: skip
    return (
        f"// JIT table of module {spec.module}, generated by qola. Do not edit.\n"
        '#include "qola_jit.h"\n\n'
        "QOLA_NS_BEGIN\nnamespace jit {\nnamespace {\n"
        f"const char k_flags[] = {_c(chr(10).join(flags))};\n"
        f"const char k_arch[] = {_c(spec.arch)};\n"
        + arrays
        + f'__attribute__((section("{fmt.SECTION}"), used, aligned(1))) const char k_record[] =\n'
        + record_lines
        + ";\n} // namespace\n\n"
        + f"extern const qola_jit_module module_{ident} QOLA_JIT_HIDDEN;\n"
        f"const qola_jit_module module_{ident} = {{\n    {module}}};\n"
        f"namespace {{\nregistrar k_register_{ident}(&module_{ident});\n}}\n"
        "} // namespace jit\nQOLA_NS_END\n"
    )


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


def render_jit_module(spec: JitModuleSpec, units: Sequence[tuple[str, Path]], *, out_jit: Path,
                      stub_dir: Path, batch: int = 1, ahead: Sequence[tuple[str, Path]] = (),
                      ahead_dir: Path | None = None) -> JitModuleFiles:  # fmt: skip
    """OUT/jit/<module>/ for ``units`` = (unit name, instance file) and the stubs + table for
    ``stub_dir``, computed (the instance files and their headers are read; nothing is written).
    ``batch`` > 1 puts that many units' stubs in one source when the files allow it (they always
    do for CK fMHA and the example tree), else one stub per unit. ``ahead``: units built ahead and
    recorded ([usage] record_ahead): each file with a function specialisation gets its recorded
    copy in ``ahead_dir`` (same file name) and a row of the table; the others are left as they are.
    With no ``units``, the tree is only ``index.json`` (nothing to publish: the runtime never reads
    OUT/jit for an ahead unit)."""
    style = stubs.STYLES.get(spec.style)
    if style is None:
        raise QolaError(f"unknown stub style {spec.style!r}", hint=f"use one of {', '.join(stubs.STYLES)}")
    names = [u for u, _ in units]
    if len(set(names)) != len(names):
        raise QolaError(f"module {spec.module}: duplicate JIT unit names")
    include_dirs = [Path(os.path.abspath(d)) for d in spec.include_dirs]
    scanner = hdr.HeaderScanner(include_dirs)
    final = out_jit / spec.module
    tree: dict[str, bytes] = {}
    sources: list[tuple[Path, str]] = []
    bundle: dict[str, bytes] = {}
    records, stub_sources, texts = [], [], []
    with_srcdir, unit_headers = False, {}
    for unit, path in units:
        path = Path(os.path.abspath(path))
        files = {}
        for h in scanner.closure(path):
            rel = hdr.bundle_path(h, include_dirs, path.parent)
            files[rel] = scanner.read(h)
            with_srcdir |= rel.startswith(hdr.SRCDIR + "/")
        bundle.update(files)
        unit_headers[unit] = files
    flags = [*hdr.include_flags(len(include_dirs), with_srcdir), *spec.flags] if units else []
    for unit, path in units:
        text = inputs.read_checked(path, limit=inputs.MAX_SOURCE, what="JIT unit").decode()
        try:
            st = stubs.stub_unit(text, module=spec.module, unit=unit, style=style)
        except CxxError as exc:
            raise QolaError(f"cannot stub JIT unit {unit} ({path}): {exc}") from None
        source_rel = f"{fmt.SOURCES}/{unit}{Path(path).suffix}"
        data = st.jit_text.encode()
        tree[source_rel] = data
        ckey = jkey.content_key(source=data, headers=jkey.headers_digest(unit_headers[unit].items()),
                                flags=flags, arch=spec.arch, lang=spec.lang)  # fmt: skip
        records.append(JitUnitRecord(unit, source_rel, jkey.sha256_hex(data), st.entry_symbol, len(st.specs), ckey,
                                     jkey.entry_key(ckey, spec.compiler.identity)))  # fmt: skip
        texts.append((unit, text, Path(path).suffix, st))
    ident = stubs.module_ident(spec.module)
    for k in range(0, len(texts), max(1, batch)):
        group = texts[k : k + max(1, batch)]
        try:
            if len(group) == 1:
                raise CxxError("single")
            text = stubs.stub_batch([(u, t) for u, t, _, _ in group], module=spec.module, style=style)
            out = stub_dir / f"qola_jit_stubs_{ident}_{k // batch}{group[0][2]}"
            sources.append((out, text))
            stub_sources.append(out)
        except CxxError:
            for unit, _, suffix, st in group:
                out = stub_dir / f"{unit}{suffix}"
                sources.append((out, st.stub_text))
                stub_sources.append(out)
    headers_sha = headers_digest = ""
    if bundle:
        tree[fmt.BUNDLE] = hdr.tar_gz_bytes(bundle.items())
        headers_sha = jkey.sha256_hex(tree[fmt.BUNDLE])
        headers_digest = jkey.headers_digest(bundle.items())
    index = {
        "format": fmt.INDEX_FORMAT, "version": fmt.INDEX_VERSION, "module": spec.module, "lang": spec.lang,
        "arch": spec.arch, "style": spec.style,
        "compiler": {"path": spec.compiler.path, "identity": spec.compiler.identity, "version": spec.compiler.version},
        "headers": {"bundle": fmt.BUNDLE if bundle else "", "sha256": headers_sha, "digest": headers_digest,
                    "files": len(bundle)},
        "flags": flags,
        "units": [
            {"name": r.name, "source": r.source_rel, "source_sha256": r.source_sha256,
             "entry_symbol": r.entry_symbol, "functions": [f"{s.ret} {s.specialised_name()}({', '.join(s.param_types)})"
                                                           for s in st.specs],
             "content_key": r.content_key, "key": r.key}
            for r, (_, _, _, st) in zip(records, texts)
        ],
    }  # fmt: skip
    tree[fmt.INDEX] = (json.dumps(index, indent=1) + "\n").encode()
    copies, ahead_rows = [], []
    for unit, path in ahead:
        copy = _recorded_copy(spec.module, unit, Path(path), ahead_dir or stub_dir)
        if copy is not None:
            sources.append((copy[0], copy[1]))
            copies.append((Path(path), copy[0]))
            ahead_rows.append((unit, copy[2]))
    table = stub_dir / f"qola_jit_table_{ident}.cpp"
    head = fmt.BUNDLE if bundle else ""
    sources.append((table, render_table(spec, records, flags, head, headers_sha, headers_digest, ahead_rows)))
    output = JitModuleOutput(
        module=spec.module, jit_dir=final, index=final / fmt.INDEX, table_source=table,
        stub_sources=tuple(stub_sources), runtime_sources=runtime_sources(), include_dir=runtime_dir(),
        units=tuple(records), ahead=tuple(copies),
    )  # fmt: skip
    return JitModuleFiles(output, tuple(sorted(tree.items())), tuple(sources))


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


def read_index(jit_dir: Path) -> dict:
    """``<jit_dir>/index.json``, read as an untrusted file (regular, bounded) and shape-checked."""
    path = jit_dir / fmt.INDEX
    hint = "is this an OUT/jit/<module> dir? rebuild the output dir if it is"
    try:
        data = schema.read_json(path)
    except QolaError as exc:
        raise QolaError(exc.message, hint=exc.hint or hint) from None
    if not isinstance(data, dict) or data.get("format") != fmt.INDEX_FORMAT or data.get("version") != fmt.INDEX_VERSION:
        raise QolaError(f"{path} is not a qola JIT index (version {fmt.INDEX_VERSION})", hint=hint)
    schema.check(data, schema.INDEX, str(path))
    schema.unique_units(data["units"], str(path))
    return data
