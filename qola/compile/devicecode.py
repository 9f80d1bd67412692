"""Device code from facts: which generator wrote each generated file, the archs each file is compiled
for, and which generated units hold no kernel (compiled host-only, ``--cuda-host-only``).

The facts are the plan's: each generator's script (CK's fMHA ``generate.py`` is recognised by
``genrules.flavor_of``, a per-arch asm generator by lying under the tree's ``hsa/<gfx…>/``, an AITER
C++ API generator by lying in the tree's ``csrc/cpp_itfs/``) and the files each generator wrote (the
codegen stage records them per command: ``GenResult.groups``). Names decide nothing on their own:

* CK's naming rule (``…_gfx9`` / ``…_gfx950``: ``genrules.source_archs``) applies to the files CK's
  generator wrote, and a name that names several archs keeps all of them; any other file gets every
  build arch.
* A unit is host-only when the generator that wrote it writes it with host code only: CK's dispatch
  (``fmha_<direction>_api``: it calls launchers other files define, declared in its headers), a
  per-arch asm generator's launcher (it loads code objects at run time), the API file of an AITER
  C++ API generator (``mha_fwd_generate.py`` writes ``mha_fwd.cpp``, which calls CK's dispatch and
  the asm launchers; any other file a generator there writes may hold kernels and keeps its device
  passes). Every host-only object is then checked
  (:mod:`qola.compile.hostonly`): the rule may be wrong for a future generator, the object cannot be.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from qola.plan import genrules
from qola.plan.model import Generator

CK, ASM, ITFS, PLAIN = "ck", "asm", "itfs", "plain"
ITFS_DIR = ("csrc", "cpp_itfs")  # AITER's C++ API generators, under the tree's meta dir
ITFS_SUFFIX = "_generate.py"  # … named <api>_generate.py; each writes its API, <api>.cpp


@dataclass(frozen=True)
class Writer:
    """What the plan knows of the generator that wrote a group of files: its kind and direction."""

    kind: str  # CK | ASM | ITFS | PLAIN
    script: str
    direction: str | None = None

    def host_only(self, src: str) -> bool:
        """Whether ``src`` (a file this generator wrote) holds host code only."""
        if self.kind == ASM:
            return True
        if self.kind == ITFS:  # mha_fwd_generate.py writes mha_fwd.cpp (its AITER_API_FILENAME)
            return Path(src).name == Path(self.script).name.removesuffix(ITFS_SUFFIX) + ".cpp"
        if self.kind != CK:
            return False
        dirs = (self.direction or "fwd").split(",")
        return Path(src).stem in {genrules.dispatch_stem(d) for d in dirs if d}


def writer_of(gen: Generator, meta_dir: str | os.PathLike[str]) -> Writer:
    script = gen.script
    if genrules.flavor_of(script) == CK:
        return Writer(CK, script, gen.direction)
    if genrules.asm_arch(script, Path(meta_dir) / "hsa") is not None:
        return Writer(ASM, script, gen.direction)
    itfs = Path(os.path.normpath(meta_dir)).joinpath(*ITFS_DIR)
    if script.endswith(ITFS_SUFFIX) and Path(os.path.normpath(script)).parent == itfs:
        return Writer(ITFS, script, gen.direction)
    return Writer(PLAIN, script, gen.direction)


def writers(gens: Sequence[Generator], groups: Sequence[Sequence[str]], meta_dir: str) -> tuple[Writer, ...]:
    """The writer of each of ``groups`` (the files each generator that ran wrote, in command order);
    () when they cannot be matched. The codegen stage skips an absent per-arch asm generator (it
    records no group for it): the generators that ran are the others."""
    hsa = Path(meta_dir) / "hsa"
    ran = [
        g
        for g in gens
        if not (genrules.asm_arch(g.run_argv[0] if g.run_argv else "", hsa) and not Path(g.run_argv[0]).exists())
    ]
    if not groups or len(ran) != len(groups):
        return ()
    return tuple(writer_of(g, meta_dir) for g in ran)


def source_archs(
    groups: Sequence[Sequence[str]], kinds: Sequence[Writer], archs: tuple[str, ...]
) -> dict[str, tuple[str, ...]]:
    """Each file CK's generator wrote -> the build archs it holds device code for, judged among the
    files of that one generator (``genrules.source_archs``). Files of other generators, or of
    generators not known, are absent: they get every arch."""
    out: dict[str, tuple[str, ...]] = {}
    for group, writer in zip(groups, kinds, strict=False):
        if writer.kind == CK:
            out.update(genrules.source_archs(group, archs))
    return out


def host_only(groups: Sequence[Sequence[str]], kinds: Sequence[Writer]) -> tuple[str, ...]:
    """The files of ``groups`` whose writer writes host code only (:meth:`Writer.host_only`)."""
    return tuple(s for group, w in zip(groups, kinds, strict=False) for s in group if w.host_only(s))
