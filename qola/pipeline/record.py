"""What ``manifest.json``'s ``build`` entry records of a build's settings: those of the command line
that change the libraries and no file holds, and the environment the build read
(:mod:`qola.pipeline.reproduce` reads it back)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from qola.store.fastpath import RecordedEnv

# not recorded: where programs are found (the compiler is pinned by path instead), what only changes
# the job count, and the archs (recorded on their own)
UNRECORDED = frozenset({"PATH", "PYTHONPATH", "MAX_JOBS", "GPU_ARCHS"})


@dataclass(frozen=True)
class CommandRecord:
    """What ``manifest.json``'s ``build`` entry records of the command line
    (:func:`qola.pipeline.spec.command_record`): the settings that change the libraries and no file holds."""

    isolate: bool = True
    allow_unpinned: bool = False
    groups: tuple[str, ...] = ()
    skip_checkout: bool = False
    usage_files: tuple[str, ...] = ()  # absolute


@dataclass(frozen=True)
class BuildRecord:
    """``manifest.json``'s ``build`` entry (:func:`settings_record`): the command line's part and the
    environment the build read (``env_keys``; ``env``: the values of those set)."""

    asked: CommandRecord
    env_keys: tuple[str, ...]
    env: Mapping[str, str]

    def to_json(self) -> dict[str, object]:
        """Its JSON form, as manifest.json holds it."""
        a = self.asked
        return {
            "isolate": a.isolate,
            "allow_unpinned": a.allow_unpinned,
            "env_keys": list(self.env_keys),
            "env": dict(self.env),
            "groups": list(a.groups),
            "skip_checkout": a.skip_checkout,
            "usage_files": list(a.usage_files),
        }

    @classmethod
    def parse(cls, raw: object) -> BuildRecord | None:
        """The entry read back from manifest.json (None: not recorded, an older qola), as leniently
        as ``qola audit --reproduce`` always read it: a value of another type counts as absent
        (``isolate`` and ``allow_unpinned`` as their truth), an entry of ``groups``, ``usage_files``
        or ``env_keys`` that is no string is left out, ``env``'s values are read as strings."""
        if not isinstance(raw, Mapping):
            return None

        def strings(key: str) -> tuple[str, ...]:
            value = raw.get(key)
            return tuple(v for v in value if isinstance(v, str)) if isinstance(value, list) else ()

        env = raw.get("env")
        keys = raw.get("env_keys")
        asked = CommandRecord(
            isolate=bool(raw.get("isolate", True)),
            allow_unpinned=bool(raw.get("allow_unpinned")),
            groups=strings("groups"),
            skip_checkout=bool(raw.get("skip_checkout")),
            usage_files=strings("usage_files"),
        )
        return cls(
            asked,
            tuple(str(k) for k in keys) if isinstance(keys, list) else (),
            {str(k): str(v) for k, v in env.items()} if isinstance(env, Mapping) else {},
        )


def settings_record(asked: CommandRecord, env: RecordedEnv | Mapping[str, str], env_keys: Sequence[str]) -> BuildRecord:
    """``manifest.json``'s ``build`` entry: the settings of the command line (``asked``,
    :func:`qola.pipeline.spec.command_record`) that change the libraries and no file holds, and the
    environment the build read: ``env_keys`` (the fixed list and what the module table reads,
    :func:`qola.store.fastpath.env_keys_of`) and every ``AITER_CONFIG_*``, with the values of those
    set (the others were unset)."""
    view = env if isinstance(env, RecordedEnv) else RecordedEnv.of(env, env_keys)
    keys = sorted({k for k in env_keys if k not in UNRECORDED} | {k for k, _ in view.prefixed()})
    return BuildRecord(asked, tuple(keys), view.only(keys))
