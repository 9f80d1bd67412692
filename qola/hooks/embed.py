"""Embed code objects: ``hsa/<arch>/<type>/**/*.co`` → one ``.S`` of ``.incbin`` + a lookup header.

Three pure steps and one that writes:

* :func:`collect` finds the blobs (sorted by key, hashed);
* :func:`render` turns them into the assembler text, the header text and a
  JSON-able index (:class:`EmbedSources`);
* :func:`write` puts the three files in a directory atomically (temp + rename,
  unchanged files are left alone so their mtimes stay);
* :func:`assemble_command` is the host-assembler command for the ``.S``.

Layout of the assembled object (all in read-only sections, every symbol
``.hidden`` — linked into a shared library, nothing here is ever exported):

* ``qola_embed_<ns>_<module>_blobs`` — the unique blobs back to back, each
  starting at a multiple of :data:`ALIGN` from the (equally aligned) base;
* ``..._index`` — ``count`` rows of ``{u32 key, u32 key_len, u64 offset,
  u64 size}``, sorted by key in ``strcmp`` order; offsets and sizes are label
  differences, so the assembler computes them from the bytes it really read;
* ``..._keys`` — the NUL-terminated keys; ``..._count`` — a ``u64``.

Identical blobs (same sha256) are stored once; their rows share an offset.

Alignment: 256 by default.  ``hipModuleLoadData`` / ``cuModuleLoadData`` parse
the image where it lies and copy the segments into memory of their own, so in
place they need only the ELF64 / fatbin headers' alignment (8); 256 is the
largest section alignment in AITER's 2,501 code objects, so every section also
sits at its natural alignment.  4096 (the segments' p_align, which matters only
once loaded) would cost 5.0 MB of padding on that set against 0.3 MB for 256;
``align=4096`` is there for a consumer that wants page-aligned images.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qola.core import rules
from qola.core.errors import QolaError
from qola.core.fsutil import write_if_changed
from qola.core.hashing import TooLarge, regular_file_sha256

ALIGN = 256
SUFFIX = ".co"
MAX_CODE_OBJECT = 1 << 30  # bytes of one code object (AITER's largest are a few MB)
_PART = re.compile(r"[A-Za-z0-9._+=,@-]+\Z")  # one path component of a key


@dataclass(frozen=True)
class Blob:
    """One code object: its lookup key, where it lies, its size and sha256."""

    key: str  # "hsa/<arch>/<type>/<file>.co"
    path: Path  # absolute
    size: int
    sha256: str


@dataclass(frozen=True)
class EmbedSources:
    """What :func:`render` produces; :func:`write` puts it on disk."""

    namespace: str
    module: str
    asm: str  # the .S text
    header: str  # the qola_embedded_<module>.h text
    index: dict[str, Any] = field(hash=False)  # JSON-able: entries (key, offset, size, sha256) + totals
    inputs: tuple[str, ...] = ()  # every code object read (duplicates too): regenerate when one changes

    @property
    def basename(self) -> str:
        return f"qola_embedded_{self.module}"


@dataclass(frozen=True)
class EmbedFiles:
    asm: Path
    header: Path
    index: Path


def symbol_prefix(namespace: str, module: str) -> str:
    """Prefix of the (hidden) data symbols: ``qola_embed_<ns>_<module>``."""
    return f"qola_embed_{namespace}_{module}"


def keep_ldflags(namespace: str, module: str) -> list[str]:
    """Link flags that keep the embedded code objects in the library: it links with ``--gc-sections``
    (:func:`qola.compile.link.library_ldflags`), and a tree whose code never looks them up (AITER
    before ``AITER_EMBEDDED_HSA_MAP``) would otherwise lose them; an ``--undefined`` symbol is a root
    of the collection (GNU ld and lld), defined here, so it neither exports nor leaves anything undefined."""
    sym = symbol_prefix(namespace, module)
    return [f"-Wl,--undefined={sym}_blobs", f"-Wl,--undefined={sym}_index"]


def aiter_define(module: str) -> str:
    """The compile flag that makes ``aiter_hip_common.h`` include this module's header."""
    return f'-DAITER_EMBEDDED_HSA_HEADER="qola_embedded_{module}.h"'


def resolve_hsa_dir(path: str | os.PathLike[str]) -> Path:
    """``path`` is the hsa dir itself or a tree root (``<root>/hsa``, ``<root>/aiter_meta/hsa``)."""
    root = Path(path).expanduser()
    if not root.is_dir():
        raise QolaError(
            f"hsa directory not found: {root}",
            hint="pass the tree's hsa/ directory or the tree root (hsa/ or aiter_meta/hsa/ inside)",
        )
    for candidate in (root / "hsa", root / "aiter_meta" / "hsa"):
        if candidate.is_dir():
            return candidate.resolve()
    return root.resolve()


def _check_subdir(subdir: str) -> None:
    parts = subdir.strip("/").split("/")
    if not subdir or subdir.startswith("/") or any(p in ("", ".", "..") or not _PART.match(p) for p in parts):
        raise QolaError(
            f"bad kernel type {subdir!r}", hint="a kernel type is a directory under hsa/<arch>/, e.g. fmha_v3_fwd"
        )


def _key_of(hsa_dir: Path, path: Path) -> str:
    rel = path.relative_to(hsa_dir).as_posix()
    if not all(_PART.match(p) for p in rel.split("/")):
        raise QolaError(
            f"bad code object name {rel!r} under {hsa_dir}", hint="names may use letters, digits and . _ + = , @ - only"
        )
    return f"hsa/{rel}"


def collect(hsa_dir: str | os.PathLike[str], archs: Sequence[str], subdirs: Sequence[str] | None = None) -> list[Blob]:
    """All ``hsa/<arch>/<type>/**/*.co`` for each arch and type, sorted by key.

    ``hsa_dir`` may be a tree root (see :func:`resolve_hsa_dir`).
    ``subdirs=None`` takes every code object under ``hsa/<arch>/``.
    Every (arch, type) must yield at least one code object.
    """
    base = resolve_hsa_dir(hsa_dir)
    if not archs:
        raise QolaError("no architecture given", hint="name at least one, e.g. --arch gfx942")
    blobs: dict[str, Blob] = {}
    for arch in archs:
        rules.check_name("architecture", arch, rules.arch_dir_problem(arch), "e.g. gfx942, gfx950, sm_90")
        arch_dir = base / arch
        if not arch_dir.is_dir():
            have = sorted(p.name for p in base.iterdir() if p.is_dir())
            raise QolaError(
                f"no code objects for architecture {arch}: {arch_dir} does not exist",
                hint=f"architectures in {base}: {', '.join(have) or 'none'}",
            )
        for subdir in subdirs if subdirs is not None else [""]:
            if subdirs is not None:
                _check_subdir(subdir)
            top = arch_dir / subdir.strip("/") if subdir else arch_dir
            found = sorted(p for p in top.rglob(f"*{SUFFIX}") if p.is_file()) if top.is_dir() else []
            if not found:
                have = sorted(p.name for p in arch_dir.iterdir() if p.is_dir())
                raise QolaError(
                    f"no {SUFFIX} files for {arch}/{subdir or '*'} under {base}",
                    hint=f"kernel types for {arch}: {', '.join(have) or 'none'}",
                )
            for path in found:
                key = _key_of(base, path)
                if key not in blobs:
                    blobs[key] = _blob(base, key, path)
    return sorted(blobs.values(), key=lambda b: b.key.encode())


def _blob(base: Path, key: str, path: Path) -> Blob:
    """A code object as embedded: a regular file of at most :data:`MAX_CODE_OBJECT` bytes that lies
    under the hsa dir once links are resolved (a link to /etc/shadow would put that file into a
    library others can read), hashed from one checked open."""
    real = path.resolve()
    if not real.is_relative_to(base):
        raise QolaError(
            f"code object {key} is a link to {real}, outside the tree's hsa dir {base}; not embedded",
            hint="code objects must be files of the tree (replace the link by the file)",
        )
    try:
        digest, size = regular_file_sha256(real, limit=MAX_CODE_OBJECT)
    except TooLarge as exc:
        raise QolaError(
            f"code object {key} is too large to embed ({exc})",
            hint="AITER's code objects are kilobytes to a few megabytes: is this the right file?",
        ) from None
    except OSError as exc:
        raise QolaError(
            f"cannot read code object {key}: {exc.strerror or exc}", hint="code objects must be regular files"
        ) from None
    return Blob(key, real, size, digest)


def _asm_string(path: str) -> str:
    if any(ord(c) < 32 or ord(c) == 127 for c in path):
        raise QolaError(f"cannot embed {path!r}: control character in the path")
    return '"' + path.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _symbol(name: str) -> list[str]:  # global for the linker, hidden from the dynamic symbol table
    return [f"        .globl  {name}", f"        .hidden {name}", f"        .type   {name}, %object", f"{name}:"]


def _layout(blobs: Sequence[Blob], align: int) -> tuple[dict[str, Blob], dict[str, int], int]:
    """Unique blobs (first per sha256, in key order), their offsets, and the total size."""
    first: dict[str, Blob] = {}
    for b in blobs:
        first.setdefault(b.sha256, b)
    offsets: dict[str, int] = {}
    total = 0
    for sha, b in first.items():  # the same sequence the .balign/.incbin lines produce
        total = (total + align - 1) // align * align
        offsets[sha] = total
        total += b.size
    return first, offsets, total


def _render_asm(
    blobs: Sequence[Blob], first: dict[str, Blob], total: int, *, align: int, namespace: str, module: str
) -> str:
    sym = symbol_prefix(namespace, module)
    unique = {sha: n for n, sha in enumerate(first)}  # label number per blob
    out = [
        f"/* qola_embedded_{module}.S: generated by qola embed, do not edit.",
        f"   namespace {namespace}, module {module}: {len(blobs)} keys, {len(unique)} unique blobs,",
        f"   {total} bytes; every blob at a multiple of {align} bytes from the base.",
        "   Plain assembler (ELF), no preprocessor needed: cc -c -x assembler. */",
        '        .section .note.GNU-stack,"",%progbits',
        '        .section .rodata.qola_embed,"a",%progbits',
        f"        .balign {align}",
        *_symbol(f"{sym}_blobs"),
    ]
    for sha, n in unique.items():
        out += [
            f"        .balign {align}",
            f".Lqe_b{n}:",
            f"        .incbin {_asm_string(str(first[sha].path))}",
            f".Lqe_e{n}:",
        ]
    out += [
        ".Lqe_end:",
        f"        .size   {sym}_blobs, .Lqe_end - {sym}_blobs",
        "",
        '        .section .rodata.qola_embed_index,"a",%progbits',
        "        .balign 8",
        *_symbol(f"{sym}_count"),
        f"        .quad   {len(blobs)}",
        f"        .size   {sym}_count, 8",
        *_symbol(f"{sym}_index"),
    ]
    for i, b in enumerate(blobs):
        n = unique[b.sha256]
        out += [
            f"        .long   .Lqe_k{i} - {sym}_keys, {len(b.key.encode())}",
            f"        .quad   .Lqe_b{n} - {sym}_blobs, .Lqe_e{n} - .Lqe_b{n}",
        ]
    out += [f"        .size   {sym}_index, {24 * len(blobs)}", *_symbol(f"{sym}_keys")]
    for i, b in enumerate(blobs):
        out += [f".Lqe_k{i}:", f"        .asciz  {_asm_string(b.key)}"]
    out += [".Lqe_kend:", f"        .size   {sym}_keys, .Lqe_kend - {sym}_keys", ""]
    return "\n".join(out)


_HEADER = """\
/* {base}.h: generated by qola embed, do not edit.
 * Code objects for namespace {ns}, module {module}; keys "hsa/<arch>/<type>/<file>.co";
 * every blob {align}-byte aligned.  The set and its sizes are in {base}.json: this text does not
 * depend on them, so changing a code object re-assembles and relinks but recompiles nothing.
 *
 * C:   const unsigned char* {fn}(const char* key, size_t* size);  -> NULL if absent
 * C++: AITER_EMBEDDED_HSA_MAP, a std::unordered_map<std::string, std::string_view>,
 *      for aiter_hip_common.h compiled with -DAITER_EMBEDDED_HSA_HEADER="{base}.h".
 * The data lives in {base}.S (assembled with the module); its symbols are hidden. */
#ifndef {guard}
#define {guard}
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifndef QOLA_EMBED_ENTRY_V1
#define QOLA_EMBED_ENTRY_V1
/* One index row; rows are sorted by key in strcmp order. */
typedef struct qola_embed_entry_v1 {{
    uint32_t key;     /* offset of the NUL-terminated key in the key table */
    uint32_t key_len; /* strlen of the key */
    uint64_t offset;  /* offset of the blob from the blob base */
    uint64_t size;    /* bytes */
}} qola_embed_entry_v1;
#endif

#ifdef __cplusplus
extern "C" {{
#endif
extern const unsigned char {sym}_blobs[] __attribute__((visibility("hidden")));
extern const qola_embed_entry_v1 {sym}_index[] __attribute__((visibility("hidden")));
extern const char {sym}_keys[] __attribute__((visibility("hidden")));
extern const uint64_t {sym}_count __attribute__((visibility("hidden")));

/* Number of keys; {fn_base}_key(i) is the i-th in sorted order. */
static inline size_t {fn_base}_count(void) {{ return (size_t){sym}_count; }}
static inline const char* {fn_base}_key(size_t i) {{ return {sym}_keys + {sym}_index[i].key; }}

/* The code object stored under key, or NULL; *size (if size) gets its length. */
static inline const unsigned char* {fn}(const char* key, size_t* size)
{{
    size_t lo = 0, hi = (size_t){sym}_count;
    while(lo < hi)
    {{
        size_t mid = lo + (hi - lo) / 2;
        const qola_embed_entry_v1* e = &{sym}_index[mid];
        int c = strcmp(key, {sym}_keys + e->key);
        if(c == 0)
        {{
            if(size) *size = (size_t)e->size;
            return {sym}_blobs + e->offset;
        }}
        if(c < 0) hi = mid; else lo = mid + 1;
    }}
    if(size) *size = 0;
    return NULL;
}}
#ifdef __cplusplus
}} /* extern "C" */

#include <string>
#include <string_view>
#include <unordered_map>

namespace qola {{ namespace {ns} {{
/* Built on first use from the index; hidden, so a shared library never exports it. */
__attribute__((visibility("hidden"))) inline const std::unordered_map<std::string, std::string_view>&
{module}_embedded_hsa_map()
{{
    static const std::unordered_map<std::string, std::string_view> map = [] {{
        std::unordered_map<std::string, std::string_view> m;
        m.reserve((size_t){sym}_count);
        for(uint64_t i = 0; i < {sym}_count; ++i)
        {{
            const qola_embed_entry_v1& e = {sym}_index[i];
            m.emplace(std::string({sym}_keys + e.key, e.key_len),
                      std::string_view(reinterpret_cast<const char*>({sym}_blobs + e.offset), e.size));
        }}
        return m;
    }}();
    return map;
}}
}} }} /* namespace qola::{ns} */

#ifndef AITER_EMBEDDED_HSA_MAP
#define AITER_EMBEDDED_HSA_MAP (::qola::{ns}::{module}_embedded_hsa_map())
#endif
#endif /* __cplusplus */
#endif /* {guard} */
"""


def check_names(namespace: str, module: str, align: int = ALIGN) -> None:
    """Raise :class:`QolaError` unless the names pass :mod:`qola.core.rules` (the manifest's rules) and
    ``align`` is a power of two ≥ 8."""
    rules.check_namespace(namespace)
    rules.check_name("module name", module, rules.module_key_problem(module), "a C identifier, e.g. module_fmha_v3_fwd")
    if align < 8 or align & (align - 1):
        raise QolaError(f"bad alignment {align}", hint="a power of two, at least 8 (256 or 4096)")


def render(blobs: Sequence[Blob], namespace: str, module: str, align: int = ALIGN) -> EmbedSources:
    """Assembler text, header text and index for ``blobs`` (as :func:`collect` returns them)."""
    check_names(namespace, module, align)
    blobs = sorted(blobs, key=lambda b: b.key.encode())
    keys = [b.key for b in blobs]
    if len(set(keys)) != len(keys):
        raise QolaError(
            "duplicate keys in the embed set", hint=", ".join(sorted({k for k in keys if keys.count(k) > 1}))
        )
    sym = symbol_prefix(namespace, module)
    first, offsets, total = _layout(blobs, align)
    asm = _render_asm(blobs, first, total, align=align, namespace=namespace, module=module)
    base = f"qola_embedded_{module}"
    header = _HEADER.format(
        base=base,
        ns=namespace,
        module=module,
        align=align,
        sym=sym,
        fn=f"{namespace}_{module}_embedded_find",
        fn_base=f"{namespace}_{module}_embedded",
        guard=f"QOLA_EMBEDDED_{namespace.upper()}_{module.upper()}_H",
    )
    index = {
        "format": "qola-embed-index/1",
        "namespace": namespace,
        "module": module,
        "align": align,
        "symbol_prefix": sym,
        "keys": len(blobs),
        "unique": len(first),
        "bytes": total,
        "entries": [
            {"key": b.key, "offset": offsets[b.sha256], "size": b.size, "sha256": b.sha256, "source": str(b.path)}
            for b in blobs
        ],
    }
    inputs = tuple(sorted({str(b.path) for b in blobs}))
    return EmbedSources(namespace, module, asm, header, index, inputs)


def files_in(output_dir: str | os.PathLike[str], module: str) -> EmbedFiles:
    """Where :func:`write` puts a module's three files in ``output_dir``."""
    out, base = Path(output_dir), f"qola_embedded_{module}"
    return EmbedFiles(out / f"{base}.S", out / f"{base}.h", out / f"{base}.json")


def texts(sources: EmbedSources, output_dir: str | os.PathLike[str]) -> tuple[EmbedFiles, list[tuple[Path, str]]]:
    """(the files, [(path, text)]) :func:`write` writes; nothing is written."""
    files = files_in(output_dir, sources.module)
    return files, [
        (files.asm, sources.asm),
        (files.header, sources.header),
        (files.index, json.dumps(sources.index, indent=1) + "\n"),
    ]


def write(sources: EmbedSources, output_dir: str | os.PathLike[str]) -> EmbedFiles:
    """Write ``<base>.S``, ``<base>.h`` and ``<base>.json`` into ``output_dir`` (created), each
    atomically and only when its content changed (the mtime stays: nothing rebuilds)."""
    out = Path(output_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise QolaError(f"cannot create output directory {out}: {exc.strerror}") from None
    files, items = texts(sources, out)
    for path, text in items:
        write_if_changed(path, text)
    return files


def assemble_command(
    asm: str | os.PathLike[str],
    obj: str | os.PathLike[str],
    cc: str = "cc",
    depfile: str | os.PathLike[str] | None = None,
    extra: Iterable[str] = (),
) -> list[str]:
    """Host command assembling the ``.S`` (any ELF C compiler driver: cc, gcc, clang).

    ``depfile`` asks GNU as for a Make-style depfile that lists the ``.S`` and every
    ``.incbin``'d file (GNU as only: clang's integrated assembler has no ``--MD``).
    The text needs no preprocessor, so the driver hands the ``.S`` itself to the assembler
    (``-x assembler``): with ``-x assembler-with-cpp`` the depfile would name the
    preprocessor's deleted temp file and ninja would re-assemble on every run.
    """
    cmd = [cc, "-c", "-x", "assembler", *extra]
    if depfile is not None:
        cmd.append(f"-Wa,--MD,{os.fspath(depfile)}")
    return [*cmd, os.fspath(asm), "-o", os.fspath(obj)]
