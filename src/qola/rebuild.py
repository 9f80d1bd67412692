"""The recipe of the incremental path: what a build with only some ninja edges dirty needs from the
last full build, so that it runs ninja, the audit and the publish without stages 1-8.

After a fully successful build the pipeline records (:func:`save`, ``BUILD/.qola-rebuild.json``) the
plan and toolchain, ninja's targets and jobs, and per module its result as it stood before ninja ran
(counts, instances, warnings), its artifact's stat and its exported symbols. The no-op record
(:mod:`qola.fastpath`) then covers this file and every input of stages 1-8, including the files
stage 8 wrote and the generated dirs' listings: when its digest holds, stages 1-8 would write
nothing new, and ninja on the recorded graph is the whole build, followed by the audit of the
libraries ninja relinked (:func:`changed`) and a publish.

A build whose hooks read contents the digest does not cover gets no recipe (:func:`eligible`): a
module with instances deferred to the JIT (their sources and header closure are copied into OUT).
Its dirty edges take the full path.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from qola.build import CompileReport, ModuleResult
    from qola.extras import ModuleExtra
    from qola.plantypes import Plan
    from qola.toolchain import Toolchain

RECIPE = ".qola-rebuild.json"
FORMAT = 1
_FIELDS = ("name", "md_name", "mode", "link", "sources", "generated", "warnings")


def artifact_key(path: str | os.PathLike) -> list | None:
    """What tells a relinked artifact from the one recorded (None: absent)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]


@dataclass(frozen=True)
class NinjaArgs:
    """How the incremental path runs ninja (kept in the no-op record: a no-op reads nothing more)."""

    jobs: int
    targets: tuple[str, ...]
    env: Mapping[str, str]  # the toolchain's additions to the environment
    artifacts: Mapping[str, str]  # artifact (relative to the build dir) -> module

    def owner(self, out: str) -> str | None:
        """The module of a ninja output: its artifact's, or (objects live in obj/<module>/) its dir's."""
        found = self.artifacts.get(out)
        if found is None and out.startswith("obj/") and out.count("/") > 1:
            found = out.split("/")[1]
        return found

    def to_json(self) -> dict[str, Any]:
        return {"jobs": self.jobs, "targets": list(self.targets), "env": dict(self.env),
                "artifacts": dict(self.artifacts)}

    @classmethod
    def of(cls, data: Mapping[str, Any]) -> NinjaArgs:
        return cls(int(data["jobs"]), tuple(data["targets"]), dict(data["env"]), dict(data["artifacts"]))


@dataclass
class Recipe:
    plan: dict[str, Any]  # Plan.to_json()
    toolchain: dict[str, Any]  # Toolchain.to_dict()
    jobs: int
    targets: list[str]  # ninja's targets (module_<name>)
    modules: list[dict[str, Any]]  # per module: _FIELDS, instances, log (before ninja), artifact, key, exports

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "plan": self.plan, "toolchain": self.toolchain, "jobs": self.jobs,
                "targets": self.targets, "modules": self.modules}

    def ninja_args(self) -> NinjaArgs:
        return NinjaArgs(self.jobs, tuple(self.targets), dict(self.toolchain.get("child_env") or {}),
                         {m["artifact_rel"]: m["name"] for m in self.modules})

    def results(self) -> list[ModuleResult]:
        """Each module's result as it stood before ninja ran (status pending, exports as recorded)."""
        from qola.build import ModuleResult  # noqa: PLC0415

        out = []
        for m in self.modules:
            r = ModuleResult(**{k: m[k] for k in _FIELDS if k != "warnings"})
            r.warnings, r.instances, r.log = list(m["warnings"]), tuple(m["instances"]), list(m["log"])
            r.artifact, r.exports = Path(m["artifact"]), list(m["exports"])
            out.append(r)
        return out

    def changed(self, root: Path) -> set[str]:
        """The modules whose artifact is not the one recorded (relinked, or gone)."""
        return {m["name"] for m in self.modules if artifact_key(root / m["artifact_rel"]) != m["key"]}

    def typed(self) -> tuple[Plan, Toolchain]:
        from qola.plantypes import Plan  # noqa: PLC0415
        from qola.toolchain import Toolchain  # noqa: PLC0415

        return Plan.from_json(self.plan), Toolchain.from_dict(self.toolchain)


def eligible(extras: Mapping[str, ModuleExtra]) -> bool:
    """Whether stages 1-8 read nothing but what the no-op digest covers (no JIT-deferred instances)."""
    return not any(e.jit is not None or e.trees for e in extras.values())


def of(report: CompileReport, plan: Plan, tc: Toolchain, jobs: int, logs: Mapping[str, list[str]],
       root: Path) -> Recipe:
    """The recipe of a build whose every module built; ``logs``: each module's log before ninja ran."""
    mods = []
    for r in report.modules:
        assert r.artifact is not None
        rel = r.artifact.relative_to(root).as_posix()
        mods.append({**{k: getattr(r, k) for k in _FIELDS}, "warnings": list(r.warnings),
                     "instances": list(r.instances), "log": list(logs.get(r.name, [])), "artifact": str(r.artifact),
                     "artifact_rel": rel, "key": artifact_key(r.artifact), "exports": list(r.exports)})
    return Recipe(plan.to_json(), tc.to_dict(), jobs, [f"module_{r.name}" for r in report.modules], mods)


def updated(recipe: Recipe, report: CompileReport) -> Recipe:
    """``recipe`` after an incremental build whose every module built: new artifact stats and exports."""
    now = {r.name: r for r in report.modules}
    mods = [{**m, "key": artifact_key(m["artifact"]), "exports": list(now[m["name"]].exports)}
            for m in recipe.modules]
    return Recipe(recipe.plan, recipe.toolchain, recipe.jobs, recipe.targets, mods)


def save(root: Path, recipe: Recipe | None) -> Path:
    """Write ``recipe`` into the build dir (None: remove the one there). Its path."""
    path = root / RECIPE
    if recipe is None:
        path.unlink(missing_ok=True)
        return path
    import json  # noqa: PLC0415

    from qola.fsutil import atomic_write  # noqa: PLC0415

    return atomic_write(path, json.dumps(recipe.to_json(), separators=(",", ":")).encode())


def load(root: Path) -> Recipe | None:
    """The recipe in the build dir, or None (absent, or not one this qola wrote)."""
    import json  # noqa: PLC0415

    try:
        data = json.loads((root / RECIPE).read_text())
        if data.get("format") != FORMAT:
            return None
        return Recipe(data["plan"], data["toolchain"], int(data["jobs"]), list(data["targets"]), list(data["modules"]))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
