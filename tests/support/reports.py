"""CompileReports made without compiling, for the tests of what publishing writes into OUT."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

from qola.compile.results import CompileReport, ModuleResult, Status
from qola.output.publish import Contents, publish
from qola.plan.model import Plan
from qola.toolchain.base import Toolchain


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
        results.append(
            ModuleResult(name, md, "cpp_itfs", "shared", status=Status(status), artifact=art, log=(f"{name} log",))
        )
    return CompileReport(
        cast(Plan, fake_plan(tmp, "q.toml", ("sm_90",))),
        cast(Toolchain, FAKE_TOOLCHAIN),
        tuple(results),
        tmp / "b",
        1.0,
    )


def fake_plan(tmp: Path, manifest_path: str, archs: tuple[str, ...]) -> SimpleNamespace:
    """What publishing reads of a Plan."""
    return SimpleNamespace(
        manifest_path=manifest_path,
        manifest_sha256="0" * 64,
        tree_root=str(tmp / "tree"),
        tree_commit=None,
        namespace="qk",
        archs=archs,
        fixes=(),
    )


FAKE_TOOLCHAIN = SimpleNamespace(
    kind="cuda", compiler="nvcc", version="12", identity="x", base_flags=("-O3",), dropped_flags=(), removed_flags=()
)


def report(
    tmp: Path, tag: str, modules: dict[str, bytes | None], *, build: str = "b", archs: tuple[str, ...] = ("sm_90",)
) -> tuple[CompileReport, list[Path], dict[str, str]]:
    """(a CompileReport of modules name -> library bytes (None: failed), headers, texts), every
    file marked with ``tag`` so two versions differ in every entry."""
    b = tmp / build
    (b / "lib").mkdir(parents=True, exist_ok=True)
    (b / "include").mkdir(parents=True, exist_ok=True)
    results = []
    for name, blob in modules.items():
        art = None
        if blob is not None:
            art = b / "lib" / f"qk_{name}.so"
            art.write_bytes(blob)
        results.append(
            ModuleResult(
                name,
                f"qk_{name}",
                "cpp_itfs",
                "shared",
                status=Status.BUILT if blob else Status.FAILED,
                artifact=art,
                log=(f"{name} log {tag}",),
                error=None if blob else "boom",
            )
        )
    header = b / "include" / "qola_mha_fwd.h"
    header.write_text(f"#pragma once\n// {tag}\n")
    texts = {"share/cmake/qola-qk/qola-qk-config.cmake": f"# {tag}\n", "lib/pkgconfig/qola-qk.pc": f"# {tag}\n"}
    return (
        CompileReport(
            cast(Plan, fake_plan(tmp, "/m/q.toml", archs)), cast(Toolchain, FAKE_TOOLCHAIN), tuple(results), b, 1.0
        ),
        [header],
        texts,
    )


def publish_version(tmp: Path, out: Path, tag: str, **kw: Any) -> Path:
    """Publish version ``tag`` (built in ``tmp``) into ``out``; the same ``tmp`` and ``tag`` give the
    same bytes, manifest.json included."""
    rep, headers, texts = report(tmp, tag, {"a": f"A-{tag}".encode() * 100, "b": f"B-{tag}".encode() * 100})
    return publish(rep, out, Contents(headers=headers, texts=texts, **{"source_date_epoch": "1700000000", **kw}))
