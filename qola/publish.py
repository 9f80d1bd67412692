"""Publish a build into the output dir: all or nothing for readers.

Layout (see docs/integration.md)::

    OUT/.qola/v<N>/             one complete published tree: lib/ include/ configs/ jit/ share/ logs/
                                manifest.json — never changed once it is in place
    OUT/current -> .qola/v<N>   the published version
    OUT/lib -> current/lib, OUT/include -> current/include, …, OUT/manifest.json -> current/manifest.json

A publish fills a private staging dir ``OUT/.qola/.stage-<pid>-…`` (every file fsynced), renames it to
``v<N+1>`` and then switches ``current`` with one ``rename()`` of a new symlink: a reader going
through ``OUT/…`` sees the whole old tree or the whole new one, and a SIGKILL at any point leaves
the old one published. The previous version is kept (a process that loaded its libraries keeps
finding their JIT sources); older ones are removed after the switch.

Only what this build produced enters the new version: a failed module has no library, headers,
JIT tree or consumer entry there, whatever an earlier build published. Nothing is ever deleted by a
name or pattern that came from input. ``manifest.json`` records every file of its version (path,
size, sha256) for ``qola audit``. Every destination is built with :func:`qola.fsutil.inside`.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from qola import __version__
from qola.build import CompileReport, ModuleResult
from qola.builddir import BuildLayout
from qola.errors import QolaError
from qola.fsutil import (atomic_copy, atomic_write, fsync_dir, inside, remove, remove_stale, remove_stale_trees,
                         replace_symlink)
from qola.hashing import file_sha256, regular_file_sha256
from qola.tree.aiter_configs import CONFIGS

__all__ = ["MANIFEST_JSON", "STORE", "CURRENT", "ENTRIES", "atomic_write", "atomic_copy", "publish", "prepare",
           "check_output", "current_version", "module_record", "publish_tree", "install_version"]

MANIFEST_JSON = "manifest.json"
STORE = ".qola"  # OUT/.qola/v<N>: the published versions
CURRENT = "current"  # OUT/current -> .qola/v<N>
DIRS = ("lib", "include", "configs", "jit", "share", "logs")  # always present in a version
ENTRIES = (*DIRS, MANIFEST_JSON)  # OUT/<entry> -> current/<entry>
STAGE = ".stage-"  # OUT/.qola/.stage-<pid>-…: a publish in progress
LEGACY = ".legacy-"  # OUT/.qola/.legacy-<pid>: the top-level dirs of an output written before versions
LINK_TMP = ".current-"  # OUT/.current-<pid>: the new symlink, before it is renamed over OUT/current
_VERSION = re.compile(r"v([0-9]+)\Z")


# -- the output dir -----------------------------------------------------------------------------

def _versions(store: Path) -> dict[int, Path]:
    found = {}
    try:
        entries = list(os.scandir(store))
    except OSError:
        return found
    for e in entries:
        m = _VERSION.match(e.name)
        if m and e.is_dir(follow_symlinks=False):
            found[int(m.group(1))] = Path(e.path)
    return found


def current_version(out: Path) -> Path | None:
    """``OUT/.qola/v<N>`` that ``OUT/current`` names, or None (no versioned publish yet)."""
    link = Path(out) / CURRENT
    try:
        target = os.readlink(link)
    except OSError:
        return None
    head, _, name = target.partition("/")
    if head != STORE or not _VERSION.match(name):
        return None
    path = Path(out) / STORE / name
    return path if path.is_dir() and not path.is_symlink() else None


def _legacy(out: Path) -> bool:
    """An output written before versioned publishing: a real OUT/manifest.json."""
    p = out / MANIFEST_JSON
    return p.is_file() and not p.is_symlink()


def check_output(out: Path) -> None:
    """QolaError unless ``out`` can take a publish: absent, empty, a versioned qola output or one
    written before versions (whose top-level dirs a publish then moves aside). Never something
    qola did not write: a real ``OUT/lib`` without a ``manifest.json`` is refused, not replaced."""
    out = Path(out)
    if not os.path.lexists(out):
        return
    if not out.is_dir():
        raise QolaError(f"output dir {out} exists and is not a directory", hint="give -o a directory path")
    hint = "remove it or choose another --output-dir"
    for name in (STORE, CURRENT):
        p = out / name
        if os.path.lexists(p) and (name == CURRENT) != p.is_symlink():
            raise QolaError(f"{p} exists and was not written by qola", hint=hint)
    if (out / STORE).is_symlink() or (os.path.lexists(out / STORE) and not (out / STORE).is_dir()):
        raise QolaError(f"{out / STORE} is not a directory qola wrote", hint=hint)
    legacy = _legacy(out)
    for name in ENTRIES:
        p = out / name
        if os.path.lexists(p) and not p.is_symlink() and not legacy:
            raise QolaError(f"{p} exists and was not published by qola (no {out / MANIFEST_JSON})", hint=hint)


def prepare(out: Path, build_dir: Path) -> list[str]:
    """Before a build: check ``out`` (:func:`check_output`, so a refusal comes before compiling) and
    remove what killed runs left behind — publish staging dirs and symlinks in OUT, generator
    staging dirs in the build dir, generator listings in the temp dir. One note per kind removed."""
    from qola import codegen  # noqa: PLC0415

    check_output(out)
    layout = BuildLayout(Path(build_dir), out)
    notes = []
    found = {"publish staging": remove_stale(out / STORE, STAGE) + remove_stale(out / STORE, LEGACY)
             + remove_stale(out, LINK_TMP),
             "generator staging": codegen.clean_stale(layout.gen_root),
             "JIT staging": remove_stale_trees(layout.jit_out),
             "generator listing": remove_stale(tempfile.gettempdir(), codegen.LISTING_PREFIX)}
    for kind, paths in found.items():
        if paths:
            shown = ", ".join(str(p) for p in paths[:5]) + (f" (+{len(paths) - 5} more)" if len(paths) > 5 else "")
            notes.append(f"removed {len(paths)} {kind} dir(s) left by killed qola runs: {shown}")
    return notes


# -- one version, staged ------------------------------------------------------------------------

PUBLISHED = ".qola-published.json"  # BUILD/: what the last publish placed, with the files' stat


def _src_key(path: Path, st: os.stat_result) -> list:
    return [str(path), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]


def _dst_key(st: os.stat_result) -> list:
    # no ctime: hard-linking the file into the next version changes it
    return [st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev, st.st_mode & 0o7777]


class _Stage:
    """The new version's tree, filled before anyone can see it. ``files``: OUT-relative path ->
    {sha256, size} of every file placed. A file equal to the previous version's (same sha256 as
    recorded there, same mode) is hard-linked instead of copied: unchanged libraries cost no space
    and no write. ``seen``: what qola's last publish into this version recorded about each file it
    placed (its source's and its own stat, its sha256): a file neither of whose stats moved since is
    linked without reading either; otherwise the source is hashed (and the previous file, unless its
    stat is as recorded)."""

    def __init__(self, root: Path, prev: Path | None, seen: Mapping[str, Any] | None = None) -> None:
        self.root, self.prev = root, prev
        self.files: dict[str, dict[str, Any]] = {}
        self.prev_files: dict[str, Any] = {}
        self.seen = seen or {}
        self.placed: dict[str, dict[str, Any]] = {}  # what the next publish's ``seen`` will be
        if prev is not None:
            try:
                recorded = json.loads((prev / MANIFEST_JSON).read_text()).get("files")
                self.prev_files = recorded if isinstance(recorded, dict) else {}
            except (OSError, ValueError, AttributeError):
                pass

    def _dest(self, rel: str) -> Path:
        dst = inside(self.root, rel)
        if rel.strip("/") == MANIFEST_JSON:
            raise QolaError(f"refusing to publish a file over {MANIFEST_JSON}")
        dst.parent.mkdir(parents=True, exist_ok=True)
        remove(dst)  # a later source for the same path wins (texts after headers)
        return dst

    def _link_previous(self, src: Path, st: os.stat_result, dst: Path, rel: str) -> dict | None:
        old = self.prev_files.get(rel)
        if self.prev is None or not isinstance(old, dict) or old.get("size") != st.st_size:
            return None
        prev = self.prev / rel
        try:
            pst = os.lstat(prev)
            if not stat.S_ISREG(pst.st_mode) or (pst.st_mode & 0o777) != (st.st_mode & 0o777):
                return None
            seen = self.seen.get(rel)
            seen = seen if isinstance(seen, dict) and seen.get("sha256") == old.get("sha256") else {}
            prev_as_placed = seen.get("dst") == _dst_key(pst)
            if prev_as_placed and seen.get("src") == _src_key(src, st):
                sha = old["sha256"]  # neither file moved since qola hashed them
            else:
                sha = file_sha256(src)
                if sha != old.get("sha256"):
                    return None
                if not prev_as_placed and regular_file_sha256(prev) != (sha, st.st_size):
                    return None
            os.link(prev, dst)
        except OSError:
            return None
        return {"sha256": sha, "size": st.st_size}

    def copy(self, src: Path, rel: str) -> None:
        dst = self._dest(rel)
        st = os.stat(src)
        rec = self._link_previous(Path(src), st, dst, rel)
        if rec is None:
            h, size = hashlib.sha256(), 0
            with open(src, "rb") as inp, open(dst, "xb") as out:
                while chunk := inp.read(1 << 20):
                    h.update(chunk)
                    out.write(chunk)
                    size += len(chunk)
                out.flush()
                os.fsync(out.fileno())
            os.chmod(dst, st.st_mode & 0o777)
            rec = {"sha256": h.hexdigest(), "size": size}
        self.files[rel] = rec
        if _src_key(Path(src), os.stat(src)) == (key := _src_key(Path(src), st)):  # not rewritten meanwhile
            self.placed[rel] = {"src": key, "dst": _dst_key(os.lstat(dst)), "sha256": rec["sha256"]}

    def write(self, rel: str, data: bytes, *, record: bool = True) -> None:
        dst = self._dest(rel) if record else inside(self.root, rel)
        sha = hashlib.sha256(data).hexdigest()
        if not (record and self._same_as_previous(rel, data, sha, dst)):
            with open(dst, "xb") as out:
                out.write(data)
                out.flush()
                os.fsync(out.fileno())
            os.chmod(dst, 0o644)
        if record:
            self.files[rel] = {"sha256": sha, "size": len(data)}

    def _same_as_previous(self, rel: str, data: bytes, sha: str, dst: Path) -> bool:
        """Hard-link the previous version's ``rel`` as ``dst`` when it holds ``data`` (a log or text
        that did not change: no write, no fsync)."""
        old = self.prev_files.get(rel)
        if self.prev is None or not isinstance(old, dict) or old.get("sha256") != sha:
            return False
        prev = self.prev / rel
        try:
            st = os.lstat(prev)
            if not stat.S_ISREG(st.st_mode) or (st.st_mode & 0o7777) != 0o644 or st.st_size != len(data):
                return False
            with open(prev, "rb") as fh:
                if fh.read() != data:
                    return False
            os.link(prev, dst)
        except OSError:
            return False
        return True

    def tree(self, src: Path, rel: str) -> None:
        for p in sorted(src.rglob("*")):
            if p.is_file():
                self.copy(p, f"{rel}/{p.relative_to(src).as_posix()}")


def _instances(names: tuple[str, ...]) -> dict[str, Any]:
    digest = hashlib.sha256("\n".join(sorted(names)).encode()).hexdigest()
    return {"count": len(names), "sha256": digest, "names": sorted(names)}


def module_record(r: ModuleResult, files: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """A module's entry of manifest.json; ``files``: the version's file record (its artifact's
    size and sha256 come from there)."""
    log = BuildLayout.log_rel(r.name)
    rec: dict[str, Any] = {
        "name": r.name, "md_name": r.md_name, "mode": r.mode, "link": r.link, "status": r.status,
        "sources": r.sources, "generated": r.generated, "instances": _instances(r.instances),
        "duration_s": round(r.seconds, 3), "log": log, "warnings": list(r.warnings),
    }
    art = f"lib/{r.artifact.name}" if r.artifact is not None else None
    if r.status == "built" and art in files:
        rec.update({"artifact": art, "size": files[art]["size"], "sha256": files[art]["sha256"],
                    "exports": list(r.exports)})
    else:
        rec.update({"artifact": None, "error": {"message": r.error or "failed", "log": log}})
    return rec


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
    src = tree_root / CONFIGS
    copied = []
    for csv in sorted(src.rglob("*.csv")) if src.is_dir() else []:
        rel = csv.relative_to(src).as_posix()
        stage.copy(csv, f"configs/{rel}")
        copied.append(rel)
    return copied


# -- the switch -----------------------------------------------------------------------------------

def _install(store: Path, stage: Path) -> Path:
    """Rename the filled staging dir to the next ``v<N>``."""
    n = max(_versions(store), default=0) + 1
    while True:
        target = store / f"v{n}"
        try:
            os.rename(stage, target)
        except OSError as exc:
            if exc.errno in (errno.EEXIST, errno.ENOTEMPTY):
                n += 1
                continue
            raise
        fsync_dir(store)
        return target


def _symlink_over(out: Path, target: str, name: str) -> None:
    """Point ``OUT/<name>`` at ``target`` with one rename (a new symlink replaces the old one)."""
    replace_symlink(out / name, target, out / f"{LINK_TMP}{os.getpid()}")


def _link_entries(out: Path, store: Path) -> None:
    """``OUT/<entry> -> current/<entry>`` for every entry; the real dirs of a pre-versions output
    are moved aside first (manifest.json last, so it names what OUT shows until then)."""
    aside = store / f"{LEGACY}{os.getpid()}"
    for name in ENTRIES:
        p, want = out / name, f"{CURRENT}/{name}"
        if p.is_symlink() and os.readlink(p) == want:
            continue
        if os.path.lexists(p) and not p.is_symlink():
            aside.mkdir(exist_ok=True)
            os.rename(p, aside / name)
        _symlink_over(out, want, name)
    remove(aside)
    fsync_dir(out)


def _prune(store: Path, keep: Iterable[Path | None], newest: Path) -> None:
    keep_names = {p.name for p in keep if p is not None}
    top = int(_VERSION.match(newest.name).group(1))
    for n, path in _versions(store).items():
        if path.name not in keep_names and n < top:
            shutil.rmtree(path, ignore_errors=True)


def publish(report: CompileReport, out: Path, *, headers: Iterable[Path] = (), extra: Mapping[str, Any] | None = None,
            mode: str | None = None, texts: Mapping[str, str | None] | None = None,
            trees: Mapping[str, Path | None] | None = None,
            module_extra: Mapping[str, Mapping[str, Any]] | None = None, withdrawn: Iterable[str] = ()) -> Path:
    """Publish what built as a new version of ``out`` and switch to it. Returns OUT/manifest.json.

    ``headers`` go to include/ (only what the modules that built need); ``texts``: OUT-relative
    path -> text (None: not published); ``trees``: OUT-relative dir -> build dir copied there
    (None: not published); ``module_extra``: keys added to a module's record; ``withdrawn``: kept
    for callers — a new version never holds anything not given here."""
    del withdrawn  # nothing carries over from the previous version, so nothing needs withdrawing
    out = Path(out)
    seen_at = Path(report.build_dir) / PUBLISHED
    placed: dict[str, Any] = {}

    def fill(stage_dir: Path, prev: Path | None) -> None:
        stage = _Stage(stage_dir, prev, _seen(seen_at, out, prev))
        for d in DIRS:
            inside(stage_dir, d).mkdir()
        for rel, src in sorted((trees or {}).items()):
            if src is not None:
                stage.tree(Path(src), rel)
        for r in report.modules:
            stage.write(BuildLayout.log_rel(r.name), ("\n".join(r.log) + "\n").encode())
            if r.status == "built" and r.artifact is not None:
                stage.copy(r.artifact, f"lib/{r.artifact.name}")
        for h in headers:
            stage.copy(h, f"include/{Path(h).name}")
        for rel, text in (texts or {}).items():
            if text is not None:
                stage.write(rel, text.encode())
        plan, tc = report.plan, report.toolchain
        configs = _configs(stage, Path(plan.tree_root))
        data = {
            "qola_version": __version__,
            "manifest": {"path": plan.manifest_path, "sha256": plan.manifest_sha256},
            "tree": {"path": plan.tree_root, "commit": plan.tree_commit},
            "namespace": plan.namespace,
            "toolchain": {"kind": tc.kind, "compiler": tc.compiler, "version": tc.version, "identity": tc.identity,
                          "flags": list(tc.base_flags), "dropped_flags": list(tc.dropped_flags),
                          "removed_flags": list(tc.removed_flags)},
            "archs": list(plan.archs),
            "mode": mode,
            "configs": configs,
            "modules": [{**module_record(r, stage.files), **(module_extra or {}).get(r.name, {})}
                        for r in report.modules],
            "duration_s": round(report.seconds, 3),
            **(extra or {}),
            "files": dict(sorted(stage.files.items())),
        }
        stage.write(MANIFEST_JSON, (json.dumps(data, indent=2, sort_keys=True) + "\n").encode(), record=False)
        placed.update(stage.placed)

    version = install_version(out, fill)
    with contextlib.suppress(OSError):  # only saves the next publish some reading
        atomic_write(seen_at, json.dumps({"out": os.path.realpath(out), "version": version.name,
                                          "files": placed}).encode())
    return out / MANIFEST_JSON


def install_version(out: Path, fill: Callable[[Path, Path | None], None]) -> Path:
    """Publish a new version of ``out`` filled by ``fill(stage_dir, previous version or None)`` and
    switch to it; returns the version's dir. ``fill`` writes into a private staging dir
    (``OUT/.qola/.stage-<pid>-…``); if it raises, the staging dir is removed and OUT is as it was
    (the one way a version is made: a build's publish, a prebuilt archive's install)."""
    out = Path(out)
    check_output(out)
    out.mkdir(parents=True, exist_ok=True)
    store = inside(out, STORE)
    store.mkdir(exist_ok=True)
    prev = current_version(out)
    stage_dir = Path(tempfile.mkdtemp(prefix=f"{STAGE}{os.getpid()}-", dir=store))
    try:
        os.chmod(stage_dir, 0o755)
        fill(stage_dir, prev)
        for d, _, _ in os.walk(stage_dir):
            fsync_dir(d)
        version = _install(store, stage_dir)
    except BaseException:
        remove(stage_dir)
        raise
    _symlink_over(out, f"{STORE}/{version.name}", CURRENT)  # the one switch readers can observe
    fsync_dir(out)
    _link_entries(out, store)
    _prune(store, (version, prev), version)
    return version


def _seen(path: Path, out: Path, prev: Path | None) -> dict[str, Any]:
    """What the publish that made ``prev`` recorded about the files it placed (empty: none, or a
    record of another output dir or version)."""
    try:
        data = json.loads(path.read_text())
        if (prev is not None and data["out"] == os.path.realpath(out) and data["version"] == prev.name
                and isinstance(data["files"], dict)):
            return data["files"]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return {}
