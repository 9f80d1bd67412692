"""qola's fixes of the tree's code (:mod:`qola.plan.fixes`) made real: an overlay of the tree's meta
dir in ``BUILD/fixed/`` that the compiles read instead of the tree, which stays untouched.

Each directory that holds a fixed file is staged whole: its regular files copied (the fixed ones
with the fix made), its subdirectories linked to the tree's. Its parent directories up to the meta
dir are staged as directories of links to the tree's entries, so a relative include that climbs out
of a staged directory (``"../include/x.h"``) still lands in the overlay. A module that reads a fixed
file (:attr:`qola.plan.fixes.FixUse.modules`) has every source, include dir, published header and
``-I`` flag that lies in a staged directory moved into the overlay, in the plan the stages after
this one get (:func:`staged`): the compile lines ninja runs, the JIT's header bundles and ck-jit's
recorded lines all name the fixed copies. The build key and the no-op record read the plan before
the move (the tree's own files, the fixes' record).

:func:`write` writes the overlay; an unchanged file keeps its mtime (ninja rebuilds only what a
changed fix or file touches) and what a previous build staged but this one does not is removed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from qola.compile.includes import HeaderScanner
from qola.core import inputs
from qola.core.errors import QolaError
from qola.core.fsutil import inside, remove, replace_symlink, write_if_changed
from qola.plan import fixes as fixes_mod
from qola.plan.model import ModulePlan, Plan

MAX_STAGED = 64 << 20  # one file of a staged directory
MAX_STAGED_TOTAL = 512 << 20  # every file copied (AITER's csrc/include and csrc/cpp_itfs: about 1 MiB)


@dataclass(frozen=True)
class Readers:
    """Which compile units of the modules the overlay moved read a fixed file (:meth:`reads`): only
    those compile the overlay's copies; every other unit keeps the tree's paths (:meth:`in_tree`,
    :attr:`tree`), so a line a wrapper records and replays later, with the build dir gone (ck-jit's
    kernels), names no path of the build dir but its source and output."""

    tree: Mapping[str, ModulePlan]  # each moved module as the tree has it (before the move)
    fixed: frozenset[Path]  # the fixed files in the overlay (normalised absolute paths)
    meta: str
    root: str
    _scanners: dict[tuple[str, ...], HeaderScanner] = field(default_factory=dict, compare=False, repr=False)

    def reads(self, source: str, include_dirs: tuple[str, ...], forced: tuple[str, ...] = ()) -> bool:
        """Whether the unit ``source``, compiled with ``include_dirs`` (the moved ones, in order) and
        ``-include`` ``forced``, can read a fixed file (:meth:`qola.compile.includes.HeaderScanner.reaches`:
        a ``False`` is a fact, a ``True`` may be a guess on the safe side)."""
        if include_dirs not in self._scanners:  # one per include path: a module's units share it
            self._scanners[include_dirs] = HeaderScanner([Path(d) for d in include_dirs])
        scanner = self._scanners[include_dirs]
        return any(scanner.reaches(Path(f), self.fixed) for f in (*forced, source))

    def in_tree(self, path: str) -> str:
        """``path`` of the overlay as the tree's (a path elsewhere as it is)."""
        norm = os.path.normpath(path)
        if norm != self.root and not norm.startswith(self.root + os.sep):
            return path
        return os.path.join(self.meta, os.path.relpath(norm, self.root)) if norm != self.root else self.meta


@dataclass(frozen=True)
class Overlay:
    """What :func:`staged` decided: the plan the stages after it get, the overlay's entries
    (relative path -> bytes of a file, or the tree path a link points at), the modules that
    fail (a fix whose code was found changed, or a fixed file that changed since it was planned),
    and which units of the moved modules read a fixed file (:class:`Readers`; None: no fix applied)."""

    plan: Plan
    files: Mapping[str, bytes]
    links: Mapping[str, str]
    dirs: tuple[str, ...]
    failed: Mapping[str, str]
    readers: Readers | None = None


def _dirs(files: set[str]) -> tuple[set[str], set[str]]:
    """(the staged dirs: each fixed file's; the dirs above them up to the meta dir, ``""``)."""
    staged = {os.path.dirname(f) for f in files}
    above = {"" if str(p) == "." else str(p) for d in staged if d for p in Path(d).parents}
    return staged, above - staged


def _entries(
    meta: Path, fixed: Mapping[str, str], staged: set[str], above: set[str]
) -> tuple[dict[str, bytes], dict[str, str]]:
    files: dict[str, bytes] = {}
    links: dict[str, str] = {}
    total = 0
    for rel in sorted(staged | above):
        src = meta / rel if rel else meta
        with os.scandir(src) as it:
            entries = sorted(it, key=lambda e: e.name)
        for e in entries:
            if e.name == ".git":
                continue  # the tree's repository: nothing a compile reads
            sub = f"{rel}/{e.name}" if rel else e.name
            if sub in staged or sub in above:
                continue  # a directory of the overlay itself
            st = e.stat(follow_symlinks=False)
            if rel in staged and stat.S_ISREG(st.st_mode):
                files[sub] = (
                    fixed[sub].encode("utf-8")
                    if sub in fixed
                    else inputs.read_checked(e.path, limit=MAX_STAGED, what="tree file", follow=False)
                )
                total += len(files[sub])
                if total > MAX_STAGED_TOTAL:
                    raise QolaError(
                        f"the tree's {src} and the other dirs qola's fixes stage hold more than "
                        f"{MAX_STAGED_TOTAL >> 20} MiB of files",
                        hint='build with [qola] fixes = "none", or move what does not belong there',
                    )
            else:
                links[sub] = os.path.abspath(e.path)
    return files, links


def _moved(path: str, meta: str, root: Path, dirs: set[str]) -> str:
    """``path`` in the overlay when it is (or lies in) one of the staged ``dirs``, else as it is."""
    norm = os.path.normpath(path)
    if norm != meta and not norm.startswith(meta + os.sep):
        return path
    rel = "" if norm == meta else os.path.relpath(norm, meta)
    if any(rel == d or not d or rel.startswith(d + os.sep) for d in dirs):
        return str(root / rel) if rel else str(root)
    return path


def _module(mod: ModulePlan, move: Callable[[str], str]) -> ModulePlan:
    """``mod`` with every path of a staged dir moved (sources, include dirs, headers, ``-I`` flags,
    absolute per-source patterns)."""

    def flag(f: str) -> str:
        return "-I" + move(f[2:]) if f.startswith("-I") and len(f) > 2 else f

    return dataclasses.replace(
        mod,
        sources=tuple(move(s) for s in mod.sources),
        include_dirs=tuple(move(d) for d in mod.include_dirs),
        headers=tuple(move(h) for h in mod.headers),
        flags_extra_cc=tuple(flag(f) for f in mod.flags_extra_cc),
        flags_extra_hip=tuple(flag(f) for f in mod.flags_extra_hip),
        per_source_flags=tuple((move(p) if os.path.isabs(p) else p, fl) for p, fl in mod.per_source_flags),
    )


def origins(plan: Plan) -> list[str]:
    """The tree's files the overlay of ``plan`` copies (every regular file of a staged dir): ninja
    tracks the copies, so a record of what a build read (the no-op path's) must name these."""
    meta = Path(os.path.normpath(plan.meta_dir))
    dirs, _above = _dirs({u.file for u in plan.fixes if u.status == fixes_mod.APPLIED})
    out = []
    for d in sorted(dirs):
        with contextlib.suppress(OSError), os.scandir(meta / d) as it:
            out += sorted(e.path for e in it if e.is_file(follow_symlinks=False))
    return out


def staged(plan: Plan, root: Path) -> Overlay:
    """The overlay of ``plan``'s applied fixes under ``root`` (``BUILD/fixed``): the moved plan, the
    entries to write, the modules that fail. Reads the tree; writes nothing."""
    failed: dict[str, str] = {}
    for use in plan.fixes:
        if use.status == fixes_mod.CHANGED:
            for m in use.modules:
                failed.setdefault(m, f"{use.note} (it fixes: {fixes_mod.by_name(use.name).why})")
    applied = [u for u in plan.fixes if u.status == fixes_mod.APPLIED]
    meta = Path(os.path.normpath(plan.meta_dir))
    fixed: dict[str, str] = {}
    for file in sorted({u.file for u in applied}):
        text = fixes_mod.read_fixed(meta, file)
        uses = [fixes_mod.by_name(u.name) for u in applied if u.file == file]
        after = None if text is None else fixes_mod.fixed_text(uses, file, text)
        want = next(u.sha256 for u in applied if u.file == file)
        if after is None or fixes_mod.sha256(after) != want:
            for u in applied:
                if u.file == file:
                    for m in u.modules:
                        failed.setdefault(
                            m, f"{file} of the tree changed after it was planned (fix {u.name}); build again"
                        )
            continue
        fixed[file] = after
    if not fixed:
        return Overlay(plan, {}, {}, (), failed)
    staged_dirs, above = _dirs(set(fixed))
    files, links = _entries(meta, fixed, staged_dirs, above)
    readers = {m for u in applied if u.file in fixed for m in u.modules}

    def move(p: str) -> str:
        return _moved(p, str(meta), root, staged_dirs)

    mods = tuple(_module(m, move) if m.name in readers else m for m in plan.modules)
    units = Readers(
        {m.name: m for m in plan.modules if m.name in readers},
        frozenset(Path(os.path.normpath(root / f)) for f in fixed),
        str(meta),
        os.path.normpath(str(root)),
    )
    dirs = tuple(sorted(staged_dirs | above))
    return Overlay(dataclasses.replace(plan, modules=mods), files, links, dirs, failed, units)


def _entry(root: Path, rel: str) -> Path:
    """``root/rel`` with its directory checked to lie in ``root`` (:func:`inside`), never its last
    part: that is the overlay's own entry (a link an earlier build made is replaced, not followed)."""
    parent, name = os.path.split(rel)
    return (inside(root, parent) if parent else root) / name


def write(ov: Overlay, root: Path) -> None:
    """Make ``root`` hold exactly the overlay (nothing when it has no entries): files written only
    when changed, links replaced only when they point elsewhere, the rest removed."""
    if not ov.files and not ov.links:
        remove(root)
        return
    wanted = set(ov.files) | set(ov.links) | {d for d in ov.dirs if d}
    root.mkdir(parents=True, exist_ok=True)
    for d in ov.dirs:  # sorted: a dir's parents first
        if d:
            p = _entry(root, d)
            if p.is_symlink() or (p.exists() and not p.is_dir()):
                remove(p)
            p.mkdir(exist_ok=True)
    for rel, data in ov.files.items():
        p = _entry(root, rel)
        if p.is_symlink() or p.is_dir():
            remove(p)
        write_if_changed(p, data)
    for rel, target in ov.links.items():
        p = _entry(root, rel)
        if p.is_symlink() and os.readlink(p) == target:
            continue
        if p.is_dir() and not p.is_symlink():
            remove(p)
        replace_symlink(p, target, p.with_name(f".{p.name}.qola-link"))
    for dirpath, dirnames, filenames in os.walk(root, topdown=True):
        rel_dir = os.path.relpath(dirpath, root)
        for name in [*dirnames, *filenames]:
            rel = name if rel_dir == "." else f"{rel_dir}/{name}"
            if rel not in wanted:
                remove(Path(dirpath) / name)
        dirnames[:] = [
            d
            for d in dirnames
            if (d if rel_dir == "." else f"{rel_dir}/{d}") in ov.dirs and not os.path.islink(os.path.join(dirpath, d))
        ]


def failures(ov: Overlay) -> Mapping[str, QolaError]:
    """Each failing module's error (:attr:`Overlay.failed`)."""
    return {
        m: QolaError(why, hint="set [qola] fixes to leave that fix out, or build a tree the fix knows")
        for m, why in ov.failed.items()
    }
