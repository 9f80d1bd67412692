"""``manifest.json``'s per-module and per-file records: one typed shape for the publish that writes
them (:mod:`qola.output.publish`) and every reader (``qola audit``, ``--reproduce``, ``--keep-going``'s
kept library, ``qola usage cover``). The JSON keeps its form; :meth:`ModuleRecord.parse` reads an
entry back, one written by an older qola included (absent keys take their defaults), and refuses a
damaged one (a key of the wrong type, an artifact outside the output) with a QolaError."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from qola.compile.layout import BuildLayout
from qola.compile.results import ModuleResult, Status
from qola.core.errors import QolaError

HINT = "the output's manifest.json is damaged or was edited: rebuild the output dir (or reinstall it)"
# the keys a module's record holds itself; any other is a feature's (module_extra: jit, kept, …)
OWN = frozenset(
    {"name", "md_name", "mode", "link", "status", "sources", "generated", "instances", "duration_s", "log",
     "warnings", "artifact", "size", "sha256", "exports", "success", "so_path", "error"}
)  # fmt: skip

T = TypeVar("T")


@dataclass(frozen=True)
class FileRecord:
    """One file of a version (``manifest.json``'s ``files``): its size and sha256."""

    sha256: str
    size: int

    def to_json(self) -> dict[str, object]:
        return {"sha256": self.sha256, "size": self.size}


@dataclass(frozen=True)
class Names:
    """A set of unit names as manifest.json records it (``instances``, ``jit.aot``, ``jit.deferred``):
    the count, the sha256 of the sorted names, the names."""

    names: tuple[str, ...] = ()

    def to_json(self) -> dict[str, object]:
        names = sorted(self.names)
        return {"count": len(names), "sha256": hashlib.sha256("\n".join(names).encode()).hexdigest(), "names": names}

    @classmethod
    def parse(cls, raw: object) -> Names:
        """Leniently: the string names of ``raw["names"]``; none when it is not there."""
        names = raw.get("names") if isinstance(raw, Mapping) else None
        return cls(tuple(n for n in names if isinstance(n, str)) if isinstance(names, list) else ())


def inside_output(rel: str) -> bool:
    """Whether an OUT-relative path recorded in manifest.json stays inside the output."""
    return bool(rel) and not rel.startswith("/") and ".." not in rel.split("/")


@dataclass(frozen=True)
class ModuleRecord:
    """A module's entry of manifest.json. QoLA's keys: ``success`` (built and published), ``so_path``
    (the library, relative to OUT like ``artifact``; None when it failed), ``error`` (the reason, ""
    when it built). ``extra``: the keys a feature adds (``jit``, ``kept``), as JSON values. Of a
    record read back, every field but ``name`` may be its default (an older qola; no ``status``: "")."""

    name: str
    status: str
    md_name: str | None = None
    mode: str | None = None
    link: str | None = None
    sources: int = 0
    generated: int = 0
    instances: Names = Names()
    duration_s: float = 0.0
    log: str | None = None
    warnings: tuple[str, ...] = ()
    artifact: str | None = None
    size: int | None = None
    sha256: str | None = None
    exports: tuple[str, ...] | None = None  # None: not recorded (a failed module)
    success: bool = True  # absent in an older qola's record: taken as built
    error: str = ""
    extra: Mapping[str, object] = field(default_factory=dict)

    @property
    def built(self) -> bool:
        return self.status == Status.BUILT

    @classmethod
    def of(
        cls, r: ModuleResult, files: Mapping[str, FileRecord], extra: Mapping[str, object] | None = None
    ) -> ModuleRecord:
        """``r``'s record; ``files``: the version's files (the artifact's size and sha256 come from
        there: a module whose library is not among them is recorded as failed)."""
        art = f"lib/{r.artifact.name}" if r.artifact is not None else None
        f = files.get(art) if r.status == Status.BUILT and art is not None else None
        return cls(
            name=r.name, status=r.status.value, md_name=r.md_name, mode=r.mode, link=r.link, sources=r.sources,
            generated=r.generated, instances=Names(r.instances), duration_s=round(r.seconds, 3),
            log=BuildLayout.log_rel(r.name), warnings=tuple(r.warnings), extra=dict(extra or {}),
            artifact=art if f is not None else None, size=None if f is None else f.size, sha256=None if f is None else f.sha256,
            exports=tuple(r.exports) if f is not None else None, success=f is not None,
            error="" if f is not None else r.error or "failed",
        )  # fmt: skip

    def to_json(self) -> dict[str, object]:
        """The record as manifest.json holds it (a failed module: no size, sha256 or exports)."""
        rec: dict[str, object] = {
            "name": self.name, "md_name": self.md_name, "mode": self.mode, "link": self.link,
            "status": self.status, "sources": self.sources, "generated": self.generated,
            "instances": self.instances.to_json(), "duration_s": self.duration_s, "log": self.log,
            "warnings": list(self.warnings), "artifact": self.artifact,
        }  # fmt: skip
        if self.success:
            rec.update({"size": self.size, "sha256": self.sha256, "exports": list(self.exports or ())})
        rec.update({"success": self.success, "so_path": self.artifact if self.success else None, "error": self.error})
        return {**rec, **self.extra}

    @classmethod
    def parse(cls, raw: object, where: str = "manifest.json") -> ModuleRecord:
        """A module's entry read back; QolaError when it is damaged."""
        if not isinstance(raw, Mapping):
            raise QolaError(f"{where}: module entry {raw!r} is not an object", hint=HINT)
        name = _field(raw, "name", str, where, None)
        if name is None:
            raise QolaError(f"{where}: a module entry records no name", hint=HINT)
        at = f"{where}: module {name!r}"
        exports = _field(raw, "exports", list, at, None)
        artifact = _field(raw, "artifact", str, at, None)
        if artifact is not None and not inside_output(artifact):
            raise QolaError(f"{at}: artifact {artifact!r} is not inside the output", hint=HINT)
        return cls(
            name=name, status=_field(raw, "status", str, at, ""), md_name=_field(raw, "md_name", str, at, None),
            mode=_field(raw, "mode", str, at, None), link=_field(raw, "link", str, at, None),
            sources=_field(raw, "sources", int, at, 0), generated=_field(raw, "generated", int, at, 0),
            instances=Names.parse(raw.get("instances")), duration_s=_seconds(raw.get("duration_s")),
            log=_field(raw, "log", str, at, None), warnings=tuple(str(w) for w in _field(raw, "warnings", list, at, [])),
            artifact=artifact, size=_field(raw, "size", int, at, None), sha256=_field(raw, "sha256", str, at, None),
            exports=None if exports is None else tuple(str(x) for x in exports),
            success=_field(raw, "success", bool, at, True), error=_field(raw, "error", str, at, ""),
            extra={str(k): v for k, v in raw.items() if k not in OWN},
        )  # fmt: skip

    def jit_names(self) -> tuple[Names, Names] | None:
        """(built ahead, deferred) of the module's ``jit`` entry; None when it has none."""
        jit = self.extra.get("jit")
        return (Names.parse(jit.get("aot")), Names.parse(jit.get("deferred"))) if isinstance(jit, Mapping) else None

    def jit_dir(self) -> str | None:
        """The OUT-relative dir of the module's ``jit`` entry (None: none recorded)."""
        jit = self.extra.get("jit")
        d = jit.get("dir") if isinstance(jit, Mapping) else None
        return d if isinstance(d, str) else None


def _field(raw: Mapping[str, object], key: str, kind: type[T], where: str, default: T) -> T:
    """``raw[key]`` when it is a ``kind`` (a bool is no int), ``default`` when absent or null;
    QolaError for any other value."""
    value = raw.get(key)
    if value is None:
        return default
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise QolaError(f"{where}: {key} is {value!r}, not a {kind.__name__}", hint=HINT)
    return value


def _seconds(value: object) -> float:
    """A recorded duration (0 when absent or not a number: only shown)."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0


def summary(modules: list[ModuleRecord]) -> dict[str, int]:
    """manifest.json's ``summary`` (QoLA's key): modules in total, built, failed."""
    ok = sum(m.success for m in modules)
    return {"total": len(modules), "success": ok, "failed": len(modules) - ok}
