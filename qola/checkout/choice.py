"""Which kernel tree a command uses, and what qola may do to it. Standard library only (and
:mod:`qola.core.settings`, which is).

``--aiter-root`` > ``[qola].aiter_root`` (relative to the manifest) > ``QOLA_AITER_SOURCE_DIR`` >
``NVTE_AITER_SOURCE_DIR`` > the default checkout (:func:`default_tree`). Only the default checkout
is qola's own: ``qola build`` checks it out (clone, pin, patches) unless ``--skip-checkout``. A tree
the user named is changed only when asked (``qola checkout``, or ``build --aiter-commit`` /
``--patches-dir``), and a tree named by ``--skip-checkout`` or one of the source-dir variables is the
user's choice: its pin is checked and a mismatch is a warning recorded in manifest.json.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from qola.core import settings

SOURCE_ENV = settings.AITER_ROOT.env  # QoLA's CMake: build this tree, never check out
URL_ENV = settings.AITER_URL.env[0]
FORCE_ENV = "QOLA_FORCE_AITER_CHECKOUT"  # QoLA's: 1 = discard local changes (as --force)
DEFAULT_URL = "https://github.com/ROCm/aiter.git"
DEFAULT = "the default checkout"
VARIABLES = (*SOURCE_ENV, "XDG_CACHE_HOME", "HOME")  # every variable choose and named_by_env read


def qola_checkout() -> Path | None:
    """The root of the git checkout qola runs from (None for an installed package)."""
    root = Path(__file__).resolve().parents[2]
    return root if (root / "pyproject.toml").is_file() and (root / "qola" / "cli.py").is_file() else None


def default_tree(env: Mapping[str, str]) -> Path:
    """QoLA's default: ``<qola checkout>/build/third_party/aiter`` (git-ignored); for an installed
    qola ``$XDG_CACHE_HOME/qola/aiter`` (``~/.cache/qola/aiter``)."""
    root = qola_checkout()
    if root is not None:
        return root / "build" / "third_party" / "aiter"
    cache = env.get("XDG_CACHE_HOME") or os.path.join(env.get("HOME") or os.path.expanduser("~"), ".cache")
    return Path(cache) / "qola" / "aiter"


@dataclass(frozen=True)
class TreeChoice:
    path: Path
    how: str  # "--aiter-root", "[qola].aiter_root", one of SOURCE_ENV, or DEFAULT

    @property
    def managed(self) -> bool:
        """qola's own checkout: ``qola build`` may check it out."""
        return self.how == DEFAULT

    @property
    def from_env(self) -> bool:
        return self.how in SOURCE_ENV


def choose(aiter_root: str | None, manifest_root: Path | None, env: Mapping[str, str]) -> TreeChoice:
    """The tree a command uses (see the module's docstring for the order;
    :data:`qola.core.settings.AITER_ROOT`)."""
    chosen = settings.resolve(
        settings.AITER_ROOT, aiter_root, manifest_root, env, default=lambda: str(default_tree(env))
    )
    return TreeChoice(Path(chosen.value), DEFAULT if chosen.where == settings.DEFAULT else chosen.where)


def named_by_env(path: Path, env: Mapping[str, str]) -> str | None:
    """The source-dir variable that names ``path`` (the same directory), if one does."""
    for key in SOURCE_ENV:
        value = env.get(key, "").strip()
        if value and "\0" not in value and os.path.realpath(value) == os.path.realpath(path):
            return key
    return None


def forced(flag: bool, env: Mapping[str, str]) -> bool:
    return flag or env.get(FORCE_ENV, "0").strip() not in ("", "0")
