"""The file-system primitives every qola writer goes through.

* :func:`inside` — the one way to build a path from a root and names that came from input (module
  keys, ``md_name``, OUT-relative paths): absolute parts, ``..``, NUL and empty names are refused,
  and the resolved result (symlinks followed) must stay under the resolved root;
* :func:`atomic_write` / :func:`atomic_copy` / :func:`write_if_changed` — temp file in the same
  directory, fsync, ``rename``: a reader (or a SIGKILL) sees the old or the new file, never half;
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
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

from qola.errors import QolaError

_HINT = "names from the manifest or the module table must not hold '/', '..', or NUL"


def _refuse(root: Path, shown: str, why: str) -> QolaError:
    return QolaError(f"refusing to write {shown!r} under {root}: {why}", hint=_HINT)


def inside(root: str | os.PathLike, *parts: str | os.PathLike) -> Path:
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


def fsync_dir(path: str | os.PathLike) -> None:
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


def _temp_beside(path: Path) -> tuple[int, str]:
    return tempfile.mkstemp(prefix=f".{path.name}.tmp-{os.getpid()}-", dir=path.parent)


def _publish_temp(path: Path, fill, mode: int) -> Path:
    """Create a temp file beside ``path``, let ``fill(fh)`` write it, fsync, chmod ``mode`` and
    rename it over ``path``; the temp never survives a failure."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _temp_beside(path)
    try:
        with os.fdopen(fd, "wb") as fh:
            fill(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def atomic_write(path: str | os.PathLike, data: bytes, mode: int | None = None) -> Path:
    """Write ``data`` to a temp name beside ``path``, fsync, rename: readers see the old or the new
    file. ``mode`` (default 0644) is set before the rename."""
    return _publish_temp(Path(path), lambda fh: fh.write(data), 0o644 if mode is None else mode)


def atomic_copy(src: str | os.PathLike, dst: str | os.PathLike) -> Path:
    """Copy ``src`` (its bytes and permission bits) to ``dst`` by temp + fsync + rename."""
    src = Path(src)

    def fill(fh) -> None:
        with open(src, "rb") as inp:
            shutil.copyfileobj(inp, fh, 1 << 20)

    return _publish_temp(Path(dst), fill, os.stat(src).st_mode & 0o777)


def write_if_changed(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` to ``path`` (atomically) unless it already holds exactly that: unchanged files
    keep their mtime, so ninja does not rebuild what depends on them."""
    path = Path(path)
    try:
        if path.read_text(encoding="utf-8") == text:
            return path
    except (OSError, UnicodeDecodeError):
        pass
    return atomic_write(path, text.encode("utf-8"))


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
def pid_tempdir(prefix: str, parent: str | os.PathLike | None = None) -> Iterator[str]:
    """A private temp dir named ``<prefix><pid>-<random>`` (removed at exit): if this process is
    killed, :func:`remove_stale` on ``parent`` (default: the system temp dir) removes it later."""
    path = tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=parent)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def stale_entries(parent: str | os.PathLike, prefix: str) -> list[Path]:
    """Entries of ``parent`` named ``<prefix><pid>`` or ``<prefix><pid>-…``, owned by this user,
    whose process is gone (never followed through symlinks)."""
    pattern = re.compile(re.escape(prefix) + r"(\d+)(?:-|\Z)")
    found = []
    try:
        entries = list(os.scandir(parent))
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
        if not pid_alive(int(m.group(1))):
            found.append(Path(entry.path))
    return sorted(found)


def remove(path: str | os.PathLike) -> None:
    """Remove a file, a symlink (never its target) or a directory tree; absent is fine."""
    path = Path(path)
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def remove_stale(parent: str | os.PathLike, prefix: str) -> list[Path]:
    """Remove :func:`stale_entries` of ``parent``; the paths removed."""
    gone = stale_entries(parent, prefix)
    for path in gone:
        remove(path)
    return gone


def replace_tree(path: str | os.PathLike, files: Iterable[tuple[str, bytes]]) -> Path:
    """Make the directory ``path`` hold exactly ``files`` ((relative path, bytes)): they are written
    into a staging dir beside it (``.<name>.stage-<pid>``), which then replaces ``path`` by rename
    (the old tree is moved aside to ``.<name>.old-<pid>`` and removed). Relative paths go through
    :func:`inside`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    stage, old = path.parent / f".{path.name}.stage-{os.getpid()}", path.parent / f".{path.name}.old-{os.getpid()}"
    remove(stage)
    stage.mkdir()
    try:
        for rel, data in files:
            dst = inside(stage, rel)
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.write_bytes(data)
        remove(old)
        if os.path.lexists(path):
            os.replace(path, old)
        os.replace(stage, path)
    finally:
        remove(stage)
        remove(old)
    return path
