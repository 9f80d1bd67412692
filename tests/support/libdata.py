"""Read what a built library carries, without a GPU: embedded code objects and HIP device code.

Embedded code objects: qola's ``<prefix>_{count,index,keys,blobs}`` symbols (see qola.hooks.embed).

A linked HIP library keeps one clang offload bundle per translation unit in its ``.hip_fatbin``
section. Each bundle starts with ``__CLANG_OFFLOAD_BUNDLE__``, then the entry count and, per entry,
(offset, size, triple length, triple); device entries are AMDGPU ELF code objects whose kernels
show up as ``<kernel>.kd`` descriptor symbols.
"""

from __future__ import annotations

import io
import struct
from collections import defaultdict
from pathlib import Path

MAGIC = b"__CLANG_OFFLOAD_BUNDLE__"
EM_AMDGPU = 224


def embedded_blobs(so: Path, prefix: str, align: int) -> tuple[dict[str, bytes], int]:
    """{key: bytes} decoded from the linked library's index, key table and blobs; and the blobs' size."""
    from elftools.elf.elffile import ELFFile
    from elftools.elf.sections import SymbolTableSection

    with open(so, "rb") as f:
        elf = ELFFile(f)
        symtab = elf.get_section_by_name(".symtab")
        assert isinstance(symtab, SymbolTableSection)
        syms = {s.name: s for s in symtab.iter_symbols() if s.name.startswith(prefix)}
        assert set(syms) == {f"{prefix}_{k}" for k in ("blobs", "index", "keys", "count")}, sorted(syms)

        def read(name: str) -> bytes:
            s = syms[f"{prefix}_{name}"]
            sec = elf.get_section(s["st_shndx"])
            assert sec["sh_type"] == "SHT_PROGBITS" and not sec["sh_flags"] & 0x1  # read-only data
            f.seek(sec["sh_offset"] + s["st_value"] - sec["sh_addr"])
            return f.read(s["st_size"])

        (count,) = struct.unpack("<Q", read("count"))
        index, keys, blobs = read("index"), read("keys"), read("blobs")
    assert len(index) == 24 * count
    found = {}
    for i in range(count):
        k, klen, off, size = struct.unpack_from("<IIQQ", index, 24 * i)
        assert off % align == 0
        found[keys[k : k + klen].decode()] = blobs[off : off + size]
    return found, len(blobs)


def bundles(data: bytes) -> list[list[tuple[str, bytes]]]:
    """Every bundle in ``data``: a list of (triple, payload) per bundle."""
    out = []
    start = data.find(MAGIC)
    while start >= 0:
        pos = start + len(MAGIC)
        (count,) = struct.unpack_from("<Q", data, pos)
        pos += 8
        entries = []
        for _ in range(count):
            off, size, tlen = struct.unpack_from("<QQQ", data, pos)
            pos += 24
            triple = data[pos : pos + tlen].decode()
            pos += tlen
            entries.append((triple, data[start + off : start + off + size]))
        out.append(entries)
        start = data.find(MAGIC, pos)
    return out


def fatbin_section(lib: Path) -> bytes:
    from elftools.elf.elffile import ELFFile

    with open(lib, "rb") as f:
        sec = ELFFile(f).get_section_by_name(".hip_fatbin")
        return sec.data() if sec is not None else b""


def kernels_by_arch(lib: Path) -> dict[str, set[str]]:
    """{gfx arch: kernel symbol names} over every device code object in the library."""
    from elftools.elf.elffile import ELFFile
    from elftools.elf.sections import SymbolTableSection

    found: dict[str, set[str]] = defaultdict(set)
    for bundle in bundles(fatbin_section(lib)):
        for triple, blob in bundle:
            if not triple.startswith("hip") or "amdgcn" not in triple:
                continue
            arch = triple.rsplit("-", 1)[-1].split(":")[0]
            elf = ELFFile(io.BytesIO(blob))
            assert elf["e_machine"] in ("EM_AMDGPU", EM_AMDGPU), (triple, elf["e_machine"])
            found.setdefault(arch, set())
            for name in (".symtab", ".dynsym"):
                sec = elf.get_section_by_name(name)
                if isinstance(sec, SymbolTableSection):
                    found[arch] |= {s.name[:-3] for s in sec.iter_symbols() if s.name.endswith(".kd")}
    return dict(found)
