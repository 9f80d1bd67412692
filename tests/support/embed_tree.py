"""Helpers shared by test files (first written in test_embed_build.py)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from support.common import KERNELS, run_qola

TYPES = ("vec_add", "vec_scale")


NS, MODULE, MD_NAME = "qk", "module_asm", "qk_module_asm"


def _run(cmd: Sequence[object], **kw: Any) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    assert proc.returncode == 0, f"{cmd}\n{proc.stdout}\n{proc.stderr}"
    return proc


def tree_with_code_objects(tmp: Path, arch: str) -> Path:
    """A copy of the example tree (never the repo's) with hsa/<arch>/ built by its own script."""
    tree = tmp / "kernels"
    shutil.copytree(KERNELS, tree, ignore=shutil.ignore_patterns("hsa", "__pycache__"))
    (tree / "hsa").mkdir()
    _run([sys.executable, tree / "scripts" / "build_hsa.py", "--arch", arch, "--output", tree / "hsa"])
    return tree


def qola_build(tmp: Path, tree: Path, arch: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    m = tmp / "q.toml"
    m.write_text(
        f'[qola]\nnamespace = "{NS}"\n[build]\narchitectures = ["{arch}"]\n\n'
        f'[[modules]]\nname = "{MODULE}"\nembed = {json.dumps(list(TYPES))}\n'
    )
    out = tmp / "out"
    return run_qola("build", "--manifest", str(m), "--aiter-root", str(tree), "-o", str(out), "-j", "2"), out
