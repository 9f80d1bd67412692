"""What ``manifest.json``'s ``build`` entry records of a build's settings: those of the command line
that change the libraries and no file holds, and the environment the build read
(:mod:`qola.pipeline.reproduce` reads it back)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from qola.store.fastpath import RecordedEnv

if TYPE_CHECKING:
    from qola.pipeline.spec import BuildSpec

# not recorded: where programs are found (the compiler is pinned by path instead), what only changes
# the job count, and the archs (recorded on their own)
UNRECORDED = frozenset({"PATH", "PYTHONPATH", "MAX_JOBS", "GPU_ARCHS"})


def command_record(spec: BuildSpec) -> dict[str, Any]:
    """What manifest.json's ``build`` entry records of the command line (:func:`settings_record`)."""
    return {
        "isolate": bool(spec.isolate),
        "allow_unpinned": bool(spec.allow_unpinned),
        "groups": list(spec.groups),
        "skip_checkout": bool(spec.skip_checkout),
        "usage_files": [os.path.abspath(f) for f in spec.usage_files],
    }


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
