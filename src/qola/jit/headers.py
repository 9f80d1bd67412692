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
cache (libc + libdl only, no zlib), ``qola jit prebuild`` with Python's tarfile.
"""

from __future__ import annotations

import gzip
import io
import os
import re
import tarfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from qola.errors import QolaError

_INCLUDE = re.compile(rb'^[ \t]*#[ \t]*include[ \t]*([<"])([^>"\n]+)[>"]', re.M)
SRCDIR = "srcdir"


@dataclass
class HeaderScanner:
    """Resolves includes against ordered include dirs; memoises per header."""

    include_dirs: Sequence[Path]
    _deps: dict[Path, tuple[Path, ...]] = field(default_factory=dict)
    _data: dict[Path, bytes] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.include_dirs = [Path(os.path.abspath(d)) for d in self.include_dirs]

    def read(self, path: Path) -> bytes:
        if path not in self._data:
            self._data[path] = path.read_bytes()
        return self._data[path]

    def _resolve(self, includer: Path, quote: bool, name: str) -> Path | None:
        cands = ([includer.parent / name] if quote else []) + [d / name for d in self.include_dirs]
        for c in cands:
            if c.is_file():
                return Path(os.path.normpath(c))
        return None

    def _direct(self, path: Path) -> tuple[Path, ...]:
        if path not in self._deps:
            found = []
            for kind, name in _INCLUDE.findall(self.read(path)):
                dep = self._resolve(path, kind == b'"', name.decode(errors="replace").strip())
                if dep is not None:
                    found.append(dep)
            self._deps[path] = tuple(found)
        return self._deps[path]

    def closure(self, source: Path) -> list[Path]:
        """Every header reachable from ``source`` through the include dirs (sorted)."""
        seen: set[Path] = set()
        todo = list(self._direct(Path(os.path.abspath(source))))
        while todo:
            h = todo.pop()
            if h not in seen:
                seen.add(h)
                todo.extend(self._direct(h))
        return sorted(seen)


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
    flags = [f"-I@QOLA_JIT_HEADERS@/{SRCDIR}"] if with_srcdir else []
    return flags + [f"-I@QOLA_JIT_HEADERS@/inc{i}" for i in range(n_dirs)]


def write_tar_gz(path: Path, files: Iterable[tuple[str, bytes]]) -> None:
    """Deterministic .tar.gz of (member path, bytes); written to a temp file, then renamed."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for name, data in sorted(files):
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            tf.addfile(info, io.BytesIO(data))
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "wb") as f, gzip.GzipFile(fileobj=f, mode="wb", mtime=0, compresslevel=6, filename="") as gz:
        gz.write(raw.getvalue())
    os.replace(tmp, path)


def unpack_tar_gz(bundle: Path, dest: Path) -> None:
    """Extract a bundle written by :func:`write_tar_gz` (regular files only, no escapes)."""
    with tarfile.open(bundle, "r:gz") as tf:
        for m in tf.getmembers():
            if not m.isfile() or m.name.startswith("/") or ".." in Path(m.name).parts:
                raise QolaError(f"{bundle}: unexpected member {m.name!r}")
            target = dest / m.name
            target.parent.mkdir(parents=True, exist_ok=True)
            with tf.extractfile(m) as src, open(target, "wb") as out:  # type: ignore[union-attr]
                out.write(src.read())
