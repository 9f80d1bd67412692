"""What a set of usage records covers in a built output (``qola usage cover``): for each recorded
variant, whether ``OUT`` built it ahead, defers it to the JIT, or lacks it, read from
``OUT/manifest.json`` (per module ``jit.aot``/``jit.deferred`` names, else ``instances``). A record
with event ``ahead`` (a library built with ``[usage] record_ahead``) names a variant its library built
ahead: it is ``ahead`` in an output that built it so (the same or another build)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from qola.core.errors import QolaError
from qola.output.checks import load_manifest
from qola.output.record import ModuleRecord
from qola.store.usage.records import Record

AHEAD, JIT, ABSENT, NO_MODULE = "ahead", "jit", "absent", "no-module"


@dataclass(frozen=True)
class Row:
    module: str
    unit: str
    status: str  # AHEAD | JIT | ABSENT | NO_MODULE
    events: tuple[str, ...]  # how the recorded runs resolved it (prebuilt, cache, compile, …)
    same_build: bool  # a record of it names OUT's build key


def _module(raw: object) -> ModuleRecord | None:
    """A module's record (None: damaged, left out)."""
    try:
        return ModuleRecord.parse(raw)
    except QolaError:
        return None


def cover(records: Iterable[Record], out: Path) -> tuple[list[Row], str | None]:
    """(one row per recorded (module, variant), sorted; OUT's build key)."""
    data = load_manifest(out)
    mods: dict[str, tuple[set[str], set[str]]] = {}
    for m in filter(None, map(_module, data["modules"])):
        if not m.success:
            continue
        jit = m.jit_names()
        aot, deferred = jit if jit is not None else (m.instances, None)
        mods[m.name] = (set(aot.names), set(deferred.names if deferred is not None else ()))
        if m.md_name is not None:
            mods.setdefault(m.md_name, mods[m.name])
    key = data.get("build_key") if isinstance(data.get("build_key"), str) else None
    seen: dict[tuple[str, str], list[Record]] = {}
    for r in records:
        seen.setdefault((r.module, r.unit), []).append(r)
    rows = []
    for (module, unit), recs in sorted(seen.items()):
        sets = mods.get(module) or mods.get(recs[0].md_name)
        status = NO_MODULE if sets is None else AHEAD if unit in sets[0] else JIT if unit in sets[1] else ABSENT
        rows.append(
            Row(
                module,
                unit,
                status,
                tuple(sorted({r.event for r in recs})),
                key is not None and any(r.build_key == key for r in recs),
            )
        )
    return rows, key
