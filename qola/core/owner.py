"""Whose directories qola builds in: the build dir, the output dir and the build dir's own subdirs
(generated sources, objects, probes, libraries) must be the user's own, else another user's files
there would be compiled, linked and published as the user's.

A directory passes when it is owned by the current user or by root (a system directory an admin set
up: root is trusted anyway) and is not writable by every user unless its sticky bit is set (as
``/tmp`` is). Group write is accepted: a umask of 002 with a per-user group is common, and the group
is the user's choice. Each refusal is a :class:`QolaError` that says which directory, who owns it
and how to fix it. Standard library only (it runs before the no-op fast path).
"""

from __future__ import annotations

import os
import pwd
import stat
from pathlib import Path

from qola.core.errors import QolaError

SUBDIR_DEPTH = 2  # BUILD/gen/<module>, BUILD/obj/<module>, BUILD/jit-out/<md_name>: where qola reuses files


def user_name(uid: int) -> str:
    """``name (uid N)``, or ``uid N`` for a uid without a name."""
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except (KeyError, OverflowError):
        return f"uid {uid}"


def foreign_problem(st: os.stat_result, euid: int | None = None) -> str | None:
    """What makes a directory with this stat another user's to write into, or None."""
    me = os.geteuid() if euid is None else euid
    if st.st_uid not in (me, 0):
        return f"is owned by {user_name(st.st_uid)}; you are {user_name(me)}"
    if st.st_mode & stat.S_IWOTH and not st.st_mode & stat.S_ISVTX:
        return f"is writable by every user (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def private_problem(st: os.stat_result, euid: int | None = None) -> tuple[str, str] | None:
    """What keeps a directory with this stat from being a private cache dir (the JIT cache's, the compile
    cache's: the user's alone, written by no one else), as (``"type"``, ``"owner"`` or ``"mode"``, the
    words), or None. Stricter than :func:`foreign_problem`: root's is not the user's, group write refused."""
    me = os.geteuid() if euid is None else euid
    if not stat.S_ISDIR(st.st_mode):
        return "type", "not a directory"
    if st.st_uid != me:
        return "owner", f"owned by uid {st.st_uid}, not by the current user (uid {me})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return "mode", f"writable by group or others (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def check_dir(path: Path, what: str, flag: str, *, depth: int = 0, euid: int | None = None) -> None:
    """Refuse ``path`` (when it exists) or one of its subdirs down to ``depth`` levels (symlinks are
    not followed: a link is qola's to replace, not to enter) that another user can write into."""
    level = [path]
    for current in range(depth + 1):
        below = []
        for d in level:
            try:
                st = os.lstat(d)
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise QolaError(
                    f"cannot use the {what} {d}: {exc.strerror}", hint=f"pass {flag} with another directory"
                ) from None
            if not stat.S_ISDIR(st.st_mode):
                continue  # the caller checks the top; a file below is qola's to overwrite
            problem = foreign_problem(st, euid)
            if problem:
                where = f"the {what} {d}" if d == path else f"{d} in the {what}"
                fix = (
                    f"remove it as its owner ({user_name(st.st_uid)}), take it over if it is yours to take "
                    f"(`chown -R {os.geteuid() if euid is None else euid} {d}`), or pass {flag} with a "
                    "directory of your own"
                    if st.st_uid not in (os.geteuid() if euid is None else euid, 0)
                    else f"run `chmod o-w {d}`, or pass {flag} with a directory of your own"
                )
                raise QolaError(
                    f"refusing {where}: it {problem}; files another user writes there would be "
                    "compiled, linked and published as yours",
                    hint=fix,
                )
            if current < depth:
                try:
                    below += [Path(e.path) for e in os.scandir(d) if e.is_dir(follow_symlinks=False)]
                except OSError as exc:
                    raise QolaError(
                        f"cannot read the {what} {d}: {exc.strerror}", hint=f"pass {flag} with another directory"
                    ) from None
        level = below
