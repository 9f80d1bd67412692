"""A generator's ``--list_blobs`` listing, cached by what the generator read (issues 34 and 41), so
a second ``qola plan`` (and a build's plan step) does not rerun every CK generator: TE's manifest at
AITER 7a24cd87 planned in 16 s, nearly all of it CK's ``generate.py --list_blobs``.

An entry is found by :func:`key_of`, a sha256 of the command as run (interpreter, wrapper, script
and its arguments, the filter; the temp paths left out) and the interpreter's file; it holds the
listing and the run's depfile (:class:`qola.plan.genread.Deps`: the files, modules, directories and
variables the generator read). :func:`load` returns the listing only while those still hold; a
changed input is a miss: the listing runs again and the entry is rewritten. A run with no depfile
(it started another program, :mod:`qola.plan.genread`) is not cached. The plan's tree is held by
place (:class:`qola.plan.genread.Place`: its root hidden in the command, the files and the variables),
so a copy of the tree elsewhere (a CI job's new workspace, a pip build's temp dir) takes the entry
when what its generator reads there holds the same bytes (a copy's new mtimes: hashed).

The cache is a directory of qola's own (``$XDG_CACHE_HOME/qola/listings``, else
``~/.cache/qola/listings``, :func:`cache_dir`), one JSON file per key, written atomically
(:func:`qola.core.fsutil.atomic_write`, mode 0600). Another user, or a process of this user's that
went wrong, may have written into it: the directory is used only when it is a real directory of
this user's that no one else may write into, and an entry is trusted only when it is a regular file
(not followed through a link) of this user's, not group- or world-writable, at most
:data:`MAX_ENTRY` bytes, valid JSON naming its own key and holding a list of plain stems. Anything
else is a miss (the generator runs and the entry is rewritten); the cache never fails a plan.

One listing at a time per key (:func:`single_flight`): a second qola listing the same command while a
first runs it (two builds of one manifest, test workers planning the same tree) waits for the first's
entry instead of running the generator beside it — CK's backward generator takes a minute of CPU.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import stat
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from qola.core import inputs
from qola.core.errors import QolaError
from qola.core.fsutil import atomic_write
from qola.plan import genread

SUBDIR = ("qola", "listings")  # under $XDG_CACHE_HOME, else ~/.cache
MAX_ENTRY = 16 << 20  # bytes of one cached listing (CK's largest, bwd: ~15,000 names, under 2 MiB)
FORMAT = 3  # 2: entries hold the run's depfile (issue 41); 3: the tree's root by place (genread.TREE)


def cache_dir(env: Mapping[str, str]) -> str | None:
    """Where listings are cached: ``$XDG_CACHE_HOME/qola/listings`` (an absolute one), else
    ``$HOME/.cache/qola/listings``; None (no cache) without either."""
    xdg = env.get("XDG_CACHE_HOME", "")
    base = xdg if os.path.isabs(xdg) else os.path.join(env["HOME"], ".cache") if env.get("HOME") else ""
    return os.path.join(base, *SUBDIR) if os.path.isabs(base) else None


def key_of(argv: Sequence[str], place: genread.Place | None = None) -> str | None:
    """The key of a listing run as ``argv`` (``[python, wrapper?, script, args…]``, temp paths as
    placeholders; ``place``: the tree's root in them hidden, so a copy of the tree elsewhere finds
    the entry and its depfile decides); None when it cannot be told (the interpreter gone: not cached)."""
    try:
        st = os.stat(argv[0])
    except OSError:
        return None
    payload = {
        "format": FORMAT,
        "argv": [place.value(a) for a in argv] if place is not None else list(argv),
        "python": [os.path.realpath(argv[0]), st.st_size, st.st_mtime_ns],
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def _private_dir(path: str) -> bool:
    """``path`` is a real directory of this user's that no one else may write into."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o022


def _entry(directory: str, key: str) -> str:
    return os.path.join(directory, f"{key}.json")


@contextlib.contextmanager
def single_flight(directory: str, key: str, what: str) -> Iterator[None]:
    """Hold ``key``'s lock (``<key>.lock`` in the cache dir: :func:`qola.core.lock.holding`) while its
    listing is looked up, run and stored: another qola listing the same key waits for this one's entry,
    saying so. ``what``: the command, for that message. Best effort, as the cache: without a private
    cache dir, or where the lock file cannot be opened, the listing runs unlocked."""
    from qola.core.lock import holding  # lazy: only a plan that lists pays for it

    if not _private_dir(directory):
        yield
        return
    with holding(Path(directory) / f"{key}.lock", f"the listing of `{what}` another qola is running"):
        yield


def load(directory: str, key: str, env: Mapping[str, str], place: genread.Place | None = None) -> list[str] | None:
    """The cached listing of ``key`` while what it read holds under ``env`` (the environment the
    listing runs under) and ``place`` (where the tree lies now), or None (absent, changed, or not to
    be trusted: see the module)."""
    if not _private_dir(directory):
        return None
    try:  # the one checked open: no link followed, a regular file of ours, not g/o-writable, bounded
        data = inputs.read_checked(
            _entry(directory, key), limit=MAX_ENTRY, what="listing cache entry", follow=False, trusted=True
        )
    except (OSError, QolaError):  # absent, a link, not ours, too large: a miss, never an error
        return None
    try:
        doc = json.loads(data)
    except ValueError:
        return None
    stems = doc.get("stems") if isinstance(doc, dict) and doc.get("key") == key else None
    if not isinstance(stems, list) or not all(_plain(s) for s in stems):
        return None
    deps = genread.Deps.from_json(doc.get("deps"))
    if deps is not None and place is not None:
        deps = deps.shown(place)
    return stems if deps is not None and genread.unchanged(deps, env, place) else None


_NOT_PLAIN = re.compile("[/\0\n\r]")


def _plain(stem: object) -> bool:
    return isinstance(stem, str) and bool(stem) and not _NOT_PLAIN.search(stem) and stem not in (".", "..")


def store(
    directory: str, key: str, stems: Sequence[str], deps: genread.Deps, place: genread.Place | None = None
) -> None:
    """Record ``stems`` under ``key`` with what the run read (``place``: the tree's root hidden; best
    effort: a cache that cannot be written is no error)."""
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
    except OSError as exc:
        if exc.errno != errno.EEXIST:
            return
    if not _private_dir(directory) or not all(_plain(s) for s in stems):
        return
    held = deps.hidden(place) if place is not None else deps
    data = json.dumps({"key": key, "stems": list(stems), "deps": held.to_json()}).encode()
    try:
        atomic_write(_entry(directory, key), data, 0o600)
    except OSError:
        return
