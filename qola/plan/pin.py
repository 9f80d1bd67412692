"""The pin check: is the tree the commit the manifest (or ``--aiter-commit``) pins?

Pure but for asking git about a tag or branch; returns what manifest.json records as ``pin``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from qola.checkout import git
from qola.checkout.git import GitEnv
from qola.core.errors import QolaError
from qola.core.rules import git_rev_problem
from qola.plan.manifest import Manifest
from qola.plan.tree.aiter import AiterTree, git_head

__all__ = ["PinAsk", "PinResult", "check_pin"]

PinResult = tuple[str | None, list[str], dict[str, Any]]


@dataclass(frozen=True)
class PinAsk:
    """What the pin check is asked. ``want``: the commit asked for (``--aiter-commit``; default the
    manifest's pin; a tag or branch is resolved in the tree), named ``want_from``. ``chosen``: why the
    tree is the user's explicit choice (``--skip-checkout``, ``NVTE_AITER_SOURCE_DIR``).
    ``git_env``: what asking the tree for a tag or branch runs git under (None: an empty environment)."""

    allow_unpinned: bool = False
    want: str | None = None
    want_from: str = "[qola] aiter_commit"
    chosen: str | None = None
    git_env: GitEnv | None = None


def check_pin(manifest: Manifest, tree: AiterTree, ask: PinAsk | None = None) -> PinResult:
    """(tree commit or None, warnings, the pin record for manifest.json). A mismatch is an error,
    unless ``ask.allow_unpinned`` or ``ask.chosen``: then a warning, recorded."""
    ask = ask or PinAsk()
    want = ask.want or manifest.qola.aiter_commit
    source = (ask.want_from if want != manifest.qola.aiter_commit else "[qola] aiter_commit") if want else None
    problem = git_rev_problem(want) if want else None
    if problem:
        raise QolaError(f"{source} {want!r} {problem}")
    head, unreadable = git_head(tree, ask.git_env)
    record: dict[str, Any] = {"expected": want, "actual": head, "source": source, "tree_chosen_by": ask.chosen}
    if unreadable is not None:  # a git checkout whose commit git will not tell: a pin is not taken on trust
        record["status"] = "unknown"
        return None, [_unreadable(tree, unreadable, want, source, ask)], record
    if head is None:
        record["status"] = "unknown"
        note = f"{tree.root} is not a git checkout (an sdist?): its commit cannot be checked"
        return None, [note + (f" against aiter_commit {want}" if want else "")], record
    if not want:
        record["status"] = "unpinned"
        return head, [], record
    if _same_commit(tree, head, want, ask.git_env):
        record["status"] = "match"
        return head, [], record
    record["status"] = "mismatch"
    return head, [_mismatch(tree, head, want, source, ask)], record


def _unreadable(tree: AiterTree, why: str, want: str | None, source: str | None, ask: PinAsk) -> str:
    """The warning for a git checkout whose commit cannot be read; an error where a pin needs it."""
    msg = f"{tree.root} is a git checkout, but its commit cannot be read: {why}"
    if not want:
        return msg
    if ask.chosen or ask.allow_unpinned:
        because = f"the tree is the one {ask.chosen} chose" if ask.chosen else "--allow-unpinned"
        return msg + f"; {source} {want} is not verified ({because}; recorded in manifest.json)"
    raise QolaError(
        msg + f"; {source} pins {want}, which qola cannot verify",
        hint="install git, or mark the tree safe (git config --global --add safe.directory "
        f"{tree.root}) if another user owns it; or build it as it is with --skip-checkout "
        "(a recorded warning) or --allow-unpinned",
    )


def _mismatch(tree: AiterTree, head: str, want: str, source: str | None, ask: PinAsk) -> str:
    """The warning for a tree at another commit than the pin; an error unless the tree was chosen."""
    msg = f"tree {tree.root} is at commit {head}, but {source} pins {want}"
    if ask.chosen:
        return (
            msg
            + f" (the tree is the one {ask.chosen} chose: built as it is, the mismatch is recorded in manifest.json)"
        )
    if not ask.allow_unpinned:
        raise QolaError(
            msg,
            hint=f"check it out (qola checkout --aiter-root {tree.root} --manifest …), build it as "
            "it is with --skip-checkout (a recorded warning), update aiter_commit, or pass --allow-unpinned",
        )
    return msg + " (--allow-unpinned)"


def _same_commit(tree: AiterTree, head: str, want: str, env: GitEnv | None) -> bool:
    if re.fullmatch(r"[0-9a-f]{4,40}", want) and head.startswith(want):
        return True
    try:
        done = git.run(tree.root, "rev-parse", "--verify", "--quiet", f"{want}^{{commit}}", env=env or {}, check=False)
    except QolaError:
        return False
    return done.returncode == 0 and str(done.stdout).strip() == head
