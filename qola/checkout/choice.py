"""Which kernel tree a command uses, and what qola may do to it. Standard library only (and
:mod:`qola.core.settings`, which is).

``--aiter-root`` > ``[qola].aiter_root`` (relative to the manifest) > ``QOLA_AITER_SOURCE_DIR`` >
``NVTE_AITER_SOURCE_DIR`` > the default checkout (:func:`default_tree`). Only the default checkout
dir is qola's own, by its path however it is named (TE's CMake passes it as ``--aiter-root``):
``qola build`` checks it out (clone, pin, patches) unless ``--skip-checkout``, and a checkout of it
discards changes another builder left there (QoLA's patches), saying which. A tree
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
from qola.core.setting import Values

SOURCE_ENV = settings.AITER_ROOT.env  # QoLA's CMake: build this tree, never check out
URL_ENV = settings.AITER_URL.env[0]
DEFAULT_URL = settings.DEFAULT_URL
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
    own: bool = False  # the path is the default checkout's, however it was named (TE's CMake names it)

    @property
    def managed(self) -> bool:
        """qola's own checkout (the default checkout dir, named or not; never one a source-dir
        variable names): ``qola build`` checks it out as QoLA's does, and a checkout may discard
        what another builder (QoLA's patches) left in it, saying what."""
        return self.how == DEFAULT or (self.own and not self.from_env)

    @property
    def from_env(self) -> bool:
        return self.how in SOURCE_ENV


def choose(values: Values, env: Mapping[str, str]) -> TreeChoice:
    """The tree a command uses, from the settings resolved once (see the module's docstring for the
    order; :data:`qola.core.settings.AITER_ROOT`); no source: :func:`default_tree`."""
    root = values[settings.AITER_ROOT]
    default = default_tree(env)
    if root is None:
        return TreeChoice(default, DEFAULT, own=True)
    own = os.path.realpath(root) == os.path.realpath(default)  # decided by the path, not by how it was named
    return TreeChoice(Path(root), values.where(settings.AITER_ROOT), own=own)


def named_by_env(path: Path, env: Mapping[str, str]) -> str | None:
    """The source-dir variable that names ``path`` (the same directory), if one does."""
    for key in SOURCE_ENV:
        value = env.get(key, "").strip()
        if value and "\0" not in value and os.path.realpath(value) == os.path.realpath(path):
            return key
    return None
