"""Publish a build into the output dir: every file lands by rename, ``manifest.json`` last.

Nothing of a module lands in the output dir unless it linked (and passed its
audit); a failed module's stale artifact from an earlier build is removed so the
output never disagrees with its ``manifest.json``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from qola import __version__
from qola.build import BuildReport, ModuleResult
from qola.hashing import file_sha256

MANIFEST_JSON = "manifest.json"


def atomic_write(path: Path, data: bytes, mode: int | None = None) -> None:
    """Write to a temp name in the same dir, fsync, rename: readers see the old or the new file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def atomic_copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f".{dst.name}.tmp-{os.getpid()}")
    try:
        shutil.copyfile(src, tmp)
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.chmod(tmp, os.stat(src).st_mode & 0o777)
        os.replace(tmp, dst)
    finally:
        if tmp.exists():
            tmp.unlink()


def _instances(names: tuple[str, ...]) -> dict[str, Any]:
    digest = hashlib.sha256("\n".join(sorted(names)).encode()).hexdigest()
    return {"count": len(names), "sha256": digest, "names": sorted(names)}


def module_record(r: ModuleResult, out: Path) -> dict[str, Any]:
    rec: dict[str, Any] = {
        "name": r.name, "md_name": r.md_name, "mode": r.mode, "link": r.link, "status": r.status,
        "sources": r.sources, "generated": r.generated, "instances": _instances(r.instances),
        "duration_s": round(r.seconds, 3), "log": f"logs/{r.name}.log", "warnings": list(r.warnings),
    }
    if r.status == "built" and r.artifact is not None:
        dst = out / "lib" / r.artifact.name
        rec.update({"artifact": f"lib/{r.artifact.name}", "size": dst.stat().st_size, "sha256": file_sha256(dst),
                    "exports": list(r.exports)})
    else:
        rec.update({"artifact": None, "error": {"message": r.error or "failed", "log": f"logs/{r.name}.log"}})
    return rec


def copy_configs(tree_root: Path, out: Path) -> list[str]:
    src = tree_root / "aiter" / "configs"
    copied = []
    for csv in sorted(src.rglob("*.csv")) if src.is_dir() else []:
        rel = csv.relative_to(src)
        atomic_copy(csv, out / "configs" / rel)
        copied.append(str(rel))
    return copied


def publish_tree(src: Path | None, dst: Path) -> None:
    """Make ``dst`` hold exactly the files of ``src`` (each copied by temp + rename, then files no
    longer in ``src`` removed); ``src`` None removes ``dst``."""
    if src is None:
        shutil.rmtree(dst, ignore_errors=True)
        return
    files = sorted(p.relative_to(src) for p in src.rglob("*") if p.is_file())
    for rel in files:
        atomic_copy(src / rel, dst / rel)
    keep = set(files)
    for p in sorted(dst.rglob("*"), reverse=True) if dst.is_dir() else []:
        if p.is_file() and p.relative_to(dst) not in keep:
            p.unlink()
        elif p.is_dir() and not any(p.iterdir()):
            p.rmdir()


def publish(report: BuildReport, out: Path, *, headers: Iterable[Path] = (), extra: Mapping[str, Any] | None = None,
            mode: str | None = None, texts: Mapping[str, str | None] | None = None,
            trees: Mapping[str, Path | None] | None = None,
            module_extra: Mapping[str, Mapping[str, Any]] | None = None, withdrawn: Iterable[str] = ()) -> Path:
    """Copy what built into ``out``; write logs and manifest.json. Returns the manifest.json path.

    ``headers`` go to OUT/include (only what the modules that built need); ``withdrawn``: names in
    OUT/include to remove (a failed module's headers from an earlier build); ``texts``: OUT-relative
    path -> text (None: remove the file); ``trees``: OUT-relative dir -> build dir to mirror there
    (None: remove it), published before the libraries (the JIT sources a library reads);
    ``module_extra``: keys added to a module's record."""
    out.mkdir(parents=True, exist_ok=True)
    for rel, src in (trees or {}).items():
        publish_tree(src, out / rel)
    for r in report.modules:
        atomic_write(out / "logs" / f"{r.name}.log", ("\n".join(r.log) + "\n").encode())
        if r.status == "built" and r.artifact is not None:
            atomic_copy(r.artifact, out / "lib" / r.artifact.name)
        else:
            for stale in (out / "lib").glob(f"{r.md_name}.*") if (out / "lib").is_dir() else []:
                stale.unlink()
    headers = list(headers)
    for h in headers:
        atomic_copy(h, out / "include" / h.name)
    for name in set(withdrawn) - {h.name for h in headers}:
        (out / "include" / name).unlink(missing_ok=True)
    for rel, text in (texts or {}).items():
        if text is None:
            (out / rel).unlink(missing_ok=True)
        else:
            atomic_write(out / rel, text.encode())
    plan, tc = report.plan, report.toolchain
    data = {
        "qola_version": __version__,
        "manifest": {"path": plan.manifest_path, "sha256": plan.manifest_sha256},
        "tree": {"path": plan.tree_root, "commit": plan.tree_commit},
        "namespace": plan.namespace,
        "toolchain": {"kind": tc.kind, "compiler": tc.compiler, "version": tc.version, "identity": tc.identity},
        "archs": list(plan.archs),
        "mode": mode,
        "configs": copy_configs(Path(plan.tree_root), out),
        "modules": [{**module_record(r, out), **(module_extra or {}).get(r.name, {})} for r in report.modules],
        "duration_s": round(report.seconds, 3),
        **(extra or {}),
    }
    path = out / MANIFEST_JSON
    atomic_write(path, (json.dumps(data, indent=2, sort_keys=True) + "\n").encode())
    return path
