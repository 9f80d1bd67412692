"""Checks ``qola build`` makes before it writes or runs anything: numbers, directories, room.

Each failure is a :class:`~qola.core.errors.QolaError` (exit 2) naming the value, where it came from and
how to fix it. Standard library only (they run before the no-op fast path).
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Mapping
from itertools import combinations
from pathlib import Path
from typing import Any

from qola.core import inputs, owner, rules
from qola.core.errors import QolaError
from qola.output.outdir import DIRS, MANIFEST_JSON

MIN_FREE_BYTES = 64 * 1024 * 1024  # on top of the previous output's size (publish holds old and new at once)
MIN_FREE_INODES = 256
_MIB = 1024 * 1024


def _given(text: str, what: str, flag: str) -> Path:
    if not text or "\0" in text:
        raise QolaError(f"the {what} ({flag}) is empty or contains a NUL byte: {text!r}")
    return Path(os.path.abspath(os.path.expanduser(text)))


def output_dirs(output_dir: str, build_dir: str | None) -> tuple[Path, Path]:
    """(output dir, build dir), resolved: ``-o /``, an existing non-directory, and an output dir equal
    to, inside or around the build dir are refused."""
    out = Path(os.path.realpath(_given(output_dir, "output dir", "-o/--output-dir")))
    if out == Path(out.anchor):
        raise QolaError(
            f"refusing to use {out} as the output dir: qola publishes lib/, include/, … into it "
            "and removes what it published before",
            hint="pass -o with a directory of its own, e.g. -o ./out",
        )
    try:
        here: Path | None = Path(os.path.realpath(os.getcwd()))
    except OSError:  # the working directory was removed: nothing of it to keep clean
        here = None
    if not build_dir and here is not None and here.is_relative_to(out):
        raise QolaError(
            f"the output dir {out} holds the working directory, so its default build dir "
            f"({out.name}.build) would land outside it, in {out.parent}",
            hint="pass -o a directory of its own (-o out), or --build-dir DIR",
        )
    build = (
        Path(os.path.realpath(_given(build_dir, "build dir", "--build-dir")))
        if build_dir
        else out.with_name(out.name + ".build")
    )
    if build == Path(build.anchor):
        raise QolaError(
            f"refusing to use {build} as the build dir", hint="pass --build-dir with a directory of its own"
        )
    for path, what, flag in ((out, "output dir", "-o"), (build, "build dir", "--build-dir")):
        problem = rules.dir_path_problem(path)
        if problem:
            raise QolaError(f"the {what} {str(path)!r} {problem}", hint=f"pass {flag} with another directory")
        if path.exists() and not path.is_dir():
            raise QolaError(f"the {what} {path} exists and is not a directory", hint=f"pass {flag} with a directory")
    disjoint({"the output dir": out, "the build dir": build})
    owner.check_dir(build, "build dir", "--build-dir", depth=owner.SUBDIR_DEPTH)
    owner.check_dir(out, "output dir", "-o", depth=1)
    return out, build


def disjoint(dirs: Mapping[str, Path | None]) -> None:
    """Refuse any two of ``dirs`` (label -> resolved path) that are equal or nested."""
    named = [(k, Path(os.path.realpath(v))) for k, v in dirs.items() if v is not None]
    for (na, a), (nb, b) in combinations(named, 2):
        if a == b:
            raise QolaError(
                f"{na} and {nb} are the same directory: {a}",
                hint="give each its own directory (-o, --build-dir, --aiter-root)",
            )
        for (ni, i), (no, o) in (((na, a), (nb, b)), ((nb, b), (na, a))):
            if o in i.parents:
                raise QolaError(
                    f"{ni} {i} is inside {no} {o}",
                    hint="qola writes and removes files in the output and build dirs: keep them outside "
                    "the kernel tree and apart from each other (e.g. -o ../out beside the tree)",
                )


def tree_placement(
    tree: Path | None, out: Path, build_dir: Path, names: tuple[str, ...], prefixes: tuple[str, ...]
) -> None:
    """The kernel tree apart from the build dir and around neither dir; inside the output dir only
    under a name qola never writes or removes there (``names``, ``prefixes``: qola.output.outdir.OUT_NAMES),
    such as TE's ``OUT/third_party/aiter``."""
    if tree is None:
        return
    tree, out = Path(os.path.realpath(tree)), Path(os.path.realpath(out))
    disjoint({"the build dir": build_dir, "the kernel tree": tree})
    if out in tree.parents or out == tree:
        rel = tree.relative_to(out).parts
        first = rel[0] if rel else ""
        if first and first not in names and not first.startswith(prefixes):
            return
        raise QolaError(
            f"the kernel tree {tree} is inside the output dir {out} under {first!r}, a name qola writes "
            "and removes there"
            if first
            else f"the output dir and the kernel tree are the same directory: {out}",
            hint="keep the tree outside the output dir, or under a name of its own (e.g. "
            "OUT/third_party/aiter); qola publishes lib/, include/, configs/, jit/, share/, logs/, "
            "current and .qola there",
        )
    disjoint({"the output dir": out, "the kernel tree": tree})


def early_tree_root(aiter_root: str | None, manifest: str) -> Path | None:
    """The kernel tree as far as it can be known without loading qola's manifest schema:
    ``--aiter-root``, else ``[qola].aiter_root`` of a small, regular manifest file (None otherwise;
    the full check runs again after planning)."""
    if aiter_root:
        return None if "\0" in aiter_root else Path(os.path.abspath(os.path.expanduser(aiter_root)))
    try:
        path = Path(manifest)
        st = path.stat()
        if not path.is_file() or st.st_size > 1024 * 1024:
            return None
        from qola.core import tomlfile  # lazy: only without --aiter-root

        value = (
            tomlfile.loads(inputs.read_record(path, limit=1024 * 1024, what="manifest"))
            .get("qola", {})
            .get("aiter_root")
        )
    except (OSError, ValueError, UnicodeDecodeError, AttributeError, RecursionError):
        return None
    # relative to the manifest's directory as named (qola.commands.common.tree_root does the same)
    ok = isinstance(value, str) and value and "\0" not in value
    return Path(os.path.abspath(path)).parent / value if ok else None


def _existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _size(root: Path) -> int:
    total = 0
    if root.is_dir():
        for dirpath, _dirs, files in os.walk(root):
            for name in files:
                with contextlib.suppress(OSError):
                    total += os.lstat(os.path.join(dirpath, name)).st_size
    return total


def _size_file(path: Path) -> int:
    try:
        return os.lstat(path).st_size
    except OSError:
        return 0


def writable(dirs: Mapping[str, tuple[Path, str]]) -> None:
    """Each directory (label -> (path, its option)), or the nearest existing directory above it
    (where it will be created), must be a writable directory."""
    for what, (path, flag) in dirs.items():
        at = _existing(path)
        if not at.is_dir():
            raise QolaError(f"cannot create {what} {path}: {at} is not a directory", hint=f"pass {flag} elsewhere")
        if not os.access(at, os.W_OK | os.X_OK):
            why = "a read-only file system" if _read_only(at) else "no write permission"
            raise QolaError(
                f"{what} {path} is not writable ({why} at {at})",
                hint=f"choose a writable directory ({flag}), or fix the permissions",
            )


def room(out: Path, build_dir: Path, min_free: int = MIN_FREE_BYTES) -> None:
    """The output and build dirs' file systems must have room: ``min_free`` each plus, for the
    output dir, the size of what is there now (publishing holds the old and the new output; only
    qola's own entries count: a kernel tree kept in OUT is not qola's output).
    Both on one file system need the sum."""
    # what the new version will roughly take: the published entries (OUT/.qola/prev is removed
    # before staging; a kernel tree kept inside OUT is not qola's)
    previous = sum(_size(out / d) for d in DIRS) + _size_file(out / MANIFEST_JSON)
    by_fs: dict[int, dict[str, Any]] = {}
    for path, what, extra in ((out, "the output dir", previous), (build_dir, "the build dir", 0)):
        at = _existing(path)
        try:
            st, dev = os.statvfs(at), os.stat(at).st_dev
        except OSError as exc:
            raise QolaError(f"cannot check free space for {what} at {at}: {exc.strerror or exc}") from None
        fs = by_fs.setdefault(dev, {"need": 0, "at": at, "st": st, "what": [], "previous": 0})
        fs["need"] += min_free + extra
        fs["previous"] += extra
        fs["what"].append(f"{what} {path}")
    for fs in by_fs.values():
        st = fs["st"]
        free, inodes = st.f_bavail * st.f_frsize, st.f_favail
        few_inodes = bool(st.f_files) and inodes < MIN_FREE_INODES
        if free >= fs["need"] and not few_inodes:
            continue
        shown = f"{free / _MIB:.0f} MiB" + (f" and {inodes} inodes" if few_inodes else "")
        kept = (
            (f" (the output there now takes {fs['previous'] / _MIB:.0f} MiB, kept until the new one is published)")
            if fs["previous"]
            else ""
        )
        raise QolaError(
            f"not enough free space for {' and '.join(fs['what'])}: {shown} free on the file system of "
            f"{fs['at']}, at least {fs['need'] / _MIB:.0f} MiB needed{kept}",
            hint="free some space, or build into a directory on another file system (-o, --build-dir)",
        )


def _read_only(path: Path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError as exc:
        return exc.errno == errno.EROFS
