"""Header closures of JIT units and the compressed bundle shipped in OUT/jit/<module>/.

The closure is found by following ``#include`` lines (all of them, whatever the
``#if`` around them — a superset is safe) through the bundled include dirs;
headers that are not under one of them (system, HIP/CUDA runtime) are not bundled
and must exist where the unit is compiled. In the bundle, include dir ``i`` is
``inc<i>/`` and headers found beside the source file are ``srcdir/``; the unit's
flags say ``-I@QOLA_JIT_HEADERS@/inc<i>``, which the runtime points at the unpacked
bundle.

The bundle is a deterministic ``headers.tar.gz`` (sorted, mtime 0, uid 0, PAX):
the runtime unpacks it with the system ``tar -xzf`` once per bundle hash into the
cache (libc + libdl only, no zlib), ``qola jit prebuild`` with Python's tarfile. Both
check the unpacked tree against the digest the library records (:func:`tree_digest`)
before every use.
"""

from __future__ import annotations

import errno
import gzip
import io
import os
import shutil
import stat
import tarfile
import zlib
from collections.abc import Iterable, Sequence
from pathlib import Path

from qola.core.errors import QolaError
from qola.core.fsutil import atomic_write
from qola.jit import format as fmt
from qola.jit import safeio
from qola.jit.format import COMPLETE, HEADERS_TOKEN, MAX_TREE_DEPTH, MAX_TREE_ENTRIES
from qola.jit.key import digest_of_hashes

SRCDIR = "srcdir"


def bundle_path(header: Path, include_dirs: Sequence[Path], source_dir: Path) -> str:
    """Where ``header`` lives inside the bundle: inc<i>/<rel> for the first include dir
    containing it, else srcdir/<rel> for a header beside the source."""
    for i, d in enumerate(include_dirs):
        try:
            return f"inc{i}/{header.relative_to(d).as_posix()}"
        except ValueError:
            continue
    try:
        return f"{SRCDIR}/{header.relative_to(source_dir).as_posix()}"
    except ValueError:
        raise QolaError(
            f"header {header} is included by a JIT unit but lies outside the bundled include dirs",
            hint="add its directory to the module's include dirs",
        ) from None


def include_flags(n_dirs: int, with_srcdir: bool) -> list[str]:
    flags = [f"-I{HEADERS_TOKEN}/{SRCDIR}"] if with_srcdir else []
    return flags + [f"-I{HEADERS_TOKEN}/inc{i}" for i in range(n_dirs)]


def tar_gz_bytes(files: Iterable[tuple[str, bytes]]) -> bytes:
    """Deterministic .tar.gz of (member path, bytes)."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for name, data in sorted(files):
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            tf.addfile(info, io.BytesIO(data))
    out = io.BytesIO()
    with gzip.GzipFile(fileobj=out, mode="wb", mtime=0, compresslevel=6, filename="") as gz:
        gz.write(raw.getvalue())
    return out.getvalue()


def write_tar_gz(path: Path, files: Iterable[tuple[str, bytes]]) -> None:
    """:func:`tar_gz_bytes` written atomically (:func:`qola.core.fsutil.atomic_write`)."""
    atomic_write(path, tar_gz_bytes(files))


def unpack_tar_gz(data: bytes, dest: Path, where: object = "header bundle") -> None:
    """Extract a bundle written by :func:`write_tar_gz` (its bytes, already verified) into the
    fresh directory ``dest``: regular files only (0644, created exclusively, never through a
    link), directories 0755, no member outside ``dest``."""
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tf:
            for m in tf.getmembers():
                parts = m.name.split("/")
                bad_path = m.name.startswith("/") or "\n" in m.name or any(p in ("", ".", "..") for p in parts)
                if not m.isfile() or bad_path:
                    raise QolaError(f"{where}: unexpected member {m.name!r}")
                for i in range(1, len(parts)):
                    d = dest.joinpath(*parts[:i])
                    if not d.is_dir() or d.is_symlink():
                        d.mkdir(mode=0o755)
                flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
                fd = os.open(dest.joinpath(*parts), flags, 0o644)
                with tf.extractfile(m) as src, os.fdopen(fd, "wb") as out:  # type: ignore[union-attr]
                    shutil.copyfileobj(src, out)
    except (tarfile.TarError, EOFError, zlib.error) as exc:
        raise QolaError(f"{where}: a damaged .tar.gz ({exc})") from None


def tree_digest(root: Path, *, skip: str = COMPLETE) -> str:
    """:func:`qola.jit.key.headers_digest` of the regular files under ``root`` (paths relative to
    it; ``skip`` at the top left out), as the runtime computes it (qola_jit_files.cpp). Raises
    :class:`qola.jit.safeio.Refused` for a symlink, a special file, an untrusted entry (owner,
    mode) or a tree too large or deep."""
    files: list[tuple[bytes, str]] = []
    count = 0

    def walk(dfd: int, rel: str, depth: int) -> None:
        nonlocal count
        with os.scandir(dfd) as it:
            names = [e.name for e in it]
        for name in names:
            if depth == 0 and name == skip:
                continue
            r = f"{rel}/{name}" if rel else name
            shown = root / r
            count += 1
            if count > MAX_TREE_ENTRIES or depth >= MAX_TREE_DEPTH or "\n" in name:
                raise safeio.Refused(f"refusing {shown}: the tree is too large or deep, or a name has a newline")
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
                try:
                    if why := safeio.untrusted(os.fstat(sub)):
                        raise safeio.Refused(f"refusing {shown}: {why}")
                    walk(sub, r, depth + 1)
                finally:
                    os.close(sub)
            elif stat.S_ISREG(st.st_mode):
                with safeio.open_regular(name, dir_fd=dfd, max_size=fmt.MAX_SOURCE, trusted=True) as (fd, _):
                    files.append((os.fsencode(r), safeio.sha256_fd(fd, fmt.MAX_SOURCE)[0]))
            else:
                raise safeio.Refused(f"refusing {shown}: not a regular file or directory")

    try:
        top = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise safeio.Refused(f"cannot open {root}: {exc.strerror}", missing=exc.errno == errno.ENOENT) from None
    try:
        if why := safeio.untrusted(os.fstat(top)):
            raise safeio.Refused(f"refusing {root}: {why}")
        walk(top, "", 0)
    except OSError as exc:
        raise safeio.Refused(f"cannot read {root}: {exc.strerror}") from None
    finally:
        os.close(top)
    return digest_of_hashes(files)
