"""A generator's ``--list_blobs`` listing, cached by everything that decides it (issue 34), so a
second ``qola plan`` (and a build's plan step) does not rerun every CK generator: TE's manifest at
AITER 7a24cd87 planned in 16 s, nearly all of it CK's ``generate.py --list_blobs``.

The key (:func:`key_of`) is a sha256 of: the command as run (interpreter, wrapper, script and its
arguments, the filter; the temp paths left out), the interpreter's file (path, size, mtime), the
generator's sources (:func:`sources_digest`: every ``*.py`` under each script's directory, CK's
``codegen/`` package included, and the wrapper), the files its arguments name
(:func:`argument_files_digest`) and its environment (every variable but the shell's and pytest's
bookkeeping: :data:`VOLATILE`). A changed generator, argument, file or variable is another key: the listing runs.

The cache is a directory of qola's own (``$XDG_CACHE_HOME/qola/listings``, else
``~/.cache/qola/listings``, :func:`cache_dir`), one JSON file per key, written atomically
(:func:`qola.core.fsutil.atomic_write`, mode 0600). Another user, or a process of this user's that
went wrong, may have written into it: the directory is used only when it is a real directory of
this user's that no one else may write into, and an entry is trusted only when it is a regular file
(not followed through a link) of this user's, not group- or world-writable, at most
:data:`MAX_ENTRY` bytes, valid JSON naming its own key and holding a list of plain stems. Anything
else is a miss (the generator runs and the entry is rewritten); the cache never fails a plan.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path

from qola.core import inputs
from qola.core.errors import QolaError
from qola.core.fsutil import atomic_write
from qola.plan.tree.files import MAX_CSV, read_small

SUBDIR = ("qola", "listings")  # under $XDG_CACHE_HOME, else ~/.cache
MAX_ENTRY = 16 << 20  # bytes of one cached listing (CK's largest, bwd: ~15,000 names, under 2 MiB)
# the caller's bookkeeping, not the generator's input: the shell's (``_``, ``OLDPWD``, ``SHLVL``) and
# pytest's (``PYTEST_CURRENT_TEST``: the running test's id and phase, another in every test, so a suite
# that plans the same tree in many tests, or a test's setup and call, would never share a listing)
VOLATILE = frozenset({"_", "OLDPWD", "SHLVL", "PYTEST_CURRENT_TEST"})
FORMAT = 1


def cache_dir(env: Mapping[str, str]) -> str | None:
    """Where listings are cached: ``$XDG_CACHE_HOME/qola/listings`` (an absolute one), else
    ``$HOME/.cache/qola/listings``; None (no cache) without either."""
    xdg = env.get("XDG_CACHE_HOME", "")
    base = xdg if os.path.isabs(xdg) else os.path.join(env["HOME"], ".cache") if env.get("HOME") else ""
    return os.path.join(base, *SUBDIR) if os.path.isabs(base) else None


MAX_GENERATOR_FILE = 64 << 20  # one .py beside a generator script (CK's largest: about 200 KiB)
_HINT_GEN = "remove it, or move it out of the generator's directory (every .py beside a generator is hashed)"


def sources_digest(scripts: Sequence[str]) -> str:
    """Hash of every .py file beside each generator script (CK's generator imports its codegen/ package)."""
    h = hashlib.sha256()
    for script in sorted(set(scripts)):
        p = Path(script)
        if not p.exists():
            h.update(f"missing:{script}".encode())
            continue
        files = sorted(p.parent.rglob("*.py")) if p.suffix == ".py" else [p]
        for f in files:
            if "__pycache__" in f.parts:
                continue
            # the one checked open: a FIFO (or a device) named *.py is refused, never waited on
            try:
                digest, _ = inputs.sha256_checked(f, limit=MAX_GENERATOR_FILE, what="generator file", hint=_HINT_GEN)
            except FileNotFoundError:  # a dangling link (an editor's lock file, .#x.py) or a file gone since
                continue  # the listing: nothing can import it; a file that appears later changes the digest
            h.update(str(f).encode() + b"\0" + digest.encode())
    return h.hexdigest()


def argument_files_digest(argvs: Sequence[Sequence[str]]) -> dict[str, str]:
    """sha256 of each existing regular file a generator command names after its script (``x.csv``,
    ``--tune_file=x.csv``): a tuned-config CSV passed by path decides the output like the script
    does, so editing it must rerun the generator. Read with the tuned-CSV size limit."""

    found: dict[str, str] = {}
    for argv in argvs:
        for arg in argv[2:]:
            path = arg.partition("=")[2] if arg.startswith("-") else arg
            if path in found or not os.path.isabs(path) or not os.path.isfile(path):
                continue
            found[path] = hashlib.sha256(read_small(path, limit=MAX_CSV, what="generator input")).hexdigest()
    return found


def key_of(argv: Sequence[str], env: Mapping[str, str]) -> str | None:
    """The key of a listing run as ``argv`` (``[python, wrapper?, script, args…]``, temp paths as
    placeholders) under ``env``; None when it cannot be told (an input unreadable: not cached)."""
    try:
        st = os.stat(argv[0])
        scripts = [a for a in argv[1:3] if a.endswith(".py")]
        payload = {
            "format": FORMAT,
            "argv": list(argv),
            "python": [os.path.realpath(argv[0]), st.st_size, st.st_mtime_ns],
            "sources": sources_digest(scripts),
            "files": argument_files_digest([argv]),
            "env": sorted((k, v) for k, v in env.items() if k not in VOLATILE),
        }
    except (OSError, QolaError):
        return None
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


def load(directory: str, key: str) -> list[str] | None:
    """The cached listing of ``key``, or None (absent, or not to be trusted: see the module)."""
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
    return stems


def _plain(stem: object) -> bool:
    return isinstance(stem, str) and bool(stem) and not any(c in stem for c in "/\0\n\r") and stem not in (".", "..")


def store(directory: str, key: str, stems: Sequence[str]) -> None:
    """Record ``stems`` under ``key`` (best effort: a cache that cannot be written is no error)."""
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
    except OSError as exc:
        if exc.errno != errno.EEXIST:
            return
    if not _private_dir(directory) or not all(_plain(s) for s in stems):
        return
    data = json.dumps({"key": key, "stems": list(stems)}).encode()
    try:
        atomic_write(_entry(directory, key), data, 0o600)
    except OSError:
        return
