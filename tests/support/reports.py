"""Helpers shared by test files (moved out of test_publish_confined.py by scripts/restructure_tests.py)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from qola.compile.steps import CompileReport, ModuleResult


def fake_report(tmp: Path, modules: list[tuple[str, str, str, bytes | None]]) -> CompileReport:
    """A CompileReport of (name, md_name, status, library bytes or None) with artifacts in tmp/b/lib."""
    lib = tmp / "b" / "lib"
    lib.mkdir(parents=True, exist_ok=True)
    results = []
    for name, md, status, blob in modules:
        art = None
        if blob is not None:
            art = lib / f"{md}.so"
            art.write_bytes(blob)
        results.append(ModuleResult(name, md, "cpp_itfs", "shared", status=status, artifact=art, log=[f"{name} log"]))
    plan = SimpleNamespace(
        manifest_path="q.toml",
        manifest_sha256="0" * 64,
        tree_root=str(tmp / "tree"),
        tree_commit=None,
        namespace="qk",
        archs=("sm_90",),
    )
    tc = SimpleNamespace(
        kind="cuda",
        compiler="nvcc",
        version="12",
        identity="x",
        base_flags=("-O3",),
        dropped_flags=(),
        removed_flags=(),
    )
    return CompileReport(plan, tc, results, tmp / "b", 1.0)
