"""Kernel machine code, kernel by kernel: the ``.text`` bytes of each HIP kernel per arch, hashed and
compared across two builds (bench/vs_aiter.py, bench/vs_qola.py; issue 42 item 2: "kernel machine code
identical (``.text`` per kernel)").

A library's GPU code objects per arch are its ``.hip_fatbin`` offload bundles (as
``qola.output.kernels.device_code_objects`` reads them). In each code object a kernel is a function
whose kernel descriptor symbol ``<name>.kd`` exists; its machine code is the ``STT_FUNC`` symbol
``<name>``'s ``st_size`` bytes at ``st_value`` in the section it names (``.text``). A kernel name found
in more than one code object of an arch (one per translation unit, ``-fno-gpu-rdc``) keeps every
distinct hash. Two sides' kernels are identical when their hash sets are equal; a name one side lacks
counts as differing.
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

Hashes = dict[str, dict[str, list[str]]]  # arch -> kernel name -> its distinct .text sha256s, sorted


def kernel_text(code_object: bytes) -> dict[str, str]:
    """Kernel name -> sha256 of its machine code, for one AMDGPU code object (empty if not ELF)."""
    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile
    from elftools.elf.sections import SymbolTableSection

    if not code_object.startswith(b"\x7fELF"):
        return {}
    try:
        elf = ELFFile(io.BytesIO(code_object))
        table = elf.get_section_by_name(".symtab") or elf.get_section_by_name(".dynsym")
        if not isinstance(table, SymbolTableSection):
            return {}
        syms = list(table.iter_symbols())
        kernels = {s.name[:-3] for s in syms if s.name.endswith(".kd")}
        out = {}
        for s in syms:
            if s.name not in kernels or s["st_info"]["type"] != "STT_FUNC" or not isinstance(s["st_shndx"], int):
                continue
            sec = elf.get_section(s["st_shndx"])
            start = s["st_value"] - sec["sh_addr"]
            out[s.name] = hashlib.sha256(sec.data()[start : start + s["st_size"]]).hexdigest()
        return {k: out.get(k, "no-code") for k in kernels}
    except ELFError:
        return {}


def library_text(path: str | Path) -> Hashes:
    """arch -> kernel -> its ``.text`` hashes, over every HIP code object of the library at ``path``
    (empty for a missing file or one without device code)."""
    from qola.output.kernels import _bundles, _sections  # the readers device_code_objects uses

    p = Path(path)
    if not p.is_file():
        return {}
    out: dict[str, dict[str, set[str]]] = {}
    for data in _sections(p, ".hip_fatbin"):
        for triple, obj in _bundles(data):
            if "amdgcn" not in triple:
                continue
            arch = triple.rsplit("-", 1)[-1].split(":")[0]
            for name, digest in kernel_text(obj).items():
                out.setdefault(arch, {}).setdefault(name, set()).add(digest)
    return {a: {k: sorted(v) for k, v in sorted(ks.items())} for a, ks in sorted(out.items())}


@dataclass(frozen=True)
class TextRow:
    """One library and arch: how many kernels have the same machine code on both sides."""

    library: str
    arch: str
    identical: int
    total: int  # kernel names on either side
    differ: tuple[str, ...]  # names with other code (or only on one side)

    @property
    def same(self) -> bool:
        return self.identical == self.total

    def text(self) -> str:
        names = ", ".join(self.differ[:3]) + (" …" if len(self.differ) > 3 else "")
        return f"kernels .text identical: {self.identical} of {self.total}" + (f"; differ: {names}" if names else "")


def compare_text(library: str, ours: Mapping[str, Mapping[str, Sequence[str]]],
                 theirs: Mapping[str, Mapping[str, Sequence[str]]]) -> list[TextRow]:  # fmt: skip
    """A row per arch of either side: kernels whose hash sets are equal, of all kernel names."""
    rows = []
    for arch in sorted(set(ours) | set(theirs)):
        a, b = ours.get(arch, {}), theirs.get(arch, {})
        names = sorted(set(a) | set(b))
        differ = tuple(n for n in names if n not in a or n not in b or sorted(a[n]) != sorted(b[n]))
        rows.append(TextRow(library, arch, len(names) - len(differ), len(names), differ))
    return rows


def text_rows(libs: Mapping[str, tuple[str | Path, str | Path]]) -> list[TextRow]:
    """``{library: (our path, their path)}`` -> the rows of every library, in name order."""
    return [r for lib, (q, t) in sorted(libs.items()) for r in compare_text(lib, library_text(q), library_text(t))]
