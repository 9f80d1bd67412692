"""Publish a build into the output dir: all or nothing for qola's readers, whole dirs for everyone.

``OUT/lib``, ``include``, ``configs``, ``jit``, ``share``, ``logs`` are real directories and
``OUT/manifest.json`` a real file, so consumers copy them with ``file(COPY)``, ``cp -r`` or tar. A
publish fills a private staging dir ``OUT/.qola/.stage-<pid>-…`` (every file copied and fsynced —
a reflink or in-kernel copy where the file system offers one, never a hard link), then switches it
in entry by entry (:mod:`qola.output.outdir`: ``renameat2(RENAME_EXCHANGE)``, manifest.json last, rolled
forward by the next qola command if killed). The previous version stays whole in
``OUT/.qola/prev`` until the next publish (a process that loaded its libraries keeps finding their
JIT sources there).

Only what this build produced enters the new version: a failed module has no library, headers,
JIT tree or consumer entry there, whatever an earlier build published. Nothing is ever deleted by a
name or pattern that came from input. ``manifest.json`` records every file of its version (path,
size, sha256) for ``qola audit``, and QoLA's fields (``generated_at``, ``gpu_archs``, per module
``success``, ``so_path``, ``error``, ``summary``). Every destination is built with
:func:`qola.core.fsutil.inside`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from qola import __version__
from qola.compile import codegen
from qola.compile.layout import BuildLayout
from qola.compile.results import CompileReport, Status
from qola.core import inputs
from qola.core.errors import QolaError
from qola.core.fsutil import (
    atomic_copy,
    atomic_write,
    copy_file,
    fsync_dir,
    inside,
    remove,
    remove_stale,
    remove_stale_trees,
)
from qola.output import outdir
from qola.output.outdir import DIRS, ENTRIES, MANIFEST_JSON, STAGE, STORE, check_output
from qola.output.record import FileRecord, ModuleRecord, summary
from qola.plan.tree.aiter_configs import CONFIGS
from qola.plan.tree.files import MAX_CSV, open_regular

__all__ = [
    "DIRS",
    "ENTRIES",
    "MANIFEST_JSON",
    "STORE",
    "atomic_copy",
    "atomic_write",
    "check_output",
    "generated_at",
    "install_version",
    "prepare",
    "publish",
    "publish_tree",
]


def prepare(out: Path, build_dir: Path) -> list[str]:
    """Before a build: complete a publish a killed run left half-switched, check ``out``
    (:func:`check_output`, so a refusal comes before compiling) and remove what killed runs left
    behind — publish staging dirs in OUT, generator staging dirs in the build dir, generator
    listings in the temp dir. One note per kind removed."""

    out = Path(out)
    notes = []
    if (out / STORE).is_dir() and not (out / STORE).is_symlink():
        with outdir.switching(out) as completed:
            if completed:
                notes.append(f"completed the publish a killed qola run left half-switched in {out}")
    check_output(out)
    layout = BuildLayout(Path(build_dir), out)
    found = {
        "publish staging": remove_stale(out / STORE, STAGE)
        + remove_stale(out / STORE, outdir.OLD)
        + remove_stale(out, outdir.LEGACY_LINK_TMP),
        "generator staging": codegen.clean_stale(layout.gen_root),
        "JIT staging": remove_stale_trees(layout.jit_out),
        "generator listing": remove_stale(tempfile.gettempdir(), codegen.LISTING_PREFIX),
    }
    for kind, paths in found.items():
        if paths:
            shown = ", ".join(str(p) for p in paths[:5]) + (f" (+{len(paths) - 5} more)" if len(paths) > 5 else "")
            notes.append(f"removed {len(paths)} {kind} dir(s) left by killed qola runs: {shown}")
    return notes


# -- one version, staged ------------------------------------------------------------------------

PUBLISHED = ".qola-published.json"  # BUILD/: what the last publish copied: each source's stat and sha256
LOG_MODE = 0o600  # OUT/logs/*.log: the user's alone (docs/design-notes.md, "What qola trusts")


def _src_key(path: Path, st: os.stat_result) -> list[str | int]:
    return [str(path), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]


@dataclass(frozen=True)
class Placed:
    """What a publish recorded about a source it copied (``BUILD/.qola-published.json``): its stat
    (:func:`_src_key`) and sha256."""

    src: list[str | int]
    sha256: str

    def to_json(self) -> dict[str, object]:
        return {"src": self.src, "sha256": self.sha256}


class _Stage:
    """The new version's tree, filled before anyone can see it. ``files``: OUT-relative path ->
    {sha256, size} of every file placed. Every file is a copy of its own (no hard link to the
    previous version or the build dir: an in-place edit of one never changes another). ``seen``:
    what the last publish recorded about each source it copied (its stat and sha256): a source
    whose stat did not move is copied in the kernel (a reflink where the file system offers one)
    without being read here; any other is read once, hashed as it is copied."""

    def __init__(self, root: Path, seen: Mapping[str, Placed] | None = None) -> None:
        self.root = root
        self.files: dict[str, FileRecord] = {}
        self.seen = seen or {}
        self.placed: dict[str, Placed] = {}  # what the next publish's ``seen`` will be

    def _dest(self, rel: str) -> Path:
        dst = inside(self.root, rel)
        if rel.strip("/") == MANIFEST_JSON:
            raise QolaError(f"refusing to publish a file over {MANIFEST_JSON}")
        dst.parent.mkdir(parents=True, exist_ok=True)
        remove(dst)  # a later source for the same path wins (texts after headers)
        return dst

    def copy(self, src: Path, rel: str, fd: int | None = None) -> None:
        """Copy ``src`` (or, given ``fd``, the checked open file it names) to ``rel`` in the stage."""
        dst = self._dest(rel)
        st = os.fstat(fd) if fd is not None else os.stat(src)
        key = _src_key(Path(src), st)
        known = self.seen.get(rel)
        if known is not None and known.src == key:
            copy_file(src if fd is None else f"/proc/self/fd/{fd}", dst, st.st_mode & 0o777)
            rec = FileRecord(known.sha256, st.st_size)
        else:
            h, size = hashlib.sha256(), 0
            source = open(src, "rb") if fd is None else os.fdopen(os.dup(fd), "rb")  # noqa: SIM115 (closed by the with below)
            with source as inp, open(dst, "xb") as out:
                while chunk := inp.read(1 << 20):
                    h.update(chunk)
                    out.write(chunk)
                    size += len(chunk)
                os.fchmod(out.fileno(), st.st_mode & 0o777)
                out.flush()
                os.fsync(out.fileno())
            rec = FileRecord(h.hexdigest(), size)
        after = os.stat(src)
        if _src_key(Path(src), after) != key or os.stat(dst).st_size != rec.size:
            raise QolaError(f"{src} changed while it was published", hint="build again")
        self.files[rel] = rec
        self.placed[rel] = Placed(key, rec.sha256)

    def write(self, rel: str, data: bytes, *, record: bool = True, mode: int = 0o644) -> None:
        """``rel`` with ``data``, created with ``mode`` less the user's umask (never wider than it gives)."""
        dst = self._dest(rel) if record else inside(self.root, rel)
        fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        if record:
            self.files[rel] = FileRecord(hashlib.sha256(data).hexdigest(), len(data))

    def tree(self, src: Path, rel: str) -> None:
        for p in sorted(src.rglob("*")):
            if p.is_file():
                self.copy(p, f"{rel}/{p.relative_to(src).as_posix()}")


def generated_at(source_date_epoch: str | None = None) -> str:
    """manifest.json's ``generated_at`` (QoLA's key): UTC, ISO 8601 with the offset, as QoLA writes
    it; ``SOURCE_DATE_EPOCH`` (whole seconds) instead of now when the build sets it."""
    when = None
    if source_date_epoch is not None and source_date_epoch.strip().isdigit():
        with contextlib.suppress(OverflowError, OSError, ValueError):
            when = datetime.fromtimestamp(int(source_date_epoch.strip()), timezone.utc)
    return (when or datetime.now(timezone.utc)).isoformat()


def publish_tree(src: Path | None, dst: Path) -> None:
    """Make ``dst`` hold exactly the files of ``src`` (each by temp + rename, then files no longer in
    ``src`` removed); ``src`` None removes ``dst``. For trees outside a versioned OUT."""
    if src is None:
        shutil.rmtree(dst, ignore_errors=True)
        return
    files = sorted(p.relative_to(src) for p in Path(src).rglob("*") if p.is_file())
    for rel in files:
        atomic_copy(Path(src) / rel, inside(dst, rel))
    keep = set(files)
    for p in sorted(dst.rglob("*"), reverse=True) if dst.is_dir() else []:
        if p.is_file() and p.relative_to(dst) not in keep:
            p.unlink()
        elif p.is_dir() and not any(p.iterdir()):
            p.rmdir()


def _configs(stage: _Stage, tree_root: Path) -> list[str]:
    """The tree's tuned-config CSVs, into configs/. Each must be a regular file of the tree once links
    are resolved (a link to a root-only file would be published for anyone to read) and at most
    :data:`MAX_CSV` bytes, checked on the open descriptor (a FIFO or /dev/zero never blocks or fills
    the disk)."""
    src = tree_root / CONFIGS
    root = tree_root.resolve()
    copied = []
    for csv in sorted(src.rglob("*.csv")) if src.is_dir() else []:
        rel = csv.relative_to(src).as_posix()
        real = csv.resolve()
        if not real.is_relative_to(root):
            raise QolaError(
                f"tuned config {csv} is a link to {real}, outside the kernel tree; not published",
                hint="configs must be files of the tree (replace the link by the file)",
            )
        fd, _ = open_regular(real, limit=MAX_CSV, what="tuned config")
        try:
            stage.copy(real, f"configs/{rel}", fd=fd)
        finally:
            os.close(fd)
        copied.append(rel)
    return copied


# -- the switch -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Contents:
    """What a version holds besides the report's libraries and logs. ``headers`` go to include/ (only
    what the modules that built need); ``texts``: OUT-relative path -> text (None: not published);
    ``trees``: OUT-relative dir -> build dir copied there (None: not published); ``module_extra``:
    keys added to a module's record; ``extra``: keys added to manifest.json; ``mode``: the build's
    default mode; ``withdrawn``: kept for callers — a new version never holds anything not given
    here; ``source_date_epoch``: the build's ``SOURCE_DATE_EPOCH``, if set (``generated_at``)."""

    headers: Iterable[Path] = ()
    extra: Mapping[str, object] | None = None
    mode: str | None = None
    texts: Mapping[str, str | None] | None = None
    trees: Mapping[str, Path | None] | None = None
    module_extra: Mapping[str, Mapping[str, object]] | None = None
    withdrawn: Iterable[str] = ()
    source_date_epoch: str | None = None


def publish(report: CompileReport, out: Path, contents: Contents | None = None) -> Path:
    """Publish what built as a new version of ``out`` and switch to it. Returns OUT/manifest.json."""
    contents = contents or Contents()
    out = Path(out)
    seen_at = Path(report.build_dir) / PUBLISHED
    placed: dict[str, Placed] = {}

    def fill(stage_dir: Path) -> None:
        stage = _Stage(stage_dir, _seen(seen_at))
        _fill(stage, report, contents)
        data = _manifest(report, contents, stage)
        stage.write(MANIFEST_JSON, (json.dumps(data, indent=2, sort_keys=True) + "\n").encode(), record=False)
        placed.update(stage.placed)

    install_version(out, fill)
    with contextlib.suppress(OSError):  # only saves the next publish some reading
        files = {rel: p.to_json() for rel, p in placed.items()}
        atomic_write(seen_at, json.dumps({"format": 2, "files": files}).encode())
    return out / MANIFEST_JSON


def _fill(stage: _Stage, report: CompileReport, contents: Contents) -> None:
    """The version's files but manifest.json: trees, logs, libraries, headers, texts."""
    for d in DIRS:
        inside(stage.root, d).mkdir()
    for rel, src in sorted((contents.trees or {}).items()):
        if src is not None:
            stage.tree(Path(src), rel)
    for r in report.modules:
        # private: compilers and generators quote what they read (paths, environment, file lines)
        stage.write(BuildLayout.log_rel(r.name), ("\n".join(r.log) + "\n").encode(), mode=LOG_MODE)
        if r.status == Status.BUILT and r.artifact is not None:
            stage.copy(r.artifact, f"lib/{r.artifact.name}")
    for h in contents.headers:
        stage.copy(h, f"include/{Path(h).name}")
    for rel, text in (contents.texts or {}).items():
        if text is not None:
            stage.write(rel, text.encode())


def _manifest(report: CompileReport, contents: Contents, stage: _Stage) -> dict[str, object]:
    """OUT/manifest.json's data, the files placed in ``stage`` listed."""
    plan, tc = report.plan, report.toolchain
    configs = _configs(stage, Path(plan.tree_root))
    extra_of = contents.module_extra or {}
    modules = [ModuleRecord.of(r, stage.files, extra_of.get(r.name)) for r in report.modules]
    return {
        "builder": "qola",  # TE's cache key (rocm-<ver>_aiter-<sha>) names no builder: qola audit reads this
        "qola_version": __version__,
        "generated_at": generated_at(contents.source_date_epoch),
        "manifest": {"path": plan.manifest_path, "sha256": plan.manifest_sha256},
        "manifest_src": plan.manifest_path,
        "tree": {"path": plan.tree_root, "commit": plan.tree_commit},
        "aiter_root": plan.tree_root,
        "namespace": plan.namespace,
        "toolchain": {
            "kind": tc.kind,
            "compiler": tc.compiler,
            "version": tc.version,
            "identity": tc.identity,
            "flags": list(tc.base_flags),
            "dropped_flags": list(tc.dropped_flags),
            "removed_flags": list(tc.removed_flags),
        },
        "archs": list(plan.archs),
        "gpu_archs": ";".join(plan.archs),
        "fixes": [u.to_json() for u in plan.fixes],  # qola's fixes of the tree's code (qola.plan.fixes)
        "mode": contents.mode,
        "configs": configs,
        "modules": [m.to_json() for m in modules],
        "summary": summary(modules),
        "duration_s": round(report.seconds, 3),
        **(contents.extra or {}),
        "files": {rel: f.to_json() for rel, f in sorted(stage.files.items())},
    }


def install_version(out: Path, fill: Callable[[Path], None]) -> Path:
    """Publish a new version of ``out`` filled by ``fill(stage_dir)`` and switch to it (the one way
    a version is made: a build's publish, a prebuilt archive's install); returns ``out``. ``fill``
    writes into a private staging dir (``OUT/.qola/.stage-<pid>-…``); if it raises, the staging dir
    is removed and OUT is as it was. The previous version is removed first (peak disk use: two
    versions), and OUT's version before the switch becomes ``OUT/.qola/prev``."""
    out = Path(out)
    if (out / STORE).is_dir() and not (out / STORE).is_symlink():
        with outdir.switching(out):  # a half-switched publish completed before anything is checked
            pass
    check_output(out)
    out.mkdir(parents=True, exist_ok=True)
    store = inside(out, STORE)
    store.mkdir(exist_ok=True)
    if os.path.lexists(store / outdir.PREV):
        with outdir.switching(out):
            outdir.drop_prev(out)
    stage_dir = Path(tempfile.mkdtemp(prefix=f"{STAGE}{os.getpid()}-", dir=store))
    try:
        os.chmod(stage_dir, 0o755)
        fill(stage_dir)
        for d in DIRS:
            inside(stage_dir, d).mkdir(exist_ok=True)
        for d, _, _ in os.walk(stage_dir):
            fsync_dir(d)
        with outdir.switching(out):
            check_output(out)  # another qola may have written OUT meanwhile (it holds no build lock)
            outdir.switch_in(out, stage_dir)
    except BaseException:
        remove(stage_dir)
        raise
    return out


def _seen(path: Path) -> dict[str, Placed]:
    """What the last publish recorded about the sources it copied (empty: none, or unreadable; an
    entry of another shape is left out: its source is read again)."""
    try:
        data = json.loads(inputs.read_record(path))
        files = data.get("files") if isinstance(data, dict) and data.get("format") == 2 else None
    except (OSError, ValueError):
        return {}
    return {
        str(rel): Placed(p["src"], p["sha256"])
        for rel, p in (files.items() if isinstance(files, dict) else ())
        if isinstance(p, dict) and isinstance(p.get("src"), list) and isinstance(p.get("sha256"), str)
    }
