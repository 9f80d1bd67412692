"""What a checkout's working tree holds, as one digest, and the stamp qola leaves after a checkout.

:func:`snapshot` hashes everything that differs from the commits checked out: ``git status`` of the
tree and of every initialised submodule (recursively), their ``git diff --binary HEAD``, the
submodules' HEADs and the bytes of untracked files. A pristine tree has no changes; a tree qola
checked out has exactly the digest its stamp recorded (the patch set applied). Anything else is a
tree someone changed, which qola never resets without ``--force``.

The stamp (``<git dir>/qola-checkout.json``) records the commit, the patch set (names, sha256 and
text: what a failed checkout needs to put the tree back) and the digest after the checkout.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qola.checkout import git
from qola.core import inputs
from qola.core.errors import QolaError
from qola.core.fsutil import atomic_write

STAMP = "qola-checkout.json"
FORMAT = 1
MAX_UNTRACKED_BYTES = 64 * 1024 * 1024  # hashed per file; larger ones count by size and mtime


@dataclass(frozen=True)
class Snapshot:
    head: str
    digest: str
    changes: tuple[str, ...]  # "path (what)" for every change, tree and submodules
    untracked: tuple[str, ...] = ()  # root-relative paths of untracked files (the superproject's)
    submodules: tuple[str, ...] = field(default=())  # initialised submodule paths

    @property
    def pristine(self) -> bool:
        return not self.changes


def _status(root: Path, env: Mapping[str, str]) -> list[tuple[str, str]]:
    raw = git.run(
        root, "status", "--porcelain=v1", "-z", "--untracked-files=all", "--ignore-submodules=none", env=env
    ).stdout
    entries, items = [], raw.split("\0")
    i = 0
    while i < len(items):
        item = items[i]
        i += 1
        if len(item) < 4:
            continue
        code, path = item[:2], item[3:]
        if code[0] in "RC":  # a rename names its source next
            i += 1
        entries.append((code, path))
    return entries


def _submodules(root: Path, env: Mapping[str, str]) -> list[tuple[str, str, str]]:
    """(flag, sha, path) per submodule, recursively; flag '-' = not initialised."""
    if not (root / ".gitmodules").exists():
        return []
    text = git.out(root, "submodule", "status", "--recursive", env=env)
    subs = []
    for line in text.splitlines():
        if len(line) < 43:
            continue
        flag, rest = line[0], line[1:]
        sha, _, path = rest.partition(" ")
        path = path.rsplit(" (", 1)[0] if path.endswith(")") else path
        subs.append((flag, sha, path))
    return subs


def _file_part(path: Path) -> bytes:
    try:
        st = os.lstat(path)
        if not os.path.isfile(path) or os.path.islink(path):
            return f"link-or-special {st.st_mode}".encode()
        if st.st_size > MAX_UNTRACKED_BYTES:
            return f"large {st.st_size} {st.st_mtime_ns}".encode()
        return hashlib.sha256(inputs.read_checked(path, limit=MAX_UNTRACKED_BYTES, what="file", follow=False)).digest()
    except (OSError, QolaError):
        return b"unreadable"


def snapshot(root: Path, env: Mapping[str, str]) -> Snapshot:
    h = hashlib.sha256()
    head = git.out(root, "rev-parse", "HEAD", env=env)
    h.update(head.encode())
    changes: list[str] = []
    untracked: list[str] = []
    subs = _submodules(root, env)
    inited = [p for flag, _, p in subs if flag != "-"]
    for where in ["", *inited]:
        base = root / where if where else root
        for code, path in _status(base, env):
            rel = f"{where}/{path}" if where else path
            h.update(f"{code}\0{rel}\0".encode())
            if code == "??":
                h.update(_file_part(base / path))
                if not where:
                    untracked.append(path)
            if not (where == "" and path.rstrip("/") in inited and code.strip() == "M"):  # shown by its own entries
                changes.append(f"{rel} ({'untracked' if code == '??' else code.strip()})")
        git.digest(base, "diff", "--binary", "HEAD", env=env, into=h)
    for flag, sha, path in subs:
        h.update(f"{flag}{sha} {path}\0".encode())
        if flag == "+":
            changes.append(f"{path} (submodule at {sha[:12]}, not the commit the tree records)")
    return Snapshot(head, h.hexdigest(), tuple(changes), tuple(untracked), tuple(inited))


def git_dir(root: Path, env: git.Env) -> Path:
    return Path(git.out(root, "rev-parse", "--absolute-git-dir", env=env))


def read_stamp(root: Path, env: git.Env) -> dict[str, Any] | None:
    try:
        data = json.loads(inputs.read_record(git_dir(root, env) / STAMP))
    except (OSError, ValueError, git.GitError):
        return None
    return data if isinstance(data, dict) and data.get("format") == FORMAT else None


def write_stamp(root: Path, env: Mapping[str, str], data: Mapping[str, Any]) -> None:
    atomic_write(git_dir(root, env) / STAMP, (json.dumps({"format": FORMAT, **data}, indent=1) + "\n").encode())


def clear_stamp(root: Path, env: Mapping[str, str]) -> None:
    with contextlib.suppress(OSError, git.GitError):
        (git_dir(root, env) / STAMP).unlink()
