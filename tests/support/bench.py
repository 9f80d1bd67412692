"""The bench scripts (``bench/*.py``) loaded as modules for their host tests."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]


def load(name: str) -> ModuleType:
    """``bench/<name>.py`` as module ``name`` (registered first: its dataclasses look their module
    up; ``bench/`` on sys.path: its helpers import each other)."""
    if str(REPO / "bench") not in sys.path:
        sys.path.insert(0, str(REPO / "bench"))
    spec = importlib.util.spec_from_file_location(name, REPO / "bench" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod
