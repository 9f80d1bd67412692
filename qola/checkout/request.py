"""From a command's arguments (and an optional manifest) to a :class:`~qola.checkout.sync.Request`,
each value by its chain: command line > manifest > environment > default."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from qola.checkout.choice import qola_checkout
from qola.core import settings
from qola.core.errors import QolaError
from qola.core.secret import Secret, UnsplittableURL, split_url
from qola.core.setting import Values

if TYPE_CHECKING:
    from qola.checkout.git import Env
    from qola.checkout.sync import Request


def commit_of(values: Values) -> tuple[str | None, str]:
    """(the commit to check out, where it came from): ``--aiter-commit`` > ``[qola] aiter_commit``."""
    sha = values[settings.AITER_COMMIT]
    if sha is None:
        return None, ""
    where = values.where(settings.AITER_COMMIT)
    return sha, "[qola] aiter_commit" if where == settings.AITER_COMMIT.manifest else where


def patches_dir_of(values: Values) -> tuple[Path | None, str]:
    """``--patches-dir`` (relative to the working dir) > ``[qola] patches_dir`` (relative to the
    manifest's dir) > QoLA's default place, ``<qola checkout>/patches/aiter``, when it exists (qola
    ships no AITER patches of its own: a checkout that has that dir put it there) > none."""
    given = values[settings.PATCHES_DIR]
    if given is not None:
        where = values.where(settings.PATCHES_DIR)
        return Path(os.path.abspath(given)), "[qola] patches_dir" if where == settings.PATCHES_DIR.manifest else where
    home = qola_checkout()
    if home is not None and (home / "patches" / "aiter").is_dir():
        return home / "patches" / "aiter", "the default patches dir"
    return None, ""


def clone_url(url: str) -> tuple[str, Secret | None]:
    """(the URL without credentials, the credentials as a :class:`Secret`) for an http(s) URL; another
    scheme keeps its user (``ssh://git@host``: a login, no secret) but a password in it is refused."""
    try:
        public, credentials = split_url(url)
    except UnsplittableURL as exc:  # the URL rule refuses it where it is given; a caller that skipped it
        raise QolaError(f"the clone URL: {exc}", hint=exc.hint) from None
    if credentials is None:
        return url, None
    if public.split("://", 1)[0].lower() in ("http", "https"):
        return public, credentials
    if ":" in credentials.reveal():
        raise QolaError(
            f"the clone URL {public} carries a password, which git sends only over http(s)",
            hint="use an ssh key (ssh-agent), or an https:// URL",
        )
    return url, None


def request(root: Path, values: Values, env: Mapping[str, str], *, own: bool = False) -> Request:
    """What a checkout of ``root`` does, from the settings resolved once (:mod:`qola.core.settings`:
    ``--aiter-commit``, ``--patches-dir``, the clone URL, ``--force``). ``own``: ``root`` is qola's own
    checkout dir (:attr:`qola.checkout.choice.TreeChoice.managed`), whose changes qola may discard."""
    from qola.checkout.sync import Request, collect_patches  # lazy: paid only by the callers that need it

    sha, commit_from = commit_of(values)
    public, credentials = clone_url(values[settings.AITER_URL])
    pdir, pwhere = patches_dir_of(values)
    return Request(
        root=root,
        commit=sha,
        commit_from=commit_from,
        patches=collect_patches(pdir, pwhere),
        url=public,
        force=values[settings.FORCE_CHECKOUT],
        own=own,
        env=dict(env),
        credentials=credentials,
    )


def unapplied_patches_note(root: Path, values: Values, env: Env) -> str | None:
    """A warning when the patch set the manifest (or ``--patches-dir``) names is not the one the last
    ``qola checkout`` of ``root`` applied (None: it is, or there is none, or the tree is not a git
    checkout). ``env``: what git runs under (:class:`qola.checkout.git.GitEnv`)."""
    import hashlib  # lazy: paid only by the callers that need it

    from qola.checkout.state import read_stamp  # lazy: paid only by the callers that need it
    from qola.checkout.sync import collect_patches, read_patch  # lazy: paid only by the callers that need it

    pdir, where = patches_dir_of(values)
    if pdir is None or not (root / ".git").exists():
        return None
    try:
        wanted = [(p.name, hashlib.sha256(read_patch(p)).hexdigest()) for p in collect_patches(pdir, where)]
    except (QolaError, OSError):
        return None
    stamp = read_stamp(root, env) or {}
    applied = [(p.get("name"), p.get("sha256")) for p in stamp.get("patches", []) if isinstance(p, dict)]
    if not wanted or applied == wanted:
        return None
    return (
        f"{root} does not hold the patches of {where} ({pdir}: {', '.join(n for n, _ in wanted)}) as qola "
        f"checkout applies them{' (it recorded ' + ', '.join(str(n) for n, _ in applied) + ')' if applied else ''}; "
        "built as it is (run qola checkout to apply them)"
    )
