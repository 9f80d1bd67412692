"""qola's local compile cache (:mod:`qola.compile.cache_launch` serves and fills it, one compile at a
time): where it lives, the launcher a build puts in front of its compiles (:func:`prepare`), its
size kept under a cap after each build (:func:`trim`), and ``qola cache show | clean``.

The cache dir (``QOLA_CACHE_DIR``, else ``$XDG_CACHE_HOME/qola/cc``, else ``~/.cache/qola/cc``) must be
a directory of the user's, not writable by group or others — the JIT cache's rule
(:func:`qola.jit.cache.check_private_dir` is the same check): a build refuses another one, naming it.
It is on by default for a local build without a launcher of the user's (``--launcher sccache`` is
that user's cache); ``--no-cache`` (or ``QOLA_NO_CACHE=1``) builds without it, and a dry run, a
``--dist`` or ``--remote`` build and ``qola audit --reproduce`` never use it. Hits and misses go to
the progress line and the build's notes, never to ``manifest.json``: the output is the same bytes
whether a unit was compiled or taken.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from qola.compile import tally
from qola.compile.cache_launch import ACTIONS, FORMAT, OBJECTS, WRAPPERS
from qola.core import knobs
from qola.core.errors import QolaError
from qola.core.fsutil import atomic_write, remove
from qola.core.owner import private_problem
from qola.core.selfrun import launcher_script
from qola.toolchain.identity import COMPILER_ENV

if TYPE_CHECKING:
    from qola.toolchain import Toolchain

ENV_DIR, ENV_MAX, ENV_OFF = "QOLA_CACHE_DIR", "QOLA_CACHE_MAX_GB", "QOLA_NO_CACHE"
DEFAULT_MAX_GB = 20.0
HINT = f"set {ENV_DIR} to a directory of your own, or build with --no-cache"


def default_dir(env: Mapping[str, str]) -> Path:
    """``QOLA_CACHE_DIR``, else ``$XDG_CACHE_HOME/qola/cc`` (absolute only), else ``~/.cache/qola/cc``."""
    if env.get(ENV_DIR, "").strip():
        return Path(os.path.abspath(env[ENV_DIR]))
    xdg = env.get("XDG_CACHE_HOME", "")
    base = Path(xdg) if os.path.isabs(xdg) else Path(env.get("HOME") or os.path.expanduser("~")) / ".cache"
    return base / "qola" / "cc"


def max_bytes(env: Mapping[str, str]) -> int:
    """The size cap: ``QOLA_CACHE_MAX_GB`` (checked before any command works:
    (:func:`qola.core.knobs.check_environment`), else :data:`DEFAULT_MAX_GB`."""
    gb = knobs.cache_gb(env.get(ENV_MAX, "")) or DEFAULT_MAX_GB
    return int(gb * (1 << 30))


def check_dir(path: Path) -> None:
    """Make ``path`` (0700) or check it: a directory (not a link) of the user's, not writable by group
    or others; else a QolaError naming it."""
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = os.lstat(path)
    except OSError as exc:
        raise QolaError(f"cannot use the compile cache dir {path}: {exc.strerror}", hint=HINT) from None
    problem = "a link (not followed)" if stat.S_ISLNK(st.st_mode) else (private_problem(st) or ("", ""))[1]
    if problem:
        raise QolaError(f"refusing the compile cache dir {path}: it is {problem}", hint=HINT)


@dataclass(frozen=True)
class CacheUse:
    """A build's compile cache: its dir and size cap."""

    dir: Path
    max_bytes: int


def wanted(env: Mapping[str, str], off: bool) -> CacheUse | None:
    """The cache a local build uses (None: ``--no-cache`` / ``QOLA_NO_CACHE``)."""
    if off:
        return None
    return CacheUse(default_dir(env), max_bytes(env))


def prepare(use: CacheUse, tc: Toolchain, build_dir: Path, tree_root: str, env: Mapping[str, str]) -> str:
    """The cache dir checked, the launcher's config and script written into ``<build>/cache/``; the
    script's path (ninja puts it in front of every compile)."""
    from qola.store.remote import toolchain_id  # lazy: the compiler's identity, as the remote path keys it

    check_dir(use.dir)
    work = build_dir / "cache"
    work.mkdir(parents=True, exist_ok=True)
    cfg = {
        "dir": str(use.dir),
        "tree": _spellings(tree_root),
        "build": _spellings(build_dir),
        "qola": _spellings(Path(__file__).resolve().parents[1]),  # qola's runtime headers on the lines
        "compiler_id": toolchain_id(tc, env),
        "env": list(COMPILER_ENV),
        "work": str(work.resolve()),
    }
    atomic_write(work / "config.json", json.dumps(cfg, indent=1, sort_keys=True).encode())
    script = launcher_script("qola.compile.cache_launch", str(work / "config.json"))
    atomic_write(work / "cc", script.encode(), mode=0o755)
    (work / tally.NAME).unlink(missing_ok=True)
    return str(work / "cc")


def _spellings(path: str | os.PathLike[str]) -> list[str]:
    """``path`` as given (absolute) and resolved: a compile line may spell either."""
    return list(dict.fromkeys((os.path.abspath(path), os.path.realpath(path))))


@dataclass(frozen=True)
class Contents:
    dir: Path
    actions: int
    objects: int
    bytes: int
    wrappers: int

    def to_json(self) -> dict[str, object]:
        return {
            "dir": str(self.dir),
            "actions": self.actions,
            "objects": self.objects,
            "bytes": self.bytes,
            "wrappers": self.wrappers,
        }


def _files(top: Path) -> list[tuple[int, int, Path]]:
    """(mtime_ns, size, path) of every regular file under ``top`` (links neither followed nor counted)."""
    out = []
    for dirpath, dirnames, filenames in os.walk(top):
        dirnames[:] = [d for d in dirnames if not os.path.islink(os.path.join(dirpath, d))]
        for name in filenames:
            st = os.lstat(os.path.join(dirpath, name))
            if stat.S_ISREG(st.st_mode):
                out.append((st.st_mtime_ns, st.st_size, Path(dirpath, name)))
    return out


def contents(path: Path) -> Contents:
    top = path / FORMAT
    objs, acts = _files(top / OBJECTS), _files(top / ACTIONS)
    actions = len({p.parent for _, _, p in acts})
    wrappers = len(_files(top / WRAPPERS))
    return Contents(path, actions, len(objs), sum(s for _, s, _ in objs + acts), wrappers)


def trim(use: CacheUse) -> int:
    """Past its cap, remove the least recently used objects until the cache holds at most 90 % of it
    (a candidate whose object is gone is a miss, removed when met); the bytes removed."""
    objs = sorted(_files(use.dir / FORMAT / OBJECTS))
    total = sum(s for _, s, _ in objs)
    freed = 0
    if total > use.max_bytes:
        for _, size, p in objs:
            if total - freed <= use.max_bytes * 9 // 10:
                break
            p.unlink(missing_ok=True)
            freed += size
    return freed


def clean(path: Path) -> Contents:
    """Empty the cache (``qola cache clean``); what it held."""
    check_dir(path)
    held = contents(path)
    remove(path / FORMAT)
    return held
