"""From a command's arguments (and an optional manifest) to a :class:`~qola.checkout.sync.Request`,
each value by its chain: command line > manifest > environment > default."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from qola import rules
from qola.checkout.choice import DEFAULT_URL, URL_ENV, forced
from qola.errors import QolaError

if TYPE_CHECKING:
    from qola.checkout.sync import Request
    from qola.manifest import Manifest


def commit_of(cli: str | None, manifest: Manifest | None) -> tuple[str | None, str]:
    """(the commit to check out, where it came from): ``--aiter-commit`` > ``[qola] aiter_commit``."""
    if cli is not None:
        problem = rules.git_rev_problem(cli)
        if problem:
            raise QolaError(f"--aiter-commit {cli!r} {problem}")
        return cli, "--aiter-commit"
    if manifest is not None and manifest.qola.aiter_commit:
        return manifest.qola.aiter_commit, "[qola] aiter_commit"
    return None, ""


def patches_dir_of(cli: str | None, manifest: Manifest | None) -> tuple[Path | None, str]:
    """``--patches-dir`` (relative to the working dir) > ``[qola] patches_dir`` (relative to the
    manifest's dir) > none: qola ships no AITER patches of its own."""
    if cli is not None:
        return Path(os.path.abspath(cli)), "--patches-dir"
    if manifest is not None and manifest.qola.patches_dir:
        return manifest.base_dir / manifest.qola.patches_dir, "[qola] patches_dir"
    return None, ""


def url_of(cli: str | None, manifest: Manifest | None, env: Mapping[str, str]) -> str:
    """``--aiter-url`` > ``[qola] aiter_url`` > ``QOLA_AITER_URL`` > ROCm/aiter on GitHub."""
    for where, value in (("--aiter-url", cli), ("[qola] aiter_url", manifest.qola.aiter_url if manifest else None),
                         (URL_ENV, env.get(URL_ENV) or None)):
        if value is not None:
            problem = rules.url_problem(value)
            if problem:
                raise QolaError(f"{where}: the URL {problem}")
            return value
    return DEFAULT_URL


def request(root: Path, manifest: Manifest | None, env: Mapping[str, str], *, commit: str | None = None,
            patches_dir: str | None = None, url: str | None = None, force: bool = False) -> Request:
    from qola.checkout.sync import Request, collect_patches  # noqa: PLC0415

    sha, commit_from = commit_of(commit, manifest)
    pdir, pwhere = patches_dir_of(patches_dir, manifest)
    return Request(root=root, commit=sha, commit_from=commit_from, patches=collect_patches(pdir, pwhere),
                   url=url_of(url, manifest, env), force=forced(force, env), env=dict(env))
