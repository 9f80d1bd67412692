"""Prebuilt outputs, found by build key (:mod:`qola.store.key`).

An archive is one published version of an output dir (``OUT/lib``, ``include``, …,
``manifest.json``: nothing else under OUT) as a deterministic gzip'd tar (entries sorted, mtime 0, uid/gid 0, no owner names,
modes 0644/0755, no links), named ``<namespace>-<key[:16]>.tar.gz``, with ``<archive>.sha256``
(``sha256sum`` format, written last: its presence says the archive is complete) and
``<archive>.json`` (a small index: the full key, size, sha256, archs, toolchain).

* :func:`package` (``qola package OUT``, ``qola build --publish DIR``): audits OUT (``qola audit``)
  and refuses a broken or key-less output, then writes the three files into a directory atomically.
* :func:`install` (``qola build --prebuilt DIR|URL``): fetches ``<name>.sha256`` and then the
  archive (a local dir, or an ``http(s)://`` base URL: timeouts, size limits, redirects to other
  schemes refused), checks its sha256, unpacks it into a new version's staging dir and verifies it
  there — only regular files and dirs, no absolute path, no ``..``, nothing outside the known
  top-level entries, size and count caps, the audit of every recorded file and every library's
  exports, and the ``build_key`` its manifest.json records equal to the computed one — before the
  one switch that publishes it (:func:`qola.output.publish.install_version`). Anything wrong: a QolaError
  and OUT as it was. No archive under that name (or no store reachable): :class:`Missing`, and the
  caller builds.

The store is shared, so anyone who can write it can place an archive: the checks make a damaged or
hostile archive harmless to OUT and to the file system, but they cannot tell a malicious library
that is consistent with its own manifest.json. Keep the store writable only by the builders you
trust, or pin the archive's sha256 (docs/integration.md).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import stat
import tarfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, BinaryIO, cast

from qola.core.errors import QolaError
from qola.core.fsutil import atomic_stream, atomic_write, inside, pid_tempdir, remove_stale
from qola.core.hashing import file_sha256
from qola.output import outdir
from qola.output.checks import audit_output, load_manifest, resolve_root
from qola.output.outdir import DIRS, ENTRIES, MANIFEST_JSON
from qola.output.publish import install_version
from qola.store.download import CHUNK, HINT_STORE, TIMEOUT, fetch
from qola.store.download import Missing as Missing
from qola.store.download import is_url as is_url
from qola.store.key import recorded_key

SUFFIX = ".tar.gz"
MAX_UNPACKED = 64 << 30  # bytes of all its files
MAX_MEMBERS = 200_000
MAX_NAME = 1024
HEADERS = 1 << 20  # decompressed bytes tar may read between two members (headers, long names, padding)
WORK_PREFIX = ".prebuilt-"  # BUILD/.prebuilt-<pid>-…: a download in progress


def _shown(problems: list[str], most: int = 20) -> str:
    more = f"\n  … {len(problems) - most} more" if len(problems) > most else ""
    return "\n".join(f"  {p}" for p in problems[:most]) + more


def archive_name(namespace: str, key: str) -> str:
    return f"{namespace}-{key[:16]}{SUFFIX}"


# -- package ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Packaged:
    archive: Path
    sha256: str
    key: str


class _Hashing:
    """A reader that hashes what is read through it (tarfile copies a member through ``read``)."""

    def __init__(self, fh: BinaryIO) -> None:
        self.fh, self.h, self.size = fh, hashlib.sha256(), 0

    def read(self, n: int = -1) -> bytes:
        data = self.fh.read(n)
        self.h.update(data)
        self.size += len(data)
        return data


def _tarinfo(rel: str, *, directory: bool, size: int = 0, executable: bool = False) -> tarfile.TarInfo:
    info = tarfile.TarInfo(rel)
    info.type = tarfile.DIRTYPE if directory else tarfile.REGTYPE
    info.mode = 0o755 if directory or executable else 0o644
    info.size = 0 if directory else size
    info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
    return info


def _write_archive(fh: BinaryIO, root: Path, files: dict[str, Any]) -> None:
    """The version under ``root`` as a deterministic tar.gz; every file checked against ``files``
    (manifest.json's record) as it is read."""

    dirs = sorted(Path(d).relative_to(root).as_posix() for top in DIRS for d, _, _ in os.walk(inside(root, top)))
    entries = sorted([(d, True) for d in dirs] + [(f, False) for f in [*files, MANIFEST_JSON]])
    with (
        gzip.GzipFile(filename="", mode="wb", fileobj=fh, mtime=0) as gz,
        tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        for rel, directory in entries:
            if directory:
                tar.addfile(_tarinfo(rel, directory=True))
                continue
            fd = os.open(inside(root, rel), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            with os.fdopen(fd, "rb") as src:
                st = os.fstat(src.fileno())
                if not stat.S_ISREG(st.st_mode):
                    raise QolaError(f"{root / rel} is not a regular file")
                reader = _Hashing(src)
                tar.addfile(
                    _tarinfo(rel, directory=False, size=st.st_size, executable=bool(st.st_mode & 0o100)), reader
                )
            want = files.get(rel)
            if want is not None and (reader.h.hexdigest() != want.get("sha256") or reader.size != want.get("size")):
                raise QolaError(f"{root / rel} changed while it was packaged", hint="package again")


def package(out: Path, into: Path) -> Packaged:
    """Audit the output dir ``out`` and write its current version as ``into/<name>`` (+ ``.json``,
    then ``.sha256``), each atomically. Refuses an output that fails ``qola audit`` (failed modules
    included) or records no build key."""

    out, into = Path(out), Path(into)
    real_root = os.path.realpath(out)
    if os.path.realpath(into) == real_root or os.path.realpath(into).startswith(real_root + os.sep):
        raise QolaError(f"refusing to write the archive into the output dir {out}", hint="pass --into DIR outside it")
    with outdir.reading(out):  # one version throughout: no publish switches while it is read
        return _package(out, into)


def _package(out: Path, into: Path) -> Packaged:
    if not outdir.published(out) and outdir.legacy_version(out) is None:
        raise QolaError(
            f"{out} is not a published qola output (no {out / outdir.MANIFEST_JSON})",
            hint="package the -o directory of a finished qola build",
        )
    root, _, _ = resolve_root(out)
    _, problems, _ = audit_output(out)
    if problems:
        raise QolaError(
            f"{out} fails the audit ({len(problems)} problem(s)); not packaging it:\n{_shown(problems)}",
            hint=f"run qola audit {out}, then rebuild",
        )
    data = load_manifest(root)
    key = recorded_key(data)
    if key is None:
        raise QolaError(
            f"{out / 'manifest.json'} records no build_key (written by an older qola)",
            hint="rebuild the output with this qola, then package it",
        )
    name = archive_name(str(data["namespace"]), key)
    into.mkdir(parents=True, exist_ok=True)
    archive = atomic_stream(into / name, lambda fh: _write_archive(fh, root, data["files"]))
    sha = file_sha256(archive)
    index = {
        "format": 1,
        "archive": name,
        "build_key": key,
        "build_key_parts": data.get("build_key_parts"),
        "sha256": sha,
        "size": archive.stat().st_size,
        "namespace": data["namespace"],
        "qola_version": data.get("qola_version"),
        "archs": data.get("archs"),
        "mode": data.get("mode"),
        "toolchain": {k: (data.get("toolchain") or {}).get(k) for k in ("kind", "version")},
        "modules": [m.get("name") for m in data["modules"] if isinstance(m, dict)],
    }
    atomic_write(into / f"{name}.json", (json.dumps(index, indent=2, sort_keys=True) + "\n").encode(), sync_dir=True)
    atomic_write(into / f"{name}.sha256", f"{sha}  {name}\n".encode(), sync_dir=True)
    return Packaged(archive, sha, key)


# -- unpack and verify -----------------------------------------------------------------------------


class _Budget:
    """The decompressed stream tar reads, in bounded steps: ``left`` bytes may be read until the
    next member is seen (its data plus :data:`HEADERS`), so a giant PAX header or long name in a
    small gzip is refused before it is held in memory."""

    def __init__(self, fh: IO[bytes] | gzip.GzipFile) -> None:
        self.fh, self.left = fh, HEADERS

    def read(self, n: int = -1) -> bytes:
        data = self.fh.read(CHUNK if n is None or n < 0 else min(n, max(self.left, 0) + 1))
        self.left -= len(data)
        if self.left < 0:
            raise QolaError(f"archive has a header over {HEADERS} bytes or more data than its members", hint=HINT_STORE)
        return data


def _member_name(member: tarfile.TarInfo, allowed_top: tuple[str, ...]) -> str:
    name = member.name
    if member.isdir():
        name = name.rstrip("/")
    parts = name.split("/")
    if (
        not name
        or len(name) > MAX_NAME
        or name.startswith("/")
        or "\0" in name
        or "\\" in name
        or any(p in ("", ".", "..") for p in parts)
    ):
        raise QolaError(f"archive member {member.name!r} is not a plain relative path", hint=HINT_STORE)
    if parts[0] not in allowed_top or (len(parts) == 1 and not member.isdir() and parts[0] != "manifest.json"):
        raise QolaError(f"archive member {member.name!r} is not part of a qola output", hint=HINT_STORE)
    if not (member.isdir() or (member.isreg() and not member.issparse())):
        kind = "a symlink" if member.issym() else "a hard link" if member.islnk() else "not a regular file or dir"
        raise QolaError(f"archive member {member.name!r} is {kind}: refused", hint=HINT_STORE)
    return name


def _write_member(tar: tarfile.TarFile, member: tarfile.TarInfo, name: str, path: Path) -> None:
    """A regular member's bytes as the new file ``path`` (never through an existing one), fsynced."""
    path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    src = tar.extractfile(member)
    assert src is not None  # a regular member (checked by the caller)
    fd = os.open(
        path,
        os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
        0o755 if member.mode & 0o100 else 0o644,
    )
    with os.fdopen(fd, "wb") as fh:
        left = member.size
        while left > 0 and (chunk := src.read(min(CHUNK, left))):
            fh.write(chunk)
            left -= len(chunk)
        if left:
            raise QolaError(f"archive member {name!r} is truncated", hint=HINT_STORE)
        fh.flush()
        os.fsync(fh.fileno())


def unpack(archive: Path, dest: Path, *, max_bytes: int = MAX_UNPACKED, max_members: int = MAX_MEMBERS) -> None:
    """Extract ``archive`` into the empty dir ``dest``, writing every file and dir itself (never
    through tarfile's extraction): see the module's docstring for what is refused."""

    seen: set[str] = set()
    total = 0
    try:
        with open(archive, "rb") as raw, gzip.GzipFile(fileobj=raw, mode="rb") as gz:
            budget = _Budget(gz)
            with tarfile.open(fileobj=cast("IO[bytes]", budget), mode="r|") as tar:
                for member in tar:
                    budget.left = HEADERS + (member.size if member.isreg() else 0)
                    if len(seen) >= max_members:
                        raise QolaError(f"archive has more than {max_members} entries", hint=HINT_STORE)
                    name = _member_name(member, ENTRIES)
                    if name in seen:
                        raise QolaError(f"archive member {name!r} appears twice", hint=HINT_STORE)
                    seen.add(name)
                    path = inside(dest, name)
                    if member.isdir():
                        path.mkdir(mode=0o755, parents=True, exist_ok=True)
                        if path.is_symlink() or not path.is_dir():
                            raise QolaError(f"archive member {name!r} clashes with a file", hint=HINT_STORE)
                        continue
                    total += member.size
                    if total > max_bytes:
                        raise QolaError(f"archive unpacks to more than {max_bytes} bytes", hint=HINT_STORE)
                    _write_member(tar, member, name, path)
    except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile, UnicodeError) as exc:
        raise QolaError(
            f"{archive.name} is not a readable tar.gz ({type(exc).__name__}: {exc})", hint=HINT_STORE
        ) from None
    except FileExistsError as exc:
        raise QolaError(f"archive member {exc.filename!r} clashes with another entry", hint=HINT_STORE) from None
    except NotADirectoryError as exc:
        raise QolaError(f"archive member under {exc.filename!r} clashes with a file", hint=HINT_STORE) from None
    for d in DIRS:
        inside(dest, d).mkdir(mode=0o755, exist_ok=True)


def verify(root: Path, key: str, namespace: str) -> None:
    """QolaError unless the unpacked version ``root`` is a clean qola output of ``namespace`` built
    for ``key``: its manifest.json records this key and every file, and ``qola audit`` finds
    nothing (sizes, sha256s, exports, every module built)."""

    data = load_manifest(root)
    got = recorded_key(data)
    if got != key:
        raise QolaError(
            f"the archive's manifest.json records build key {got or '(none)'}, not {key}: refused "
            "(an archive of another build under this name)",
            hint=HINT_STORE,
        )
    if data.get("namespace") != namespace:
        raise QolaError(f"the archive is of namespace {data.get('namespace')!r}, not {namespace!r}", hint=HINT_STORE)
    if not isinstance(data.get("files"), dict):
        raise QolaError("the archive's manifest.json records no file list", hint=HINT_STORE)
    try:
        _, problems, _ = audit_output(root)
    except QolaError:
        raise
    except Exception as exc:
        raise QolaError(
            f"the archive's files cannot be audited ({type(exc).__name__}: {exc})", hint=HINT_STORE
        ) from None
    if problems:
        raise QolaError(
            f"the archive fails the audit ({len(problems)} problem(s)):\n{_shown(problems)}", hint=HINT_STORE
        )


@dataclass(frozen=True)
class Installed:
    origin: str  # the archive's path or URL
    out: Path  # the output dir it was installed into
    key: str


def install(source: str, namespace: str, key: str, out: Path, work: Path, *, timeout: float = TIMEOUT) -> Installed:
    """Install the archive of ``key`` from ``source`` (a dir or an http(s) base URL) as a new
    version of ``out``; ``work``: a dir for the download (the build dir). Missing: none there."""

    name = archive_name(namespace, key)
    work.mkdir(parents=True, exist_ok=True)
    remove_stale(work, WORK_PREFIX)
    with pid_tempdir(WORK_PREFIX, work) as tmp:
        archive, origin = fetch(source, name, Path(tmp), timeout=timeout)

        def fill(stage: Path) -> None:
            unpack(archive, stage)
            verify(stage, key, namespace)

        try:
            install_version(out, fill)
        except QolaError as exc:
            raise QolaError(f"prebuilt {origin} refused: {exc.message}", hint=exc.hint) from None
    return Installed(origin, Path(out), key)
