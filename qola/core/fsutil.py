"""The file-system primitives every qola writer goes through.

* :func:`inside` — the one way to build a path from a root and names that came from input (module
  keys, ``md_name``, OUT-relative paths): absolute parts, ``..``, NUL and empty names are refused,
  and the resolved result (symlinks followed) must stay under the resolved root;
* :func:`atomic_write` / :func:`atomic_stream` / :func:`atomic_copy` / :func:`write_if_changed` — temp file
  in the same directory, fsync, ``rename``: a reader (or a SIGKILL) sees the old or the new file, never half;
  :func:`commit` publishes a temp someone else wrote (a compiler's output), :func:`replace_dir`
  swaps a staged directory in, :func:`sync_dir` brings a directory to a staged one's content file by
  file (unchanged files keep their mtime); :func:`exchange` swaps two paths in one step
  (``renameat2(RENAME_EXCHANGE)``) where the file system offers it; :func:`copy_file` copies a
  file's bytes (a reflink or an in-kernel copy where offered, never a hard link), fsynced;
* :func:`pid_tempdir`, :func:`stale_entries`, :func:`remove_stale` — temporary names that carry
  their owner's pid (``<prefix><pid>…``), so what a killed run left behind can be told from what a
  live one is using, and removed on the next run.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

from qola.core.errors import QolaError

_HINT = "names from the manifest or the module table must not hold '/', '..', or NUL"


def _refuse(root: Path, shown: str, why: str) -> QolaError:
    return QolaError(f"refusing to write {shown!r} under {root}: {why}", hint=_HINT)


def inside(root: str | os.PathLike[str], *parts: str | os.PathLike[str]) -> Path:
    """``root / parts…``, proven to stay under ``root``. Each part may hold several ``/``-separated
    names; an absolute part, a ``..`` or empty name, a NUL, or a result whose resolved path (symlinks
    followed) leaves the resolved root raises :class:`QolaError`. ``root`` need not exist yet."""
    root = Path(root)
    names: list[str] = []
    for part in parts:
        text = os.fspath(part)
        if not isinstance(text, str):
            raise _refuse(root, repr(text), "not a text path")
        if "\0" in text:
            raise _refuse(root, text, "it holds a NUL byte")
        if os.path.isabs(text):
            raise _refuse(root, text, "it is an absolute path")
        for name in text.split("/"):
            if name in ("", "."):
                continue
            if name == "..":
                raise _refuse(root, text, "it climbs out with '..'")
            names.append(name)
        if not text.strip("/."):
            raise _refuse(root, text, "it names no file")
    path = root.joinpath(*names)
    real_root, real = os.path.realpath(root), os.path.realpath(path)
    if real != real_root and not real.startswith(real_root.rstrip(os.sep) + os.sep):
        raise _refuse(root, "/".join(names), f"it resolves to {real}, outside {real_root}")
    return path


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Make a rename in ``path`` durable (best effort: not every file system allows it)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _temp_beside(path: Path, prefix: str | None = None) -> tuple[int, str]:
    return tempfile.mkstemp(prefix=prefix or f".{path.name}.tmp-{os.getpid()}-", dir=path.parent)


def _publish_temp(
    path: Path, fill: Callable[[BinaryIO], object], mode: int, temp_prefix: str | None = None, sync_dir: bool = False
) -> Path:
    """Create a temp file beside ``path``, let ``fill(fh)`` write it, fsync, chmod ``mode`` and
    rename it over ``path`` (then fsync the directory with ``sync_dir``); the temp never survives a
    failure."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _temp_beside(path, temp_prefix)
    try:
        with os.fdopen(fd, "wb") as fh:
            fill(fh)
            fh.flush()
            os.fchmod(fh.fileno(), mode)
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError) and exc.filename is None:  # ENOSPC from write or fsync names no file
            raise OSError(exc.errno, exc.strerror, str(path)) from exc
        raise
    if sync_dir:
        fsync_dir(path.parent)
    return path


def atomic_write(
    path: str | os.PathLike[str],
    data: bytes,
    mode: int | None = None,
    *,
    temp_prefix: str | None = None,
    sync_dir: bool = False,
) -> Path:
    """Write ``data`` to a temp name beside ``path``, fsync, rename: readers see the old or the new
    file. ``mode`` (default 0644) is set before the rename. ``temp_prefix``: the temp file's name
    prefix where a format fixes it (the JIT cache's ``.tmp-<name>-``; default
    ``.<name>.tmp-<pid>-``). ``sync_dir``: also fsync the directory, so the rename survives a crash."""
    return _publish_temp(Path(path), lambda fh: fh.write(data), 0o644 if mode is None else mode, temp_prefix, sync_dir)


def atomic_stream(path: str | os.PathLike[str], fill: Callable[[BinaryIO], object], mode: int | None = None) -> Path:
    """Like :func:`atomic_write` for content too large to hold: ``fill(fh)`` writes it to the temp
    file (a prebuilt archive); fsync, rename, fsync the directory."""
    return _publish_temp(Path(path), fill, 0o644 if mode is None else mode, sync_dir=True)


def atomic_copy(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> Path:
    """Copy ``src`` (its bytes and permission bits) to ``dst`` by temp + fsync + rename."""
    src = Path(src)

    def fill(fh: BinaryIO) -> None:
        with open(src, "rb") as inp:
            shutil.copyfileobj(inp, fh, 1 << 20)

    return _publish_temp(Path(dst), fill, os.stat(src).st_mode & 0o777)


def write_if_changed(path: str | os.PathLike[str], data: str | bytes, mode: int | None = None) -> Path:
    """Write ``data`` (text is UTF-8) to ``path`` atomically unless it already holds exactly those
    bytes: an unchanged file keeps its mtime, so ninja does not rebuild what depends on it. With
    ``mode``, an unchanged file whose permission bits differ only gets them set."""
    path = Path(path)
    raw = data.encode("utf-8") if isinstance(data, str) else data
    try:
        st = os.stat(path)
        if st.st_size == len(raw) and path.read_bytes() == raw:
            if mode is not None and (st.st_mode & 0o7777) != mode:
                os.chmod(path, mode)
            return path
    except OSError:
        pass
    return atomic_write(path, raw, mode)


def append_text(path: str | os.PathLike[str], text: str) -> Path:
    """Append ``text`` (UTF-8, unencodable characters replaced) to the log ``path``, its directory
    made when missing: the one append (a child's log grows as the children run, never rewritten)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8", errors="replace") as fh:
        fh.write(text)
    return path


def commit(tmp: str | os.PathLike[str], path: str | os.PathLike[str]) -> Path:
    """Publish a finished temp file or directory ``tmp`` (in ``path``'s directory) as ``path``:
    fsync it, rename (replacing a file, or an absent/empty directory), fsync the directory."""
    fd = os.open(tmp, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(Path(path).parent)
    return Path(path)


def replace_dir(stage: str | os.PathLike[str], final: str | os.PathLike[str]) -> Path:
    """Swap the finished directory ``stage`` in as ``final`` (same parent): the old ``final`` is
    renamed aside (``.<name>.old-<pid>``, which :func:`remove_stale` recognises if this process
    dies), ``stage`` renamed in, the old tree removed. A reader sees the old or the new tree, never
    a mixture (between the two renames, briefly, none)."""
    stage, final = Path(stage), Path(final)
    aside = final.with_name(f"{old_prefix(final.name)}{os.getpid()}")
    remove(aside)
    if os.path.lexists(final):
        os.replace(final, aside)
    os.replace(stage, final)
    fsync_dir(final.parent)
    remove(aside)
    return final


def _same_file(src: str, dst: str) -> bool:
    """Whether the regular file ``dst`` holds ``src``'s bytes (its permission bits made ``src``'s)."""
    try:
        s, d = os.lstat(src), os.lstat(dst)
        if not (stat.S_ISREG(s.st_mode) and stat.S_ISREG(d.st_mode)) or s.st_size != d.st_size:
            return False
        with open(src, "rb") as a, open(dst, "rb") as b:
            while True:
                x, y = a.read(1 << 20), b.read(1 << 20)
                if x != y:
                    return False
                if not x:
                    break
        if (d.st_mode & 0o7777) != (s.st_mode & 0o7777):
            os.chmod(dst, s.st_mode & 0o7777)
    except OSError:
        return False
    return True


def sync_dir(stage: str | os.PathLike[str], final: str | os.PathLike[str]) -> tuple[int, int, int]:
    """Make the directory ``final`` hold exactly what the finished directory ``stage`` (same parent)
    holds, consuming ``stage``: a file whose bytes did not change is left alone (it keeps its inode
    and mtime, so ninja rebuilds nothing from it), a new or changed one is renamed in (a reader sees
    the old file or the new one), one ``stage`` lacks is removed. ``final`` absent: ``stage`` is
    renamed to it. Not atomic as a whole: a caller that must notice an interrupted sync removes its
    own completion record first (codegen's stamp). Returns (files renamed in, kept, removed)."""
    stage, final = Path(stage), Path(final)
    if final.is_symlink() or not final.is_dir():
        remove(final)
        count = sum(len(files) for _, _, files in os.walk(stage))
        os.replace(stage, final)
        fsync_dir(final.parent)
        return count, 0, 0
    staged: set[str] = set()
    changed = kept = removed = 0
    for dirpath, dirnames, filenames in os.walk(stage):
        rel_dir = os.path.relpath(dirpath, stage)
        rel_dir = "" if rel_dir == "." else rel_dir
        dst_dir = os.path.join(final, rel_dir)
        if rel_dir:
            staged.add(rel_dir)
            if os.path.islink(dst_dir) or (os.path.lexists(dst_dir) and not os.path.isdir(dst_dir)):
                remove(dst_dir)
            os.makedirs(dst_dir, exist_ok=True)
        links = [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]
        dirnames[:] = [d for d in dirnames if d not in links]
        for name in (*filenames, *links):
            rel = os.path.join(rel_dir, name)
            staged.add(rel)
            src, dst = os.path.join(dirpath, name), os.path.join(dst_dir, name)
            if _same_file(src, dst):
                kept += 1
                continue
            if os.path.isdir(dst) and not os.path.islink(dst):
                remove(dst)
            os.replace(src, dst)
            changed += 1
    for dirpath, dirnames, filenames in os.walk(final, topdown=False):
        rel_dir = os.path.relpath(dirpath, final)
        rel_dir = "" if rel_dir == "." else rel_dir
        for name in (*filenames, *(d for d in dirnames if os.path.islink(os.path.join(dirpath, d)))):
            if os.path.join(rel_dir, name) not in staged:
                os.unlink(os.path.join(dirpath, name))
                removed += 1
        for name in dirnames:
            rel, path = os.path.join(rel_dir, name), os.path.join(dirpath, name)
            if rel not in staged and not os.path.islink(path):
                remove(path)
    if changed or removed:
        fsync_dir(final)
    remove(stage)
    return changed, kept, removed


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100
_renameat2: list[Any] = []  # [the libc function or None], looked up on first use


def _libc_renameat2() -> Any:
    if not _renameat2:
        fn = None
        try:
            import ctypes  # lazy: paid only by the callers that need it
            import ctypes.util  # lazy: paid only by the callers that need it

            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            fn = libc.renameat2
            fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
            fn.restype = ctypes.c_int
        except (OSError, AttributeError):
            fn = None
        _renameat2.append(fn)
    return _renameat2[0]


def exchange(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    """Swap the existing paths ``a`` and ``b`` (files, dirs or symlinks, same file system) in one
    step: ``renameat2(RENAME_EXCHANGE)``, so every reader sees one or the other at each name, never
    neither. False (nothing changed) where libc or the file system lacks it; other errors raise."""
    fn = _libc_renameat2()
    if fn is None:
        return False
    import ctypes  # lazy: paid only by the callers that need it

    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EPERM):
        return False  # EPERM: some file systems (and seccomp policies) refuse the flag this way
    raise OSError(err, os.strerror(err), os.fspath(a), None, os.fspath(b))


_FICLONE = 0x40049409


def copy_file(src: str | os.PathLike[str], dst: str | os.PathLike[str], mode: int) -> None:
    """Copy ``src``'s bytes to the new file ``dst`` (created exclusively, permission bits ``mode``),
    fsynced: a reflink (``FICLONE``) where the file system shares extents, else ``copy_file_range``
    (in-kernel), else a plain copy. Never a hard link: editing one copy never changes the other."""
    with open(src, "rb") as inp, open(dst, "xb") as out:
        done = False
        try:
            import fcntl  # lazy: paid only by the callers that need it

            fcntl.ioctl(out.fileno(), _FICLONE, inp.fileno())
            done = True
        except OSError:
            pass
        if not done:
            size, off = os.fstat(inp.fileno()).st_size, 0
            try:
                while off < size:
                    n = os.copy_file_range(inp.fileno(), out.fileno(), size - off, off, off)
                    if n == 0:
                        break
                    off += n
                done = off == size
            except (OSError, AttributeError):
                done = False
            if not done:
                out.seek(0)
                out.truncate()
                inp.seek(0)
                shutil.copyfileobj(inp, out, 1 << 20)
        os.fchmod(out.fileno(), mode)
        out.flush()
        os.fsync(out.fileno())


def replace_symlink(path: str | os.PathLike[str], target: str, tmp: str | os.PathLike[str]) -> Path:
    """Make ``path`` a symlink to ``target`` with one rename: the new link is created as ``tmp``
    (beside ``path``; removed on failure) and renamed over whatever ``path`` was."""
    remove(tmp)
    os.symlink(target, tmp)
    try:
        os.replace(tmp, path)
    except OSError:
        remove(tmp)
        raise
    return Path(path)


def old_prefix(name: str) -> str:
    """Prefix of the aside name :func:`replace_dir` gives an old ``name`` (then the pid)."""
    return f".{name}.old-"


# -- pid-tagged temporaries ---------------------------------------------------------------------


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (one owned by another user counts as alive)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError as exc:
        return exc.errno != errno.ESRCH
    return True


@contextlib.contextmanager
def pid_tempdir(prefix: str, parent: str | os.PathLike[str] | None = None) -> Iterator[str]:
    """A private temp dir named ``<prefix><pid>-<random>`` (removed at exit): if this process is
    killed, :func:`remove_stale` on ``parent`` (default: the system temp dir) removes it later."""
    path = tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=parent)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def stale_entries(parent: str | os.PathLike[str], prefix: str | re.Pattern[str]) -> list[Path]:
    """Entries of ``parent`` named ``<prefix><pid>`` or ``<prefix><pid>-…`` (or matching the
    pattern ``prefix``, whose ``pid`` group is the pid), owned by this user, whose process is gone
    (never followed through symlinks)."""
    pattern = prefix if isinstance(prefix, re.Pattern) else re.compile(re.escape(prefix) + r"(?P<pid>\d+)(?:-|\Z)")
    found = []
    try:
        entries = list(os.scandir(os.fspath(parent)))
    except OSError:
        return []
    for entry in entries:
        m = pattern.match(entry.name)
        if not m:
            continue
        try:
            if entry.stat(follow_symlinks=False).st_uid != os.geteuid():
                continue
        except OSError:
            continue
        if not pid_alive(int(m.group("pid"))):
            found.append(Path(entry.path))
    return sorted(found)


def remove(path: str | os.PathLike[str]) -> None:
    """Remove a file, a symlink (never its target) or a directory tree; absent is fine."""
    path = Path(path)
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def remove_stale(parent: str | os.PathLike[str], prefix: str | re.Pattern[str]) -> list[Path]:
    """Remove :func:`stale_entries` of ``parent``; the paths removed."""
    gone = stale_entries(parent, prefix)
    for path in gone:
        remove(path)
    return gone


def stage_prefix(name: str) -> str:
    """Prefix of the staging dir :func:`replace_tree` writes ``name`` into (then the pid)."""
    return f".{name}.stage-"


_TREE_LEFTOVER = re.compile(r"\.(.+)\.(?:stage|old)-(?P<pid>\d+)\Z")


def remove_stale_trees(parent: str | os.PathLike[str]) -> list[Path]:
    """Remove what killed :func:`replace_tree`/:func:`replace_dir` runs left in ``parent``
    (``.<name>.stage-<pid>``, ``.<name>.old-<pid>`` of a dead process, owned by this user)."""
    return remove_stale(parent, _TREE_LEFTOVER)


def replace_tree(path: str | os.PathLike[str], files: Iterable[tuple[str, bytes]]) -> Path:
    """Make the directory ``path`` hold exactly ``files`` ((relative path, bytes)): they are written
    into a staging dir beside it (:func:`stage_prefix`), which then replaces ``path``
    (:func:`replace_dir`). Relative paths go through :func:`inside`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    stage = path.parent / f"{stage_prefix(path.name)}{os.getpid()}"
    remove(stage)
    stage.mkdir()
    try:
        for rel, data in files:
            dst = inside(stage, rel)
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.write_bytes(data)
        replace_dir(stage, path)
    finally:
        remove(stage)
    return path
