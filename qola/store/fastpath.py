"""No-op fast path for ``qola build``: standard library only, so an up-to-date build answers in
milliseconds instead of paying for the manifest schema, the resolver and the toolchain probe.

After a fully successful build, :func:`record` stores a digest over everything the graph was
derived from: the command line and working dir, the interpreter (:func:`interpreter`), the environment variables that can change it
(:data:`ENV_KEYS`, every ``AITER_CONFIG_*`` variable, what the module table reads, and every
variable a generator looked up when it last ran, :func:`qola.compile.codegen.recorded_variables`:
the record names those, their values enter the digest only as fingerprints), where the
paths given on the command line resolve to (``--manifest``, ``--aiter-root`` and the compilers may be
symlinks, re-pointed between two runs), and the (size, mtime, ctime, inode) of every input file and
directory that ninja itself does not track (the manifest, the module table, generator scripts and
the tuned-config CSVs they read, source and include dirs, hsa dirs, compilers, qola's own files)
plus every file it published. :func:`load` reads it back and :func:`unchanged` recomputes that digest (over a
:class:`RecordedEnv`: the variables it names, resolved once); :func:`nothing_to_do` asks
``ninja -n`` whether any edge is dirty; only when both agree is the build skipped.

The record also covers what the pipeline itself wrote for the graph (``build.ninja``, the toolchain
stamp, version scripts, the generated dirs' listings and stamps, the incremental path's recipe,
:mod:`qola.compile.rebuild`): when ``rebuild`` is set and the digest holds, stages 1-8 of a build would
change nothing, and a dirty edge is ninja's work alone (:func:`rerecord` then notes the new output).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import qola
from qola.compile.layout import NOOP_RECORD
from qola.core import inputs, proc, rules
from qola.core.secret import fingerprint, recorded_value, redact_argv
from qola.toolchain.identity import COMPILER_ENV, TOOLCHAIN_ENV

if TYPE_CHECKING:
    from qola.compile.rebuild import Run
    from qola.store.key import Material

RECORD = NOOP_RECORD
FORMAT = 4  # 4: the interpreter (3: the variables the generators looked up, gen_env_keys)
# what planning reads, what finds and configures the toolchain, what the compilers read (one list,
# qola.toolchain.identity, shared with the build graph's toolchain stamp)
ENV_KEYS = tuple(
    sorted(
        {
            "GPU_ARCHS",
            "MAX_JOBS",
            "CK_DIR",
            "PYTHONPATH",
            "QOLA_BUILD_GROUPS",
            "QOLA_AITER_SOURCE_DIR",
            "NVTE_AITER_SOURCE_DIR",
            "QOLA_AITER_URL",
            "QOLA_FORCE_AITER_CHECKOUT",
            "XDG_CACHE_HOME",
            *TOOLCHAIN_ENV,
            *COMPILER_ENV,
        }
    )
)
ENV_PREFIXES = ("AITER_CONFIG_",)  # AITER's tuned-config overrides: every one set counts, by name and value


def env_keys_of(texts: Iterable[str], modules: Collection[str] | None = None) -> list[str]:
    """The fixed keys plus :func:`qola.core.rules.referenced_env` (of the ``modules`` built)."""
    return sorted(set(ENV_KEYS) | set(rules.referenced_env(texts, modules)))


@dataclass(frozen=True)
class RecordedEnv:
    """What the no-op record, the build key and manifest.json's ``build`` entry read of the build's
    environment, resolved once (:func:`qola.pipeline.spec.resolve`): the variables of ``names`` that
    are set, and every ``AITER_CONFIG_*``. Reading a variable ``names`` does not hold raises (a
    digest over a variable the view was not resolved for would compare an unset one). A URL's
    credentials in a value (``QOLA_AITER_URL=https://user:pw@host/…``) are masked here, the one place
    the view is made: they change nothing that is built, and no record, key or digest holds them; a
    variable whose name says it is a credential (``HF_TOKEN``, ``*_KEY``, …) is held as a digest
    (:func:`qola.core.secret.recorded_value`: a change still counts, the value is never kept)."""

    names: frozenset[str]
    values: tuple[tuple[str, str], ...]

    @classmethod
    def of(cls, env: Mapping[str, str], names: Iterable[str]) -> RecordedEnv:
        keys = frozenset(names)
        held = {k: recorded_value(k, v) for k, v in env.items() if k in keys or k.startswith(ENV_PREFIXES)}
        return cls(keys, tuple(sorted(held.items())))

    def covers(self, keys: Iterable[str]) -> bool:
        return all(k in self.names or k.startswith(ENV_PREFIXES) for k in keys)

    def get(self, key: str, default: str | None = None) -> str | None:
        if not self.covers((key,)):
            raise KeyError(f"{key} is not among the recorded variables this view was resolved for")
        return dict(self.values).get(key, default)

    def only(self, keys: Iterable[str]) -> dict[str, str]:
        """The variables of ``keys`` that are set (each must be one the view holds)."""
        return {k: v for k in keys if (v := self.get(k)) is not None}

    def prefixed(self) -> list[tuple[str, str]]:
        """Every ``AITER_CONFIG_*`` set, sorted."""
        return [(k, v) for k, v in self.values if k.startswith(ENV_PREFIXES)]


def _view(env: Mapping[str, str] | RecordedEnv, keys: Iterable[str]) -> RecordedEnv:
    return env if isinstance(env, RecordedEnv) else RecordedEnv.of(env, keys)


def _stat(path: str) -> list[str | int | None]:
    try:
        st = os.stat(path)
    except OSError:
        return [path, None]
    # ctime and inode: a file replaced or rewritten with its size and mtime kept still differs
    return [path, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]


def interpreter() -> list[str]:
    """The running interpreter's identity (its real path, version and cache tag): the generators run
    under it and the build's Python modules are built for it, so a build under another Python is no
    no-op (TE's CMake runs ``python -m qola.cli`` with ``PYTHONPATH=<checkout>`` under whichever Python)."""
    return [os.path.realpath(sys.executable), sys.version, str(sys.implementation.cache_tag)]


def digest(
    argv: Sequence[str],
    env: Mapping[str, str] | RecordedEnv,
    env_keys: Sequence[str],
    files: Sequence[str],
    resolved: Sequence[str] = (),
    gen_env: Mapping[str, str | None] | None = None,
) -> str:
    view = _view(env, env_keys)
    payload = {
        "gen_env": dict(gen_env or {}),
        "format": FORMAT,
        "python": interpreter(),
        "argv": redact_argv(argv),
        "cwd": os.getcwd(),
        "env": {k: view.get(k) for k in env_keys},
        "env_prefixed": [list(kv) for kv in view.prefixed()],
        "resolved": {p: os.path.realpath(p) for p in resolved},
        "files": [_stat(f) for f in files],
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def published_files(out: Path) -> list[str]:
    """Every file of OUT's published entries (never ``.qola``, nor a kernel tree kept inside OUT)."""
    from qola.output.outdir import DIRS, MANIFEST_JSON  # lazy: standard library only

    found = [str(out / MANIFEST_JSON)] if (out / MANIFEST_JSON).is_file() else []
    for top in DIRS:
        for d, _, files in os.walk(out / top):
            found += [os.path.join(d, f) for f in files if os.path.isfile(os.path.join(d, f))]
    return sorted(found)


@dataclass(frozen=True)
class Recorded:
    """What the no-op record holds besides the output: the command line, the environment and the
    names of it that count, the input files; ``resolved``: paths as given (absolute, not resolved)
    whose target must stay the same; ``rebuild``: how the incremental path runs ninja (its recipe was
    written, and is among ``inputs``); ``key``: the build key's material
    (:class:`qola.store.key.Material`), for the incremental path."""

    argv: Sequence[str]
    env: Mapping[str, str] | RecordedEnv
    env_keys: Sequence[str]
    inputs: Iterable[str]
    resolved: Iterable[str] = ()
    rebuild: Run | None = None
    key: Material | None = None
    gen_env: Mapping[str, str | None] = field(default_factory=dict)  # the generators' variables: fingerprints


@dataclass(frozen=True)
class NoopRecord:
    """The no-op record of the last successful build, as :func:`load` read it back (``.qola-noop.json``:
    :func:`record` writes it). ``env_keys`` and ``gen_env_keys``: the variables its ``digest`` covers
    (qola's, and the generators' by fingerprint); ``rebuild`` and ``key``: what the incremental path
    needs (None: it has none, the full path runs)."""

    argv: tuple[str, ...]  # as recorded: a URL's credentials masked
    env_keys: tuple[str, ...]
    files: tuple[str, ...]
    resolved: tuple[str, ...]
    gen_env_keys: tuple[str, ...]
    digest: str
    rebuild: Run | None = None
    key: Material | None = None

    def names(self) -> list[str]:
        """Every variable the record digests: qola's and the generators'."""
        return [*self.env_keys, *self.gen_env_keys]

    @classmethod
    def of(cls, data: object) -> NoopRecord:
        """From the JSON :func:`record` writes; TypeError, KeyError or ValueError for anything else
        (``rebuild`` and ``key`` parsed by their own types)."""
        from qola.compile.rebuild import Run  # lazy: parsed only when a record is read
        from qola.store.key import Material  # lazy: as Run

        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ValueError("not a no-op record of this format")
        rebuild, key, digest_ = data.get("rebuild"), data.get("key"), data["digest"]
        if not isinstance(digest_, str):
            raise TypeError("digest: not a string")
        return cls(
            _strings(data["argv"]),
            _strings(data["env_keys"]),
            _strings(data["files"]),
            _strings(data["resolved"]),
            _strings(data["gen_env_keys"]),
            digest_,
            None if rebuild is None else Run.of(rebuild),
            None if key is None else Material.of(key),
        )


def _strings(value: object) -> tuple[str, ...]:
    """A JSON list of strings, or TypeError."""
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise TypeError("not a list of strings")
    return tuple(value)


def generator_env(env: RecordedEnv, keys: Iterable[str]) -> dict[str, str | None]:
    """The fingerprint (:func:`qola.core.secret.fingerprint`; None: unset) of each of ``keys`` in
    ``env``: the variables the generators looked up, as the no-op record's digest holds them."""
    return {k: None if (v := env.get(k)) is None else fingerprint(v) for k in keys}


def record(build_dir: Path, out: Path, what: Recorded) -> None:
    """Write the no-op record of a build of ``out`` into ``build_dir``."""
    files = sorted(set(what.inputs)) + published_files(out)
    links = sorted(set(what.resolved))
    data = {
        "format": FORMAT,
        "argv": redact_argv(what.argv),  # a URL's credentials never enter the record (nor the key)
        "env_keys": list(what.env_keys),
        "files": files,
        "resolved": links,
        "rebuild": None if what.rebuild is None else what.rebuild.to_json(),
        "key": None if what.key is None else what.key.to_json(),
        # the names alone: their values only in the digest, as fingerprints (a variable may hold a secret)
        "gen_env_keys": sorted(what.gen_env),
        "digest": digest(what.argv, what.env, what.env_keys, files, links, what.gen_env),
    }
    from qola.core.fsutil import atomic_write  # lazy: not on the no-op path

    atomic_write(build_dir / RECORD, json.dumps(data).encode())


def rerecord(build_dir: Path, out: Path, last: NoopRecord, env: Mapping[str, str] | RecordedEnv) -> None:
    """After an incremental build: the record ``last`` (what :func:`unchanged` returned, its
    ``rebuild`` the run after this build) over the same inputs (the recipe rewritten) and the new
    output."""
    prefix = str(out) + os.sep
    again = Recorded(
        last.argv,
        env,
        last.env_keys,
        [f for f in last.files if not f.startswith(prefix)],
        last.resolved,
        rebuild=last.rebuild,
        key=last.key,
        gen_env=generator_env(_view(env, last.names()), last.gen_env_keys),
    )
    record(build_dir, out, again)


def forget(build_dir: Path) -> None:
    with contextlib.suppress(OSError):
        (build_dir / RECORD).unlink()


def load(build_dir: Path, argv: Sequence[str]) -> NoopRecord | None:
    """The record of the last successful build when it was made by this command line and is one
    this qola wrote (its ``env_keys`` say which variables :func:`unchanged` needs), else None."""
    try:
        last = NoopRecord.of(json.loads(inputs.read_record(build_dir / RECORD)))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return last if list(last.argv) == redact_argv(argv) else None


def unchanged(last: NoopRecord, build_dir: Path, out: Path, env: RecordedEnv) -> NoopRecord | None:
    """The record ``last`` (:func:`load`) when nothing it was derived from changed (and OUT holds
    what it published), else None. ``env``: the variables it names, resolved from the build's
    environment (one that does not cover them: None, a build)."""
    try:
        if not env.covers(last.names()):
            return None
        from qola.output.outdir import interrupted  # lazy: paid only by the callers that need it

        if interrupted(out):  # a publish was killed mid-switch: the full path completes it
            return None
        if published_files(out) != [f for f in last.files if f.startswith(str(out) + os.sep)]:
            return None
        gen_env = generator_env(env, last.gen_env_keys)
        if digest(last.argv, env, last.env_keys, last.files, last.resolved, gen_env) != last.digest:
            return None
    except (OSError, ValueError):
        return None  # a file it names is unreadable: build
    return last


def nothing_to_do(build_dir: Path, ninja: str) -> bool:
    """``ninja -n`` finds no dirty edge."""
    try:
        done = proc.run([ninja, "-C", str(build_dir), "-n"], timeout=120, out=proc.SEPARATE)
    except (OSError, proc.TimeoutExpired):
        return False
    return done.returncode == 0 and "no work to do" in done.stdout


@dataclass(frozen=True)
class GraphInputs:
    """What the graph depends on that ninja does not track itself (:func:`input_files`)."""

    manifest: str
    tree_files: Iterable[str]
    dirs: Iterable[str]
    generator_scripts: Iterable[str]
    tools: Iterable[str | None]
    data: Iterable[str] = ()
    data_dirs: Iterable[str] = ()
    listed_dirs: Iterable[str] = ()
    written: Iterable[str] = ()


def input_files(given: GraphInputs) -> list[str]:
    """Everything the graph depends on that ninja does not track itself. ``data``: files generators
    read (tuned-config CSVs, absent ones too: their appearance counts); ``data_dirs``: directories
    whose every file and subdir counts (``aiter/configs``: a new per-model CSV changes a merge, the
    embedded code objects); ``listed_dirs``: directories whose listing counts, with their subdirs
    (the generated sources); ``written``: files qola wrote for the graph."""
    tools = list(given.tools)
    files = [given.manifest, *given.tree_files, *given.data, *given.written]
    from qola.compile.codegen import recorded_inputs  # lazy: read when a build is recorded, not on the no-op path

    for d in given.listed_dirs:
        for top, _, _ in os.walk(d):
            files.append(top)
        files += recorded_inputs(Path(d))  # what its generators read (their depfile, issue 41)
    for d in given.data_dirs:
        if os.path.isdir(d):
            files.append(d)
            files += [str(p) for p in Path(d).rglob("*")]
    pkg = Path(qola.__file__).resolve().parent  # the package's root, wherever this module lies
    files += [str(p) for p in pkg.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    for d in given.dirs:
        if os.path.isdir(d):
            files.append(d)
            files += [str(p) for p in Path(d).rglob("*") if p.is_dir()] if d.endswith("/hsa") else []
    for script in given.generator_scripts:
        p = Path(script)
        if p.suffix == ".py" and p.exists():
            files += [str(f) for f in p.parent.rglob("*.py") if "__pycache__" not in f.parts]
            files.append(str(p.parent))
    files += [t for t in tools if t]
    files += [os.path.realpath(t) for t in tools if t]
    return files
