"""Fetch the real AITER tree (the ``amd-aiter`` sdist) once into a cache dir.

``pip download`` cannot be used (the sdist fails to build its metadata), so
the file list is read from the simple index pip is configured with and the
newest ``.tar.gz`` is fetched directly, its sha256 checked against the index.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

PROJECT = "amd-aiter"


def cache_dir() -> Path:
    base = os.environ.get("QOLA_TEST_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "qola-test"
    )
    return Path(base)


def _index_url() -> str:
    """The index pip is configured with (pip config), else pip's default."""
    try:
        out = subprocess.run(
            [sys.executable, "-m", "pip", "config", "get", "global.index-url"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    from pip._internal.models.index import PyPI

    return PyPI.simple_url


def _newest_sdist() -> dict[str, Any]:
    url = _index_url().rstrip("/") + f"/{PROJECT}/"
    req = urllib.request.Request(url, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        data = json.load(resp)
    sdists = [f for f in data["files"] if f["filename"].endswith(".tar.gz") and not f.get("yanked")]
    if not sdists:
        raise RuntimeError(f"no sdist of {PROJECT} on {url}")
    newest: dict[str, Any] = sdists[-1]
    return newest


def aiter_root() -> Path:
    """Path of the unpacked sdist (contains ``aiter/`` and ``aiter_meta/``). Test processes running side by
    side (pytest-xdist's workers) take turns: the first fetches and unpacks under an exclusive lock on
    ``.lock`` in the cache dir, the others wait on it and then find the tree unpacked."""
    root = cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _unpacked(root)


def _unpacked(root: Path) -> Path:
    done = sorted(root.glob("amd_aiter-*/.qola-unpacked"))
    if done:
        return done[-1].parent
    info = _newest_sdist()
    tarball = root / info["filename"]
    if not tarball.exists():
        with (
            tempfile.NamedTemporaryFile(dir=root, delete=False) as tmp,
            urllib.request.urlopen(info["url"], timeout=600) as resp,
        ):
            digest = hashlib.sha256()
            while chunk := resp.read(1 << 20):
                digest.update(chunk)
                tmp.write(chunk)
        want = info.get("hashes", {}).get("sha256")
        if want and digest.hexdigest() != want:
            os.unlink(tmp.name)
            raise RuntimeError(f"sha256 mismatch for {info['filename']}")
        os.replace(tmp.name, tarball)
    with tarfile.open(tarball) as tf:
        top = tf.getnames()[0].split("/")[0]
        tf.extractall(root, filter="tar") if hasattr(tarfile, "data_filter") else tf.extractall(root)
    (root / top / ".qola-unpacked").write_text(info["filename"] + "\n")
    return root / top


if __name__ == "__main__":
    print(aiter_root())
