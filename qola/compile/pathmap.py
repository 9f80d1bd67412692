"""Builds that do not depend on where the kernel tree and the build dir lie.

The compilers copy those locations into what they write unless told otherwise:

* ``__FILE__`` (asserts, logging) and debug info name the source's absolute path: every compile
  gets ``-ffile-prefix-map=<tree>=/qola/tree`` and ``-ffile-prefix-map=<build>=/qola/build`` (for
  nvcc through ``-Xcompiler``, which reaches its host preprocessing of both sides): a generated
  source spells its own path through a macro it expands (AITER's asm fMHA v3 files, whose HIP_CALL
  prints ``__FILE__``), and the library's bytes named the build dir (:attr:`PathMap.compiler_maps`;
  qola's compile cache names both roots, so the flag costs it no hit);
* nvcc names a translation unit's anonymous namespace and module id after the CRC32 of the source's
  absolute path (``_GLOBAL__N__<crc32>_<len>_<name>_<hash>``), in the host object and in the
  fat binary; clang's HIP driver derives ``__hip_cuid_<hash>`` from the input path and options.
  Each source is given a name that does not depend on either root (:meth:`PathMap.name`) and an
  id derived from it and its module (:func:`unit_id`); :meth:`qola.toolchain.Toolchain.unit_flags_for`
  spells them for its compiler.

This module only computes names; :func:`qola.compile.steps.graph_for` puts them on the command lines.
Standard library only.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass

TREE = "/qola/tree"  # what the kernel tree's root is called inside the libraries
BUILD = "/qola/build"  # and the build dir's


@dataclass(frozen=True)
class PathMap:
    """Prefixes (real path, stable name), checked in order; the tree and the build dir never
    nest (:func:`qola.pipeline.preflight.disjoint`), so at most one matches."""

    maps: tuple[tuple[str, str], ...]

    @classmethod
    def of(cls, tree_root: str | os.PathLike[str], build_root: str | os.PathLike[str]) -> PathMap:
        """The tree and the build dir, each as given and (if it differs) resolved."""
        pairs: list[tuple[str, str]] = []
        for root, name in ((tree_root, TREE), (build_root, BUILD)):
            for spelled in dict.fromkeys((os.path.abspath(root), os.path.realpath(root))):
                pairs.append((spelled.rstrip("/") or "/", name))
        return cls(tuple(pairs))

    @property
    def compiler_maps(self) -> tuple[tuple[str, str], ...]:
        """The pairs given to the compilers as prefix maps: the tree's and the build dir's (see the
        module's doc)."""
        return self.maps

    def name(self, path: str | os.PathLike[str]) -> str:
        """``path`` with its root replaced by the stable name (unchanged outside both roots)."""
        text = os.path.abspath(path)
        for old, new in self.maps:
            if text == old or text.startswith(old + "/"):
                return new + text[len(old) :]
        return text


def unit_id(module: str, name: str) -> str:
    """A compilation unit's id: 16 hex digits of (module, stable source name). The same for the same
    source of the same module wherever the tree lies; different for different sources."""
    return hashlib.sha256(f"{module}\0{name}".encode()).hexdigest()[:16]
