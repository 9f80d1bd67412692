"""The one file-hashing helper (sha256, streamed)."""

from __future__ import annotations

import hashlib
import os


def file_sha256(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()
