"""What the build's hooks add to a module, as frozen data.

A hook (:mod:`qola.hooks.jit`, :mod:`qola.hooks.isolation`) gets a module's plan and its final source
list and returns a :class:`ModuleExtra`: sources it compiles instead of some of them, flags, extra
ninja edges and link inputs, a link rule of its own, and the files those need (:class:`FileWrite`,
:class:`TreeWrite`). Hooks compute, they never write: :func:`write` puts every file in place in one
stage, before the graph is written. A hook that cannot prepare a module raises QolaError (the
module fails, the others build).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from qola.compile.ninja import Edge
from qola.core.fsutil import replace_tree, write_if_changed


class HookRecord(Protocol):
    """What a hook records of a module for the output's manifest.json (the JIT's
    :class:`qola.hooks.jit.JitRecord`): this module needs only its shape, and so imports no hook."""

    @property
    def jit_dir(self) -> Path: ...

    def to_json(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class FileWrite:
    """A text file the graph needs; written only when its content changes (its mtime then stays)."""

    path: Path
    text: str


@dataclass(frozen=True)
class TreeWrite:
    """A directory replaced as a whole (staged beside it, then renamed over it)."""

    path: Path
    files: tuple[tuple[str, bytes], ...] = field(repr=False)  # (relative path, bytes)


@dataclass(frozen=True)
class ModuleExtra:
    drop_sources: tuple[str, ...] = ()  # sources not compiled (deferred to the JIT)
    add_sources: tuple[str, ...] = ()  # compiled with the module's flags too (JIT stubs)
    host_only: tuple[str, ...] = ()  # qola's own sources with no device code: HIP, no device passes
    cflags: tuple[str, ...] = ()
    source_flags: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (source path, flags for it alone)
    # build-dir files those flags force-include into a library's entry-point sources (the switch probes
    # of qola.output.kernels): the one build-dir read a compile line may name (qola.toolchain.portable)
    entry_reads: tuple[str, ...] = ()
    ldflags: tuple[str, ...] = ()
    edges: tuple[Edge, ...] = ()  # ninja edges of their own (qola.compile.ninja.Edge)
    extra_inputs: tuple[str, ...] = ()  # objects of those edges, linked into the module
    implicit: tuple[str, ...] = ()  # files the link depends on (version scripts)
    rule: str | None = None  # the link rule; None = "link"
    variables: tuple[tuple[str, str], ...] = ()  # bindings of the link edge
    localize_hidden: bool = False  # a static archive makes its hidden symbols local (the JIT runtime)
    writes: tuple[FileWrite, ...] = ()
    trees: tuple[TreeWrite, ...] = ()
    warnings: tuple[str, ...] = ()
    jit: HookRecord | None = None  # what the JIT records of a module with deferred instances

    def then(self, other: ModuleExtra) -> ModuleExtra:
        """This extra followed by ``other``: lists concatenate, ``other``'s rule, variables and
        record win when it sets them."""
        return ModuleExtra(
            drop_sources=self.drop_sources + other.drop_sources,
            add_sources=self.add_sources + other.add_sources,
            host_only=self.host_only + other.host_only,
            cflags=self.cflags + other.cflags,
            source_flags=self.source_flags + other.source_flags,
            entry_reads=self.entry_reads + other.entry_reads,
            ldflags=self.ldflags + other.ldflags,
            edges=self.edges + other.edges,
            extra_inputs=self.extra_inputs + other.extra_inputs,
            implicit=self.implicit + other.implicit,
            rule=other.rule or self.rule,
            variables=self.variables + other.variables,
            localize_hidden=self.localize_hidden or other.localize_hidden,
            writes=self.writes + other.writes,
            trees=self.trees + other.trees,
            warnings=self.warnings + other.warnings,
            jit=other.jit if other.jit is not None else self.jit,
        )

    def flags_for(self, source: str) -> tuple[str, ...]:
        return tuple(f for s, flags in self.source_flags if s == source for f in flags)

    def sources(self, sources: Iterable[str]) -> tuple[str, ...]:
        """``sources`` less the dropped ones, plus the added ones: what the module compiles."""
        drop = set(self.drop_sources)
        return tuple(s for s in sources if s not in drop) + self.add_sources


def write(extras: Mapping[str, ModuleExtra] | Iterable[ModuleExtra], shared: Iterable[FileWrite] = ()) -> None:
    """Put every file of ``extras`` (and ``shared``) in place: text files only when changed, trees
    replaced whole."""
    items = list(extras.values() if isinstance(extras, Mapping) else extras)
    seen: set[Path] = set()
    for fw in (*shared, *(w for e in items for w in e.writes)):
        if fw.path not in seen:
            seen.add(fw.path)
            write_if_changed(fw.path, fw.text)
    for e in items:
        for tw in e.trees:
            replace_tree(tw.path, tw.files)
