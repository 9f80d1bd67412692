"""``qola audit --reproduce OUT``: rebuild what OUT was built from, elsewhere, and compare the bytes.

OUT's ``manifest.json`` records what the rebuild needs: the manifest (path, sha256), the kernel tree
(path, commit), the archs, the default mode, the toolchain (compiler, identity, flags) and, under
``build`` (:func:`qola.pipeline.record.settings_record`), what no file holds: ``--no-isolation``, ``--allow-unpinned``
and the environment variables that decide the plan or the compilers' output. :func:`reproduce`
builds that again in a fresh temporary directory — so with another build dir and output dir than
the original's — with no compiler launcher and without qola's compile cache (either would hand back the original objects), the
compiler found as for any build in the auditor's environment (a different one is noted: the
toolchain identity differs) and of the recorded environment only the variables qola declares as
build inputs that are data, each checked as a build checks it (:func:`rebuild_env`: nothing recorded
in an output is run or passed to what runs; a loader, injection or search-path variable never is), then compares
every library the manifest records
(sha256) with the rebuilt one and with the file in OUT. The temporary directory is removed.

It imports :mod:`qola.pipeline.run` (the rebuild) only when it runs: ``qola audit`` without
``--reproduce`` stays light.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qola.core import inputs, settings
from qola.core.errors import QolaError
from qola.core.rules import referenced_env
from qola.core.secret import credential_name, recorded_value
from qola.output.record import ModuleRecord
from qola.pipeline import run as pipeline
from qola.pipeline.record import BuildRecord
from qola.plan.tree.aiter import TABLE
from qola.plan.tree.aiter_core import CORE
from qola.plan.tree.files import MAX_CORE, MAX_TABLE, read_small
from qola.store.fastpath import ENV_PREFIXES
from qola.toolchain.identity import COMPILER_ENV, TOOLCHAIN_ENV

HINT_REBUILD = "rebuild OUT with this qola (qola build … -o OUT), then audit it"


@dataclass(frozen=True)
class Row:
    """One recorded library: its OUT-relative path, the sha256 recorded, rebuilt and found in OUT."""

    file: str
    recorded: str
    rebuilt: str | None  # None: the rebuild did not produce it
    in_out: str | None  # None: missing from OUT

    @property
    def result(self) -> str:
        if self.rebuilt is None:
            return "not rebuilt"
        if self.rebuilt != self.recorded:
            return "differs"
        if self.in_out != self.recorded:
            return "missing in OUT" if self.in_out is None else "altered in OUT"
        return "match"

    @property
    def ok(self) -> bool:
        return self.result == "match"


@dataclass
class Reproduction:
    rows: list[Row]
    notes: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # besides the rows (a module that failed to rebuild)

    @property
    def ok(self) -> bool:
        return not self.problems and all(r.ok for r in self.rows)

    def table(self) -> str:
        head = ("file", "recorded", "rebuilt", "result")
        body = [(r.file, r.recorded[:12], (r.rebuilt or "-")[:12], r.result) for r in self.rows]
        width = [max(len(x[i]) for x in (head, *body)) for i in range(3)]
        return "\n".join(
            "  " + "  ".join(c.ljust(w) for c, w in zip(line, width, strict=False)) + "  " + line[3]
            for line in (head, *body)
        )


def _sha256(path: Path) -> str | None:
    try:
        return inputs.sha256_checked(path, limit=1 << 40, what="file")[0]
    except (OSError, QolaError):
        return None


def _get(data: Any, *keys: str) -> Any:
    for key in keys:
        data = data.get(key) if isinstance(data, Mapping) else None
    return data


def libraries(data: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(OUT-relative artifact, recorded sha256) of every built module in ``data`` (manifest.json)."""
    libs = []
    for raw in data.get("modules") or []:
        m = ModuleRecord.parse(raw) if isinstance(raw, Mapping) else None
        if m is not None and m.built:
            if m.artifact is None or m.sha256 is None:
                raise QolaError(
                    f"manifest.json: module {m.name!r} is built but records no artifact and sha256", hint=HINT_REBUILD
                )
            libs.append((m.artifact, m.sha256))
    if not libs:
        raise QolaError("manifest.json records no built library: nothing to reproduce")
    return libs


def _inside(path: str, root: Path) -> bool:
    real, top = os.path.realpath(path), os.path.realpath(root)
    return real == top or real.startswith(top.rstrip("/") + "/")


def _inputs(data: Mapping[str, Any], root: Path) -> tuple[str, str, BuildRecord]:
    """(manifest path, tree path, build settings), each checked: what the rebuild reads must be
    what the build read, and neither the manifest nor the tree may lie inside OUT (whoever can
    write OUT could have put them there, with flags or generators of their own)."""
    settings = BuildRecord.parse(data.get("build"))
    if settings is None:
        raise QolaError(
            "manifest.json does not record the build's settings (written by an older qola)", hint=HINT_REBUILD
        )
    manifest, want = _get(data, "manifest", "path"), _get(data, "manifest", "sha256")
    tree = _get(data, "tree", "path")
    if not isinstance(manifest, str) or not isinstance(tree, str) or not isinstance(want, str):
        raise QolaError(
            "manifest.json does not record the manifest's path and sha256 and the tree's path", hint=HINT_REBUILD
        )
    for what, where in (("manifest", manifest), ("kernel tree", tree)):
        if _inside(where, root):
            raise QolaError(
                f"manifest.json names a {what} inside the output itself ({where}): not rebuilt, an output's "
                "own files are never run or compiled",
                hint="audit --reproduce rebuilds from the manifest and tree the build read, outside OUT",
            )
    got = _sha256(Path(manifest))
    if got is None:
        raise QolaError(
            f"the manifest OUT was built from, {manifest}, cannot be read",
            hint="audit --reproduce rebuilds from the recorded manifest and tree on this machine",
        )
    if got != want:
        raise QolaError(
            f"the manifest {manifest} changed since OUT was built (sha256 {got[:12]}…, recorded {want[:12]}…)",
            hint="restore it, or rebuild OUT from it",
        )
    if not os.path.isdir(tree):
        raise QolaError(
            f"the kernel tree OUT was built from, {tree}, is not a directory",
            hint="audit --reproduce rebuilds from the recorded manifest and tree on this machine",
        )
    return manifest, tree, settings


def _tree_env_keys(tree: str) -> set[str]:
    """The variables the tree's module table and core.py read (recomputed from the tree, never taken
    from the output's record)."""

    texts = []
    for rel, limit in ((TABLE, MAX_TABLE), (CORE, MAX_CORE)):
        try:
            texts.append(read_small(Path(tree) / rel, limit=limit, what=rel).decode("utf-8", "replace"))
        except (OSError, QolaError):
            continue
    return set(referenced_env(texts))


# never applied from a record: what makes a program load, run or look up something (a loader, an
# interpreter's startup, flags prepended or appended to every compile, a search path, where programs
# are found), whatever its name says it is
_RUNNER_PREFIXES = ("LD_", "DYLD_", "PYTHON", "PERL", "RUBY", "NODE_", "BASH_", "GCONV_", "MALLOC_")
_RUNNER_SUFFIXES = ("FLAGS", "OPTIONS", "PATH", "_DIR", "_HOME", "_ROOT", "_PREFIX", "_ENV")
_RUNNER_NAMES = frozenset({"ENV", "SHELLOPTS", "IFS", "HOME", "TMPDIR"})
# the settings whose variables are data, each applied only with a value its own check accepts
_DATA_SETTINGS = (settings.JOBS, settings.ARCHS, settings.GROUPS)
_PLAIN = re.compile(r"(?:[A-Za-z0-9_.,:+=][A-Za-z0-9_.,:+=-]{0,255})?")


def _runner(key: str) -> bool:
    """Whether ``key`` is a loader, injection or search-path variable (or one that picks a program)."""
    return (
        key in COMPILER_ENV
        or key in TOOLCHAIN_ENV
        or key in _RUNNER_NAMES
        or key.startswith(_RUNNER_PREFIXES)
        or key.endswith(_RUNNER_SUFFIXES)
    )


def _refusal(key: str, value: str, tree_keys: set[str]) -> str | None:
    """Why a recorded variable is not set again for the rebuild (None: it is). Only what qola
    declares as a build input and is data (:data:`qola.store.fastpath.ENV_KEYS`' data settings,
    AITER's tuned-config paths, what the tree's own table reads, the time that fixes __DATE__),
    each checked as a build checks it; never a :func:`_runner` variable."""
    if key == "SOURCE_DATE_EPOCH":
        return None if value.isdigit() and len(value) <= 12 else "not a plain number of seconds"
    if _runner(key):
        return "it makes a program load, run or look up something"
    for setting in _DATA_SETTINGS:
        if key in setting.env:
            try:
                setting.check(value, key)
            except QolaError as exc:
                return f"a build refuses it ({exc.message})"
            return None
    if key.startswith(ENV_PREFIXES):
        return None if "\0" not in value else "not a path"
    if key in tree_keys:
        return None if _PLAIN.fullmatch(value) else "the tree's table reads it, but the value is not a plain word"
    return "qola does not declare it as a build input"


def rebuild_env(
    data: Mapping[str, Any], settings: BuildRecord, env: Mapping[str, str], tree: str | None = None
) -> tuple[dict[str, str], list[str]]:
    """(the rebuild's environment, notes). Nothing an output records is ever run or given to what
    runs: the compiler is found as for any build, in the auditor's own environment, and of the
    recorded variables only declared data (:func:`_refusal` gives no reason) are set again as they were (set or
    unset); every other recorded value that differs from the auditor's is named in a note, for the
    auditor to set by hand if they trust it."""
    tree_keys = _tree_env_keys(tree) if tree else set()
    recorded = dict(settings.env)
    out, notes = dict(env), []
    for key in sorted(set(settings.env_keys) | set(recorded)):
        value = recorded.get(key)
        if value is not None and key in env and recorded_value(key, env[key]) == value:
            continue  # the auditor's own value is the one recorded (a credential's only as its digest)
        if value is not None and credential_name(key):
            notes.append(
                f"manifest.json records {key} as a digest (a credential is never kept); here it is "
                f"{'unset' if key not in env else 'another value'}: set it as it was at the build to rebuild the same"
            )
            continue
        why = _refusal(key, value, tree_keys) if value is not None else None
        if value is not None and why is not None:
            if env.get(key) != value:
                notes.append(
                    f"manifest.json records {key}={value!r} (here {env.get(key)!r}); not applied: {why}, and "
                    "qola never runs or passes on what an output records. Set it yourself if you trust it"
                )
            continue
        if value is None and key in env and _refusal(key, env[key], tree_keys) is None:
            out.pop(key)  # unset at the build, as recorded
        elif value is not None:
            out[key] = value
    for key in [k for k in out if k.startswith(ENV_PREFIXES) and k not in recorded]:
        out.pop(key)
    return out, notes


def reproduce(
    root: Path,
    data: Mapping[str, Any],
    *,
    jobs: int | None = None,
    env: Mapping[str, str] | None = None,
    work_dir: str | None = None,
    on_start: Callable[[Path], None] | None = None,
) -> Reproduction:
    """Rebuild the build ``data`` (OUT's manifest.json; ``root`` holds the files it records) in a
    temporary directory under ``work_dir`` (default: the system's) and compare the libraries.
    ``on_start`` hears the directory once the inputs are checked and the rebuild starts."""

    libs = libraries(data)
    manifest, tree, settings = _inputs(data, root)
    archs = data.get("archs")
    rebuild_env_, env_notes = rebuild_env(data, settings, os.environ if env is None else env, tree)
    tmp = Path(tempfile.mkdtemp(prefix="qola-reproduce-", dir=work_dir))
    try:
        if on_start is not None:
            on_start(tmp)
        spec = pipeline.BuildSpec.make(
            manifest,
            aiter_root=tree,
            output_dir=str(tmp / "out"),
            build_dir=str(tmp / "build"),
            archs=tuple(archs) if isinstance(archs, list) else (),
            mode=data.get("mode"),
            jobs=jobs,
            allow_unpinned=settings.asked.allow_unpinned,
            isolate=settings.asked.isolate,
            groups=settings.asked.groups,
            usage_files=settings.asked.usage_files,  # --usage
            skip_checkout=True,  # the rebuild uses the recorded tree as it is (a recorded pin mismatch included)
            no_cache=True,  # every unit compiled again: the compile cache would hand back the original objects
            env=rebuild_env_,
        )
        report = pipeline.build(spec)
        result = Reproduction([])
        result.notes += env_notes
        result.notes.append(f"rebuilt in {tmp} (removed)")
        result.problems += [f"{r.name}: failed to rebuild: {r.error}" for r in report.modules if not r.built]
        rebuilt = tmp / "out"
        new = _load(rebuilt / "manifest.json")
        for what, keys in (
            ("toolchain", ("toolchain", "identity")),
            ("tree commit", ("tree", "commit")),
            ("build key", ("build_key",)),
        ):  # a different key: the inputs changed since
            if _get(new, *keys) != _get(data, *keys):
                result.notes.append(
                    f"the {what} differs from the build's: {_get(data, *keys)} then, {_get(new, *keys)} now"
                )
        for rel, sha in libs:
            result.rows.append(Row(rel, sha, _sha256(rebuilt / rel), _sha256(Path(root) / rel)))
        return result
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _load(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(inputs.read_record(path))
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}
