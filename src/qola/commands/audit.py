"""``qola audit O``: re-check every built artifact of an output directory against its manifest.json.

For each module with an artifact: the file exists, its size and sha256 match, the ELF export
audit passes (only ``qola::<ns>::…`` / ``<ns>_…``), and the exported names equal the recorded
``exports``. Exit 0 when clean, 1 listing every mismatch, 2 when manifest.json is missing or
unreadable.

manifest.json, as far as this command reads it::

    {"namespace": "te",
     "modules": [{"name": "libmha_fwd", "status": "built", "artifact": "lib/te_libmha_fwd.so",
                  "sha256": "…", "size": 123, "exports": ["_ZN4qola2te…", "te_…"],
                  "mode": "cpp_itfs", "allowed_extra": []}]}

``exports`` entries may be mangled or demangled names. Modules whose status is ``failed`` or
``skipped`` (or that have no artifact) are not checked. A ``pybind`` module may also export
``PyInit_<module>``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

from qola import audit
from qola.errors import BuildFailed, QolaError

SKIPPED_STATUS = ("failed", "skipped", "not_built", "error")


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "audit",
        help="re-check built libraries: checksums, exported symbols, isolation",
        description="Re-check each artifact listed in OUT/manifest.json: size and sha256, the ELF "
        "export audit (only qola::<ns>:: and <ns>_ symbols), and the recorded export list.",
    )
    p.add_argument("output_dir", metavar="OUT", help="a qola output directory (holds manifest.json)")
    p.add_argument("--namespace", help="check against this namespace instead of the manifest's")
    p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                   help="show a traceback on errors")
    p.set_defaults(func=run)


def load_manifest(out_dir: Path) -> dict:
    path = Path(out_dir) / "manifest.json"
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise QolaError(f"{path} does not exist", hint="is OUT the --output-dir of a qola build?") from None
    except (OSError, ValueError) as exc:
        raise QolaError(f"cannot read {path}: {exc}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("modules"), list):
        raise QolaError(f"{path}: not a qola manifest (no 'modules' list)")
    return data


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _extra(module: dict, artifact: Path) -> tuple[str, ...]:
    extra = [str(x) for x in module.get("allowed_extra") or []]
    if module.get("mode") == "pybind":
        extra.append("PyInit_" + artifact.name.split(".")[0])
    return tuple(extra)


def check_module(out_dir: Path, module: dict, namespace: str) -> list[str]:
    """Every mismatch of one module, as lines (empty when clean)."""
    name = module.get("name", "?")
    rel = module.get("artifact")
    if not isinstance(rel, str) or not rel:
        return [f"{name}: no artifact recorded (status {module.get('status')!r})"]
    path = Path(out_dir) / rel
    if not path.is_file():
        return [f"{name}: {rel} is missing"]
    problems = []
    size = path.stat().st_size
    if module.get("size") is not None and module["size"] != size:
        problems.append(f"{name}: {rel} size {size} != recorded {module['size']}")
    digest = _sha256(path)
    if module.get("sha256") and module["sha256"] != digest:
        problems.append(f"{name}: {rel} sha256 {digest[:16]}… != recorded {str(module['sha256'])[:16]}…")
    try:
        result = audit.audit_artifact(path, namespace, extra=_extra(module, path), check=False)
    except QolaError as exc:
        return problems + [f"{name}: {rel}: {exc.message}"]
    problems += [f"{name}: {rel}: leak: {line}" for line in result.problems()]
    recorded = module.get("exports")
    if isinstance(recorded, list):
        want = {str(x) for x in recorded}
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


def audit_output(out_dir: Path, namespace: str | None = None) -> tuple[int, list[str]]:
    """(number of artifacts checked, mismatch lines) for an output directory."""
    data = load_manifest(out_dir)
    ns = audit.check_namespace(namespace or data.get("namespace") or "")
    checked, problems = 0, []
    for module in data["modules"]:
        if not isinstance(module, dict):
            problems.append(f"manifest.json: module entry {module!r} is not an object")
            continue
        if module.get("status") in SKIPPED_STATUS or (not module.get("artifact") and module.get("status") != "built"):
            continue
        checked += 1
        problems += check_module(Path(out_dir), module, ns)
    return checked, problems


def run(args: argparse.Namespace) -> int:
    checked, problems = audit_output(Path(args.output_dir), args.namespace)
    if problems:
        body = "\n".join(f"  {p}" for p in problems)
        raise BuildFailed(f"audit of {args.output_dir}: {len(problems)} problem(s) in {checked} artifact(s):\n{body}")
    print(f"audit of {args.output_dir}: {checked} artifact(s) clean")
    return 0
