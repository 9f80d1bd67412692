"""A fake hipcc: answers ``--version`` (the HIP version given) and does nothing else, so a dry run
plans and writes a HIP build's graph on a host without ROCm."""

from __future__ import annotations

from pathlib import Path

FAKE_HIPCC = """#!/bin/sh
for a in "$@"; do case "$a" in --version) printf 'HIP version: {version}-fake\\nclang version 19\\n'; exit 0 ;; esac; done
exit 0
"""


def fake_hipcc(path: Path, version: str = "6.4.43484") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(FAKE_HIPCC.replace("{version}", version))
    path.chmod(0o755)
    return path
