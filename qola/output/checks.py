"""The checks of a whole output directory against the manifest.json qola wrote there (what
``qola audit OUT`` runs, and what a prebuilt archive must pass before it is installed).

* **Layout.** ``OUT/lib``, ``include``, ``configs``, ``jit``, ``share``, ``logs`` are real
  directories and ``manifest.json`` a real file (never links). A publish a killed run left
  half-switched is completed first; the audit then holds OUT's switch lock shared, so no publish
  switches versions while it reads (:mod:`qola.output.outdir`). Other top-level entries (a kernel tree
  TE keeps inside OUT) are not qola's: a note names them, nothing under them is read.
* **Files.** Every file of the version is in manifest.json's ``files`` with its size and sha256,
  and every recorded file exists: an extra library in ``lib/``, garbage in ``jit/`` or a missing
  header is a problem. Symlinks, FIFOs and devices are problems and are never opened.
* **Kernels.** A library whose switch record (:mod:`qola.output.kernels`) shows a source compiled with a
  registry switch off (``mha_fwd.cu`` with ``FAV3_ON=0``: its kernel path compiled out; all off: its
  entry point returns -1 for every call) is a problem, read from the binary, not from manifest.json.
* **Modules.** A ``built`` module's artifact is one of those files, passes the ELF export audit
  (only ``qola::<ns>::…`` / ``<ns>_…``; a ``pybind`` module also ``PyInit_<module>``) and exports
  exactly its recorded ``exports`` (mangled or demangled names). A ``failed`` module is a problem
  — the output lacks it — unless ``--allow-failed``; it must have no artifact either way. Any other
  status (qola writes none, e.g. ``skipped``) is a problem: its files would go unchecked.

An output in the symlink layout of older qola versions (``OUT/current -> .qola/v<N>``) is read
in the version ``current`` names, with a note (the next build converts it); one whose manifest.json
has no ``files`` record gets the checks that need none: ``lib/`` holds only recorded
artifacts (and ``pkgconfig/``), ``jit/`` only dirs of modules with a ``jit`` record.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from qola.compile import elf as audit
from qola.core.errors import QolaError
from qola.core.hashing import regular_file_sha256
from qola.core.rules import check_namespace
from qola.output import kernels, outdir
from qola.output.outdir import DIRS
from qola.output.record import ModuleRecord
from qola.plan.tree.files import read_small

STATUSES = ("built", "failed")  # what qola writes


MAX_MANIFEST_JSON = 256 << 20  # a manifest.json qola writes is kilobytes; past this it is not one


def load_manifest(root: Path) -> dict[str, Any]:
    """OUT's ``manifest.json`` as data: a regular file (the checked open: no FIFO, device or link's
    surprise), at most :data:`MAX_MANIFEST_JSON`, a JSON object with a ``modules`` list."""
    path = Path(root) / "manifest.json"
    try:
        raw = read_small(path, limit=MAX_MANIFEST_JSON, what="output manifest")
    except FileNotFoundError:
        raise QolaError(f"{path} does not exist", hint="is OUT the --output-dir of a qola build?") from None
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise QolaError(f"cannot read {path}: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("modules"), list):
        raise QolaError(f"{path}: not a qola manifest (no 'modules' list)")
    builder = builder_of(data)
    if builder not in (None, "qola"):  # QoLA's output (or another builder's) under the same paths
        raise QolaError(
            f"{path}: this output was built by {builder}, not by qola: a cache key that names neither builder "
            "nor fixes (TE's rocm-<ver>_aiter-<sha>) lets one builder's output stand in for the other's",
            hint="rebuild it with qola build (or give the cache a key of its own per builder)",
        )
    return data


def builder_of(data: Mapping[str, Any]) -> str | None:
    """Who wrote a manifest.json, from what it holds: its ``builder`` (qola's since it records one),
    qola for a ``qola_version``, QoLA for QoLA's record (``generated_at`` and ``summary``, per module
    ``success`` / ``so_path`` and no ``status``); None: not known (audited as qola's)."""
    if "builder" in data:
        return str(data["builder"])
    if "qola_version" in data:
        return "qola"
    mods = data.get("modules")
    qolas = isinstance(mods, list) and all(isinstance(m, dict) and "status" not in m and "success" in m for m in mods)
    return "QoLA" if qolas and "generated_at" in data and "summary" in data else None


def resolve_root(out: Path) -> tuple[Path, list[str], list[str]]:
    """(the dir holding the published files, layout problems, notes): OUT itself, or the version an
    older qola's symlink layout names. Call under :func:`qola.output.outdir.reading`."""
    out = Path(out)
    notes = []
    if os.path.lexists(out / outdir.LEGACY_CURRENT):
        root = outdir.legacy_version(out)
        if root is None:
            raise QolaError(
                f"{out / outdir.LEGACY_CURRENT} does not name a version under {out / outdir.STORE}",
                hint="rebuild into OUT (qola build -o OUT)",
            )
        return root, [], [f"{out} is in the symlink layout of an older qola (the next build converts it)"]
    problems = outdir.entry_problems(out) if outdir.published(out) else []
    for entry in sorted(os.listdir(out)) if out.is_dir() else []:
        if entry not in (*outdir.ENTRIES, outdir.STORE):
            notes.append(f"{out / entry} is not part of qola's output (left alone, not audited)")
    st = outdir.store(out)
    if os.path.lexists(st) and (st.is_symlink() or not st.is_dir()):
        problems.append(f"layout: {st} is not a directory")
    return out, problems, notes


def _walk(root: Path) -> tuple[dict[str, os.stat_result], list[str]]:
    """(root-relative path -> lstat of every regular file under the output's dirs, problems for
    entries that are neither files nor dirs). Never follows a symlink; never looks outside the
    output's own entries (``.qola``, a kernel tree inside OUT)."""
    found, problems = {}, []
    for top in DIRS:
        base = Path(root) / top
        try:
            st = os.lstat(base)
        except FileNotFoundError:
            continue
        if not stat.S_ISDIR(st.st_mode):
            continue  # the layout check reports it
        for d, dirs, files in os.walk(base):
            for name in sorted(dirs + files):
                p = Path(d) / name
                rel = p.relative_to(root).as_posix()
                st = os.lstat(p)
                if stat.S_ISDIR(st.st_mode):
                    continue
                if not stat.S_ISREG(st.st_mode):
                    kind = "a symlink" if stat.S_ISLNK(st.st_mode) else "not a regular file"
                    problems.append(f"files: {rel} is {kind}")
                else:
                    found[rel] = st
    return found, problems


def check_files(root: Path, recorded: Mapping[str, object]) -> tuple[int, list[str]]:
    """(files checked, problems): the tree under ``root`` equals ``recorded`` exactly."""
    present, problems = _walk(root)
    for rel in sorted(set(present) - set(recorded)):
        problems.append(f"files: {rel} is not recorded in manifest.json")
    for rel in sorted(recorded):
        want = recorded[rel]
        if rel not in present:
            if not isinstance(rel, str) or rel.startswith("/") or ".." in rel.split("/"):
                problems.append(f"files: recorded path {rel!r} is not inside the output")
            else:
                problems.append(f"files: {rel} is recorded but missing")
            continue
        if not isinstance(want, dict):
            problems.append(f"files: {rel}: record {want!r} is not an object")
            continue
        try:
            digest, size = regular_file_sha256(root / rel)
        except OSError as exc:
            problems.append(f"files: {rel}: cannot read: {exc}")
            continue
        if want.get("size") != size:
            problems.append(f"files: {rel} size {size} != recorded {want.get('size')}")
        if want.get("sha256") != digest:
            problems.append(f"files: {rel} sha256 {digest[:16]}… != recorded {str(want.get('sha256'))[:16]}…")
    return len(present), problems


def check_unrecorded_legacy(root: Path, modules: Sequence[ModuleRecord]) -> list[str]:
    """For a manifest without ``files``: lib/ and jit/ hold nothing the modules do not record."""
    arts = {m.artifact for m in modules}
    jits = {m.jit_dir() for m in modules}
    present, problems = _walk(root)
    for rel in sorted(present):
        top = rel.split("/")[0]
        if top == "lib" and rel not in arts and not rel.startswith("lib/pkgconfig/"):
            problems.append(f"files: {rel} is not a recorded artifact")
        elif top == "jit" and "/".join(rel.split("/")[:2]) not in jits:
            problems.append(f"files: {rel} belongs to no module's recorded JIT dir")
    return problems


def _extra(module: ModuleRecord, artifact: Path) -> tuple[str, ...]:
    """Exports beyond qola::<ns>:: a module may have: a Python module's PyInit_<name>, derived from
    its file name. Never from the record: a manifest.json key cannot widen the check."""
    return ("PyInit_" + artifact.name.split(".")[0],) if module.mode == "pybind" else ()


def check_module(
    root: Path, module: ModuleRecord, namespace: str, files: Mapping[str, object] | None = None
) -> list[str]:
    """Every problem of one built module, as lines (empty when clean)."""
    name, rel = module.name, module.artifact
    if not rel:
        return [f"{name}: status built but no artifact recorded"]
    if files is not None and rel not in files:
        return [f"{name}: artifact {rel} is not in manifest.json's files"]
    path = Path(root) / rel
    try:
        digest, size = regular_file_sha256(path)
    except FileNotFoundError:
        return [f"{name}: {rel} is missing"]
    except OSError as exc:
        return [f"{name}: {rel}: cannot read: {exc}"]
    problems = []
    if module.size is not None and module.size != size:
        problems.append(f"{name}: {rel} size {size} != recorded {module.size}")
    if module.sha256 and module.sha256 != digest:
        problems.append(f"{name}: {rel} sha256 {digest[:16]}… != recorded {module.sha256[:16]}…")
    try:
        result = audit.audit_artifact(path, namespace, extra=_extra(module, path), check=False)
    except QolaError as exc:
        return [*problems, f"{name}: {rel}: {exc.message}"]
    problems += [f"{name}: {rel}: leak: {line}" for line in result.problems()]
    try:  # from the binary: a source compiled with a kernel switch off (qola.output.kernels)
        problems += [f"{name}: {rel}: cannot compute: {line}" for line in kernels.switch_problems(path, name)]
    except QolaError as exc:
        problems.append(f"{name}: {rel}: {exc.message}")
    if module.exports is not None:
        want = set(module.exports)
        seen = set()
        for sym in result.exports:
            hit = {sym.name, sym.demangled} & want
            if hit:
                seen |= hit
            else:
                problems.append(f"{name}: {rel}: unexpected export {sym.demangled}")
        for missing in sorted(want - seen):
            problems.append(f"{name}: {rel}: recorded export {missing} is gone")
    return problems


def _parse(raw: object) -> ModuleRecord | QolaError:
    """A module's record, or why it is damaged (a problem of the audit)."""
    try:
        return ModuleRecord.parse(raw)
    except QolaError as exc:
        return exc


def audit_output(
    out_dir: Path, namespace: str | None = None, *, allow_failed: bool = False
) -> tuple[int, list[str], list[str]]:
    """(artifacts checked, problem lines, notes) for an output directory (one version: a
    half-switched publish completed first, the switch lock held shared while reading)."""
    with outdir.reading(Path(out_dir)):
        return _audit_output(Path(out_dir), namespace, allow_failed=allow_failed)


def _audit_output(out_dir: Path, namespace: str | None, *, allow_failed: bool) -> tuple[int, list[str], list[str]]:
    root, problems, notes = resolve_root(out_dir)
    data = load_manifest(root)
    ns = check_namespace(namespace or data.get("namespace") or "")
    modules = [_parse(m) for m in data["modules"]]
    files = data.get("files")
    if isinstance(files, dict):
        nfiles, more = check_files(root, files)
        problems += more
        notes.append(f"{nfiles} file(s)")
    else:
        files = None
        problems += check_unrecorded_legacy(root, [m for m in modules if isinstance(m, ModuleRecord)])
        notes.append(
            "manifest.json records no file list (written by an older qola): only lib/ and jit/ "
            "were checked for unrecorded files"
        )
    checked = 0
    for module in modules:
        if isinstance(module, QolaError):
            problems.append(module.message)
            continue
        name, status = module.name, module.status
        if status == "built":
            checked += 1
            problems += check_module(root, module, ns, files)
        elif status == "failed":
            if module.artifact:
                problems.append(f"{name}: status failed but artifact {module.artifact} recorded")
            md = module.md_name
            for lib in (f"lib/{md}.so", f"lib/{md}.a") if md else ():
                if lib in (files or {}) or os.path.lexists(root / lib):  # exact names, never a pattern
                    problems.append(f"{name}: status failed but its library {lib} is present")
            line = f"{name}: failed to build (see {module.log or 'its log'})"
            (notes if allow_failed else problems).append(line)
        else:
            problems.append(
                f"{name}: status {status!r} is not one qola writes ({' or '.join(STATUSES)}): its files are not checked"
            )
    return checked, problems, notes
