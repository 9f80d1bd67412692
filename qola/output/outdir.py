"""The output directory: its layout, the switch that publishes a version, what readers see.

Layout (docs/integration.md, "Versions")::

    OUT/lib/ include/ configs/ jit/ share/ logs/   real directories of real files (consumers copy them)
    OUT/manifest.json                               a real file, switched in last: the commit point
    OUT/.qola/prev/                                 the previous version, whole, until the next publish
    OUT/.qola/switch.lock                           flock: one switch at a time; qola's readers share it
    OUT/.qola/next/                                 a filled version being switched in (the journal)
    OUT/.qola/.stage-<pid>-…                        a version being filled

A publish fills ``.stage-<pid>-…`` (every file fsynced; nothing in OUT changes meanwhile), records
the (dev, inode) of each of its entries in it (:data:`SWITCH_RECORD`), and renames it to ``next``:
from that rename on, the publish rolls forward. Each entry is then swapped with OUT's in a fixed
order (:data:`ENTRIES`, manifest.json last) by ``renameat2(RENAME_EXCHANGE)``, so every name under
OUT is always the whole old directory or the whole new one; the old ones land in ``next``, which
becomes ``prev``. Where the file system lacks the exchange, the entry is renamed aside and the new
one renamed in (the name is briefly absent). A SIGKILL mid-switch leaves ``next``: every qola command
that reads or writes OUT first completes the switch (:func:`complete`, under the exclusive lock);
whether an entry was swapped is told by its inode, so completing is idempotent.

Standard library only (the no-op fast path reads :data:`ENTRIES`).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import re
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path

from qola.core import fsutil, inputs, lock
from qola.core.errors import QolaError

MANIFEST_JSON = "manifest.json"
STORE = ".qola"
DIRS = ("lib", "include", "configs", "jit", "share", "logs")  # always present in a version
ENTRIES = (*DIRS, MANIFEST_JSON)  # the switch order: manifest.json last
NEXT = "next"
PREV = "prev"
LOCK = "switch.lock"
STAGE = ".stage-"  # .qola/.stage-<pid>-…: a version being filled
OLD = ".old-"  # .qola/.old-<pid>: an older prev being removed
SWITCH_RECORD = ".switch.json"  # in next/: {entry: [dev, ino]} of the new version's entries
ASIDE = ".aside-"  # next/.aside-<entry>: OUT's old entry, where the exchange is not available
# the symlink layout of older qola versions (OUT/current -> .qola/v<N>, OUT/lib -> current/lib):
# read by the audit, converted by the next publish
LEGACY_CURRENT = "current"
LEGACY_LINK_TMP = ".current-"
_LEGACY_VERSION = re.compile(r"v([0-9]+)\Z")
HINT_FOREIGN = "remove it or choose another --output-dir"
# every name qola writes or removes at OUT's top level (a kernel tree may live in OUT under any other
# name, e.g. TE's OUT/third_party/aiter: qola.pipeline.preflight.tree_placement), and the prefixes of its
# temporary names there
OUT_NAMES = (STORE, LEGACY_CURRENT, *ENTRIES)
OUT_PREFIXES = (STORE, LEGACY_LINK_TMP)


def store(out: Path) -> Path:
    return Path(out) / STORE


def interrupted(out: Path) -> bool:
    """Whether a switch into ``out`` was started and not finished (a live one, or a killed one)."""
    return os.path.lexists(store(out) / NEXT)


def legacy_version(out: Path) -> Path | None:
    """``OUT/.qola/v<N>`` that a symlink-layout ``OUT/current`` names (an output of an older qola)."""
    try:
        target = os.readlink(Path(out) / LEGACY_CURRENT)
    except OSError:
        return None
    head, _, name = target.partition("/")
    if head != STORE or not _LEGACY_VERSION.match(name):
        return None
    path = store(out) / name
    return path if path.is_dir() and not path.is_symlink() else None


MAX_RECORD = 256 << 20  # a manifest.json larger than this is not one qola wrote


def published(out: Path) -> bool:
    """Whether ``out`` holds a published output (a real ``manifest.json`` at its top)."""
    p = Path(out) / MANIFEST_JSON
    try:
        return stat.S_ISREG(os.lstat(p).st_mode)
    except OSError:
        return False


def recognised(out: Path) -> bool:
    """Whether ``out`` is an output qola published: a real ``manifest.json`` that is a JSON object with
    qola's ``qola_version`` and ``modules`` (any project may have a manifest.json of its own: that
    alone is never taken for qola's), and no ``OUT/.qola`` that is anything but a directory. Opened
    without following a link or blocking on a FIFO, size-checked before it is read."""
    st_dir = store(out)
    if st_dir.is_symlink() or (os.path.lexists(st_dir) and not st_dir.is_dir()) or not published(out):
        return False
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(Path(out) / MANIFEST_JSON, flags)
    except OSError:
        return False
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_RECORD:
            return False
        with os.fdopen(os.dup(fd), "rb") as fh:
            data = json.loads(fh.read(MAX_RECORD + 1))
    except (OSError, ValueError, RecursionError):
        return False
    finally:
        os.close(fd)
    return (
        isinstance(data, dict) and isinstance(data.get("qola_version"), str) and isinstance(data.get("modules"), list)
    )


# -- locks ----------------------------------------------------------------------------------------


def _open_lock(out: Path, create: bool) -> int | None:
    path = store(out) / LOCK
    try:
        return os.open(path, (os.O_RDWR | os.O_CREAT if create else os.O_RDONLY) | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
    except OSError:
        if create:
            with contextlib.suppress(OSError):
                return os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        return None


def _take(fd: int, out: Path, *, shared: bool) -> None:
    """The switch lock, shared or exclusive, waiting as long as it takes (a publish switches in
    moments; a reader may read for long): said while it waits, ended by SIGTERM (qola.core.lock)."""
    what = f"the output dir {out} ({'a publish into it' if shared else 'qola commands reading or publishing it'})"
    lock.wait_flock(fd, what, wait=math.inf, shared=shared)


@contextlib.contextmanager
def switching(out: Path) -> Iterator[bool]:
    """The exclusive switch lock of ``out`` (``.qola`` created), with any interrupted switch
    completed first (yields whether there was one). For writers: a publish, a build's preparation."""
    st = store(out)
    st.mkdir(parents=True, exist_ok=True)
    if st.is_symlink() or not st.is_dir():
        raise QolaError(f"{st} is not a directory qola wrote", hint=HINT_FOREIGN)
    fd = _open_lock(out, True)
    if fd is None:
        raise QolaError(f"cannot open {st / LOCK}", hint="check the output dir's permissions")
    try:
        _take(fd, out, shared=False)
        yield complete(out)
    finally:
        os.close(fd)  # drops the lock


@contextlib.contextmanager
def reading(out: Path) -> Iterator[None]:
    """For qola's readers (audit, package): OUT stays one version while they read it. An interrupted
    switch is completed first (it needs write access; without it: a QolaError saying so); then the
    lock is held shared, so no publish switches meanwhile. No ``.qola``: nothing to lock."""
    st = store(out)
    if not st.is_dir() or st.is_symlink():
        yield
        return
    fd = _open_lock(out, True)
    if fd is None:
        if interrupted(out):
            raise QolaError(
                f"a publish into {out} was interrupted and cannot be completed by this user",
                hint="run qola build (or qola audit) on it as its owner",
            )
        yield
        return
    try:
        while True:
            if interrupted(out):
                _take(fd, out, shared=False)
                try:
                    complete(out)
                except OSError as exc:
                    raise QolaError(
                        f"a publish into {out} was interrupted and cannot be completed: {exc}",
                        hint="run qola build on it as its owner",
                    ) from None
            _take(fd, out, shared=True)
            if not interrupted(out):
                break
            fcntl.flock(fd, fcntl.LOCK_UN)  # a publish switched in between: complete it first
        yield
    finally:
        os.close(fd)


# -- the switch (callers hold the exclusive lock) --------------------------------------------------


def _ident(path: Path) -> tuple[int, int] | None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino


def switch_in(out: Path, stage: Path) -> None:
    """Publish the filled, fsynced version dir ``stage`` (in ``OUT/.qola``) into ``out``: record
    its entries' inodes, rename it to ``next`` (the commit: from here on the switch rolls
    forward), then :func:`complete`. Call under :func:`switching`."""
    record = {}
    for name in ENTRIES:
        ident = _ident(stage / name)
        if ident is None:
            raise QolaError(f"internal: the staged version lacks {name}")
        record[name] = list(ident)
    fsutil.atomic_write(stage / SWITCH_RECORD, json.dumps(record).encode(), sync_dir=True)
    os.rename(stage, store(out) / NEXT)
    fsutil.fsync_dir(store(out))
    complete(out)


def _switch_entry(out: Path, nxt: Path, name: str, new: tuple[int, int]) -> None:
    """Make ``OUT/<name>`` the new version's entry (inode ``new``) and ``next/<name>`` OUT's old
    one. Idempotent: run again after a kill at any point, it finishes the job."""
    dst, src, aside = out / name, nxt / name, nxt / f"{ASIDE}{name}"
    cur = _ident(dst)
    if cur != new:
        if cur is None:  # no old entry (a first publish), or a kill between the fallback's renames
            if _ident(src) != new:
                raise QolaError(
                    f"cannot complete the publish into {out}: {src} is not the staged {name}",
                    hint=f"remove {nxt} and rebuild",
                )
            os.rename(src, dst)
        elif not fsutil.exchange(src, dst):
            os.rename(dst, aside)  # OUT/<name> is absent until the next rename
            os.rename(src, dst)
    if os.path.lexists(aside) and not os.path.lexists(src):
        os.rename(aside, src)


def complete(out: Path) -> bool:
    """Finish a switch into ``out`` that was started (``.qola/next`` present): every entry swapped,
    an older prev removed, ``next`` renamed to ``prev``. True when there was one."""
    out = Path(out)
    st = store(out)
    nxt = st / NEXT
    if not os.path.lexists(nxt):
        return False
    try:
        record = json.loads(inputs.read_record(nxt / SWITCH_RECORD))
        idents = {name: (int(record[name][0]), int(record[name][1])) for name in ENTRIES}
    except (OSError, ValueError, KeyError, TypeError, IndexError) as exc:
        raise QolaError(
            f"cannot complete the publish into {out}: {nxt / SWITCH_RECORD} is unreadable ({exc})",
            hint=f"remove {nxt} and rebuild",
        ) from None
    for name in ENTRIES:
        _switch_entry(out, nxt, name, idents[name])
    fsutil.fsync_dir(out)
    fsutil.fsync_dir(nxt)
    _drop_legacy(out)
    drop_prev(out)
    if any(os.path.lexists(nxt / name) for name in ENTRIES):
        os.rename(nxt, st / PREV)
    else:  # a first publish: there was no previous version (renamed first: a kill leaves a stale .old-<pid>)
        aside = st / f"{OLD}{os.getpid()}"
        fsutil.remove(aside)
        os.rename(nxt, aside)
        fsutil.remove(aside)
    fsutil.fsync_dir(st)
    return True


def drop_prev(out: Path) -> None:
    """Remove ``OUT/.qola/prev`` (renamed aside first, so a kill leaves a stale ``.old-<pid>``)."""
    st = store(out)
    prev, aside = st / PREV, st / f"{OLD}{os.getpid()}"
    if os.path.lexists(prev):
        fsutil.remove(aside)
        os.rename(prev, aside)
        fsutil.remove(aside)


def _drop_legacy(out: Path) -> None:
    """After the first switch of an output written in the symlink layout: its ``current`` link
    and its versions go (the old entries, links, are in ``next``)."""
    link = out / LEGACY_CURRENT
    if not link.is_symlink():
        return
    link.unlink()
    for entry in os.scandir(store(out)):
        if _LEGACY_VERSION.match(entry.name) and entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path, ignore_errors=True)


def check_output(out: Path) -> None:
    """QolaError unless ``out`` can take a publish: absent, empty, or a qola output (:func:`recognised`;
    or the symlink layout of an older qola). Never something
    qola did not write: a real ``OUT/lib`` without a ``manifest.json`` is refused, not replaced.
    Entries other than qola's (a kernel tree inside OUT) are left alone."""
    out = Path(out)
    if not os.path.lexists(out):
        return
    if not out.is_dir():
        raise QolaError(f"output dir {out} exists and is not a directory", hint="give -o a directory path")
    st = store(out)
    if st.is_symlink() or (os.path.lexists(st) and not st.is_dir()):
        raise QolaError(f"{st} is not a directory qola wrote", hint=HINT_FOREIGN)
    cur = out / LEGACY_CURRENT
    if os.path.lexists(cur) and not cur.is_symlink():
        raise QolaError(f"{cur} exists and was not written by qola", hint=HINT_FOREIGN)
    legacy = cur.is_symlink()
    ours = recognised(out) or legacy or interrupted(out)  # a killed switch: completed before publishing
    for name in ENTRIES:
        p = out / name
        if not os.path.lexists(p):
            continue
        if not ours:
            damaged = published(out)
            why = f"{out / MANIFEST_JSON} is not a qola build record" if damaged else f"no {out / MANIFEST_JSON}"
            raise QolaError(
                f"output dir {out} holds {name}, which qola did not publish ({why}); a build would replace it",
                hint=_damaged_hint(out) if damaged else f"remove {out} or choose another --output-dir",
            )
        if p.is_symlink() and not legacy:
            raise QolaError(f"{p} is a symlink: not part of a qola output", hint=HINT_FOREIGN)
        want_dir = name != MANIFEST_JSON
        if not p.is_symlink() and p.is_dir() != want_dir:
            raise QolaError(
                f"{p} is not a {'directory' if want_dir else 'file'}: not part of a qola output", hint=HINT_FOREIGN
            )


def _damaged_hint(out: Path) -> str:
    """How to recover an output whose manifest.json is damaged (cut short, edited by hand)."""
    return (
        f"if {out} is a qola output whose {MANIFEST_JSON} was damaged, remove {out} (`rm -r {out}`) and build "
        "again (qola never replaces files it cannot tell are its own); if it is not, choose another --output-dir"
    )


def entry_problems(out: Path) -> list[str]:
    """The audit's layout check: every entry a real dir (manifest.json a real file), not a link."""
    problems = []
    for name in ENTRIES:
        p = out / name
        try:
            mode = os.lstat(p).st_mode
        except FileNotFoundError:
            problems.append(f"layout: {p} is missing")
            continue
        except OSError as exc:
            problems.append(f"layout: {p}: {exc}")
            continue
        want = stat.S_ISREG if name == MANIFEST_JSON else stat.S_ISDIR
        if not want(mode):
            kind = "a symlink" if stat.S_ISLNK(mode) else "not a " + ("file" if name == MANIFEST_JSON else "directory")
            problems.append(f"layout: {p} is {kind}")
    return problems
