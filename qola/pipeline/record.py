"""What ``manifest.json``'s ``build`` entry records of a build's settings: those of the command line
that change the libraries and no file holds, and the environment the build read
(:mod:`qola.pipeline.reproduce` reads it back)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from qola.store.fastpath import RecordedEnv

# not recorded: where programs are found (the compiler is pinned by path instead), what only changes
# the job count, and the archs (recorded on their own)
UNRECORDED = frozenset({"PATH", "PYTHONPATH", "MAX_JOBS", "GPU_ARCHS"})


def settings_record(
    asked: Mapping[str, Any], env: RecordedEnv | Mapping[str, str], env_keys: Sequence[str]
) -> dict[str, Any]:
    """``manifest.json``'s ``build`` entry: the settings of the command line (``asked``,
    :func:`command_record`) that change the libraries and no file holds, and the environment the
    build read: ``env_keys`` (the fixed list and what the module table reads,
    :func:`qola.store.fastpath.env_keys_of`) and every ``AITER_CONFIG_*``, with the values of those
    set (the others were unset)."""
    view = env if isinstance(env, RecordedEnv) else RecordedEnv.of(env, env_keys)
    keys = sorted({k for k in env_keys if k not in UNRECORDED} | {k for k, _ in view.prefixed()})
    return {
        "isolate": asked["isolate"],
        "allow_unpinned": asked["allow_unpinned"],
        "env_keys": keys,
        "env": view.only(keys),
        "groups": asked["groups"],
        "skip_checkout": asked["skip_checkout"],
        "usage_files": asked["usage_files"],
    }
