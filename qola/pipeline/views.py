"""What each stage reads of the build's environment, resolved once (the raw environment is not
passed on): :func:`only` (a few variables), :func:`tree_env` (the tree's evaluation),
:func:`child_env` (:class:`~qola.core.proc.ChildEnv`), :func:`git_view`
(:class:`~qola.checkout.git.GitEnv`), :func:`recorded` (:class:`~qola.store.fastpath.RecordedEnv`),
:func:`views` (the children's, the toolchain's and the generators' views).

Light at import (the no-op fast path reads the recorded view).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from qola.core import deadlines
from qola.core.errors import QolaError
from qola.core.proc import ChildEnv
from qola.store.fastpath import ENV_PREFIXES, RecordedEnv

if TYPE_CHECKING:
    from qola.checkout.git import GitEnv
    from qola.plan.tree.aiter import AiterTree
    from qola.plan.variants import GeneratorEnv
    from qola.toolchain.env import ToolchainEnv


def child_env(env: Mapping[str, str]) -> ChildEnv:
    """The environment every child runs under (opaque: no setting is read from it)."""
    return ChildEnv(tuple(sorted(env.items())))


def git_view(env: Mapping[str, str]) -> GitEnv:
    """What git reads of ``env`` (:class:`qola.checkout.git.GitEnv`)."""
    from qola.checkout.git import GitEnv  # lazy: start-up of the CLI and of the no-op path

    return GitEnv(child_env(env), env.get(deadlines.GIT_LOCAL.variable))


def recorded(env: Mapping[str, str], keys: Iterable[str]) -> RecordedEnv:
    """The variables of ``keys`` and every ``AITER_CONFIG_*`` (:class:`qola.store.fastpath.RecordedEnv`)."""
    return RecordedEnv.of(env, keys)


def only(env: Mapping[str, str], keys: Iterable[str]) -> dict[str, str]:
    """The variables of ``keys`` that ``env`` sets: what one stage reads, and nothing else."""
    return {k: env[k] for k in keys if k in env}


# what the plan reads of the environment besides the variables the tree names (qola.plan.planner,
# qola.plan.tree.aiter)
PLAN_VARIABLES = ("CK_DIR", "ENABLE_CK", "AITER_ENABLE_EXPERIMENTAL")


def tree_env(env: Mapping[str, str], tree: AiterTree) -> dict[str, str]:
    """What the tree's evaluation may read (AITER's core.py and its config lookups read the
    environment, as AITER does): every variable its module table or core.py names as a string,
    ``AITER_CONFIG_*`` and :data:`PLAN_VARIABLES`. Resolved once, before the plan is made."""
    from qola.plan.tree.files import MAX_CORE, MAX_TABLE, read_small  # lazy: start-up of the CLI and of the no-op path

    texts = []
    for path, limit in ((tree.table_path, MAX_TABLE), (tree.core_path, MAX_CORE)):
        with contextlib.suppress(OSError, QolaError):  # checked (a FIFO or a device is never waited on)
            texts.append(read_small(path, limit=limit, what="tree file").decode("utf-8", errors="replace"))

    def named(key: str) -> bool:  # a string literal, in Python or escaped inside the table's JSON strings
        quoted = re.compile(r"""\\?['"]""" + re.escape(key) + r"""\\?['"]""")
        return any(key in t and quoted.search(t) for t in texts)  # the substring test first: no scan

    return {k: v for k, v in env.items() if k in PLAN_VARIABLES or k.startswith(ENV_PREFIXES) or named(k)}


def views(env: Mapping[str, str]) -> tuple[ChildEnv, ToolchainEnv, GeneratorEnv]:
    """What the stages after planning read of ``env``, resolved once: the environment every child
    runs under (opaque), the toolchain's variables (:mod:`qola.toolchain.env`) and the generators'
    deadline and listing cache (:class:`qola.plan.variants.GeneratorEnv`)."""
    from qola.plan.listcache import cache_dir  # lazy: start-up of the CLI and of the no-op path
    from qola.plan.variants import GeneratorEnv  # lazy: start-up of the CLI and of the no-op path
    from qola.toolchain.env import VARIABLES, ToolchainEnv  # lazy: start-up of the CLI and of the no-op path

    child = child_env(env)
    toolchain = ToolchainEnv(tuple(sorted(only(env, VARIABLES).items())), child)
    return (
        child,
        toolchain,
        GeneratorEnv(child, env.get(deadlines.GENERATOR.variable), cache_dir(only(env, ("XDG_CACHE_HOME", "HOME")))),
    )
