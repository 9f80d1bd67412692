"""What a compile unit ``#include``\\ s, read from its text: one scanner for every stage that needs a
unit's headers before the compiler has run (no depfile yet).

Both answers follow every ``#include`` line whatever the ``#if`` around it (a superset of what the
compiler reads) and resolve a name as the compiler does: a quoted one beside its includer first,
then through the include dirs in order.

* :meth:`HeaderScanner.closure` — the headers a unit reads, the first match of each name (the JIT's
  header bundle: a header it misses fails the unit's compile loudly, at its first use).
* :meth:`HeaderScanner.reaches` — whether a unit *can* read one of some files: every candidate of
  every name is followed (``#include_next`` and ``__has_include`` too), and an include whose name is
  a macro counts as reading anything. A ``False`` is a fact; a ``True`` may be a guess on the safe side
  (qola's fixes: :mod:`qola.compile.overlay`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from qola.core import inputs
from qola.core.errors import QolaError

_INCLUDE = re.compile(rb'^[ \t]*#[ \t]*include[ \t]*([<"])([^>"\n]+)[>"]', re.M)
# every form a file can be named in (``#include``, ``#include_next``, ``#import``, ``__has_include``),
# and a ``#include`` whose argument is not a literal name (a macro: anything)
_NAMED = re.compile(
    rb'(?:^[ \t]*#[ \t]*(?:include(?:_next)?|import)|__has_include(?:_next)?[ \t]*\()[ \t]*([<"])([^>"\n]+)[>"]', re.M
)
_MACRO = re.compile(rb"^[ \t]*#[ \t]*(?:include(?:_next)?|import)[ \t]+[^<\"\s/]", re.M)


@dataclass
class HeaderScanner:
    """Resolves includes against ordered include dirs; memoises per header."""

    include_dirs: Sequence[Path]
    _deps: dict[Path, tuple[Path, ...]] = field(default_factory=dict)
    _every: dict[Path, tuple[tuple[Path, ...], bool]] = field(default_factory=dict)
    _data: dict[Path, bytes] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.include_dirs = [Path(os.path.abspath(d)) for d in self.include_dirs]

    def read(self, path: Path) -> bytes:
        if path not in self._data:
            self._data[path] = inputs.read_checked(path, limit=inputs.MAX_SOURCE, what="header")
        return self._data[path]

    def _candidates(self, includer: Path, quote: bool, name: str) -> list[Path]:
        cands = ([includer.parent / name] if quote else []) + [d / name for d in self.include_dirs]
        return [Path(os.path.normpath(c)) for c in cands if c.is_file()]

    def _direct(self, path: Path) -> tuple[Path, ...]:
        if path not in self._deps:
            found = []
            for kind, name in _INCLUDE.findall(self.read(path)):
                cands = self._candidates(path, kind == b'"', name.decode(errors="replace").strip())
                found += cands[:1]
            self._deps[path] = tuple(found)
        return self._deps[path]

    def closure(self, source: Path) -> list[Path]:
        """Every header reachable from ``source`` through the include dirs, first matches (sorted)."""
        seen: set[Path] = set()
        todo = list(self._direct(Path(os.path.abspath(source))))
        while todo:
            h = todo.pop()
            if h not in seen:
                seen.add(h)
                todo.extend(self._direct(h))
        return sorted(seen)

    def _all(self, path: Path) -> tuple[tuple[Path, ...], bool]:
        """(every file each name of ``path`` can resolve to, whether it includes a macro's name)."""
        if path not in self._every:
            try:
                text = self.read(path)
            except (OSError, QolaError):
                self._every[path] = ((), True)  # unreadable: it may read anything
                return self._every[path]
            found: list[Path] = []
            for kind, name in _NAMED.findall(text):
                found += self._candidates(path, kind == b'"', name.decode(errors="replace").strip())
            self._every[path] = (tuple(found), bool(_MACRO.search(text)))
        return self._every[path]

    def every(self, source: Path) -> tuple[tuple[Path, ...], bool]:
        """(``source`` and every file it can read, each candidate of each name followed; whether one
        of them includes a macro's name or cannot be read: then it may read anything)."""
        start = Path(os.path.normpath(os.path.abspath(source)))
        seen: dict[Path, None] = {}
        todo, opaque = [start], False
        while todo:
            f = todo.pop()
            if f in seen:
                continue
            seen[f] = None
            deps, macro = self._all(f)
            opaque = opaque or macro
            todo.extend(deps)
        return tuple(seen), opaque

    def reaches(self, source: Path, targets: Collection[Path]) -> bool:
        """Whether ``source`` can read one of ``targets`` (normalised absolute paths), itself included."""
        start = Path(os.path.normpath(os.path.abspath(source)))
        seen: set[Path] = set()
        todo = [start]
        while todo:
            f = todo.pop()
            if f in seen:
                continue
            if f in targets:
                return True
            seen.add(f)
            deps, opaque = self._all(f)
            if opaque:
                return True
            todo.extend(deps)
        return False


def search_path(flags: list[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(the dirs a compile with ``flags`` searches, in order: ``-iquote``, ``-I``, ``-isystem``; the
    files its ``-include`` flags read first)."""
    found: dict[str, list[str]] = {"-iquote": [], "-I": [], "-isystem": [], "-include": []}
    it = iter(flags)
    for f in it:
        for opt, seen in found.items():
            if f == opt:
                seen.append(next(it, ""))
            elif f.startswith(opt):
                seen.append(f[len(opt) :])
    dirs = (*found["-iquote"], *found["-I"], *found["-isystem"])
    return tuple(d for d in dirs if d), tuple(f for f in found["-include"] if f)
