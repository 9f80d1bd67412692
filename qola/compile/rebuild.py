"""What the incremental path needs from the last full build, so that a build with only some ninja
edges dirty runs ninja, the audit and the publish without stages 1-8.

After a fully successful build the pipeline keeps two things:

* :class:`Recipe` (``BUILD/.qola-rebuild.json``, written by the full path only): the plan and
  toolchain, and per module its result as it stood before ninja ran (counts, instances, warnings,
  log) and its artifact — what the publish needs and no stage after 8 changes;
* :class:`Run` (inside the no-op record, :mod:`qola.store.fastpath`, rewritten after every build): ninja's
  targets and jobs, and per module its artifact's stat and exported symbols as last audited.

The no-op record covers the recipe and every input of stages 1-8, including the files stage 8
wrote and the generated dirs' listings: when its digest holds, stages 1-8 would write nothing new,
and ninja on the recorded graph is the whole build, followed by the audit of the libraries ninja
relinked (:meth:`Run.changed`) and a publish.

A build whose hooks read contents the digest does not cover gets neither (:func:`eligible`): a
module with instances deferred to the JIT (their sources and header closure are copied into OUT).
Its dirty edges take the full path.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qola.compile.results import CompileReport, ModuleResult
from qola.core import inputs
from qola.core.fsutil import atomic_write

if TYPE_CHECKING:  # Recipe.typed imports them: the no-op path loads this module, not the plan's
    from qola.plan.model import Plan
    from qola.toolchain import Toolchain

if TYPE_CHECKING:
    from qola.compile.extras import ModuleExtra

RECIPE = ".qola-rebuild.json"
FORMAT = 2
_FIELDS = ("name", "md_name", "mode", "link", "sources", "generated")


def artifact_key(path: str | os.PathLike[str]) -> list[int] | None:
    """What tells a relinked artifact from the one recorded (None: absent)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]


@dataclass(frozen=True)
class Run:
    """How the incremental path runs ninja and what it knows of each artifact (kept in the no-op
    record: a no-op reads nothing more)."""

    jobs: int
    targets: tuple[str, ...]
    env: Mapping[str, str]  # the toolchain's additions to the environment
    artifacts: Mapping[str, str]  # artifact (relative to the build dir) -> module
    state: Mapping[str, Mapping[str, Any]]  # module -> {"key": artifact_key, "exports": [...]}
    launcher: str | None = None  # the compiler launcher the graph names (sccache: its statistics are shown)

    def owner(self, out: str) -> str | None:
        """The module of a ninja output: its artifact's, or (objects live in obj/<module>/) its dir's."""
        found = self.artifacts.get(out)
        if found is None and out.startswith("obj/") and out.count("/") > 1:
            found = out.split("/")[1]
        return found

    def changed(self, root: Path) -> set[str]:
        """The modules whose artifact is not the one last audited (relinked, or gone)."""
        return {mod for rel, mod in self.artifacts.items() if artifact_key(root / rel) != self.state[mod]["key"]}

    def after(self, report: CompileReport, root: Path) -> Run:
        """This run once ``report`` (every module built) is published: its artifacts and exports."""
        exports = {r.name: list(r.exports) for r in report.modules}
        state = {mod: {"key": artifact_key(root / rel), "exports": exports[mod]} for rel, mod in self.artifacts.items()}
        return Run(self.jobs, self.targets, self.env, self.artifacts, state, self.launcher)

    def to_json(self) -> dict[str, Any]:
        return {
            "jobs": self.jobs,
            "targets": list(self.targets),
            "env": dict(self.env),
            "artifacts": dict(self.artifacts),
            "state": {k: dict(v) for k, v in self.state.items()},
            "launcher": self.launcher,
        }

    @classmethod
    def of(cls, data: Mapping[str, Any]) -> Run:
        """From :meth:`to_json`'s form; KeyError, TypeError or ValueError for anything else."""
        state = {str(k): {"key": v["key"], "exports": list(v["exports"])} for k, v in data["state"].items()}
        artifacts = {str(k): str(v) for k, v in data["artifacts"].items()}
        if set(artifacts.values()) != set(state):
            raise ValueError("artifacts and state name different modules")
        launcher = data.get("launcher")
        return cls(
            int(data["jobs"]),
            tuple(data["targets"]),
            dict(data["env"]),
            artifacts,
            state,
            launcher if isinstance(launcher, str) else None,
        )


@dataclass(frozen=True)
class Recipe:
    plan: dict[str, Any]  # Plan.to_json()
    toolchain: dict[str, Any]  # Toolchain.to_dict()
    modules: list[dict[str, Any]]  # per module: _FIELDS, warnings, instances, log (before ninja), artifact

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "plan": self.plan, "toolchain": self.toolchain, "modules": self.modules}

    def results(self, run: Run) -> list[ModuleResult]:
        """Each module's result as it stood before ninja ran (status pending, exports as last audited)."""
        return [
            ModuleResult(
                **{k: m[k] for k in _FIELDS},
                warnings=tuple(m["warnings"]),
                instances=tuple(m["instances"]),
                log=tuple(m["log"]),
                artifact=Path(m["artifact"]),
                exports=tuple(run.state[m["name"]]["exports"]),
            )
            for m in self.modules
        ]

    def typed(self) -> tuple[Plan, Toolchain]:
        from qola.plan.model import Plan  # lazy: the no-op path reads records, not plans
        from qola.toolchain import Toolchain  # lazy: as Plan

        return Plan.from_json(self.plan), Toolchain.from_dict(self.toolchain)


def eligible(extras: Mapping[str, ModuleExtra]) -> bool:
    """Whether stages 1-8 read nothing but what the no-op digest covers (no JIT-deferred instances,
    no recorded copies: what a hook derives from generated files and compiles instead of them)."""
    return not any(e.jit is not None or e.trees or e.drop_sources for e in extras.values())


def of(
    report: CompileReport,
    jobs: int,
    logs: Mapping[str, Sequence[str]],
    root: Path,
    launcher: str | None = None,
) -> tuple[Recipe, Run]:
    """The recipe and run of a build whose every module built and was published (its plan and
    toolchain: ``report``'s); ``logs``: each module's log before ninja ran."""
    plan, tc = report.plan, report.toolchain
    mods, artifacts = [], {}
    for r in report.modules:
        assert r.artifact is not None
        artifacts[r.artifact.relative_to(root).as_posix()] = r.name
        mods.append(
            {
                **{k: getattr(r, k) for k in _FIELDS},
                "warnings": list(r.warnings),
                "instances": list(r.instances),
                "log": list(logs.get(r.name, [])),
                "artifact": str(r.artifact),
            }
        )
    recipe = Recipe(plan.to_json(), tc.to_dict(), mods)
    run = Run(jobs, tuple(f"module_{r.name}" for r in report.modules), dict(tc.child_env), artifacts, {}, launcher)
    return recipe, run.after(report, root)


def save(root: Path, recipe: Recipe | None) -> Path:
    """Write ``recipe`` into the build dir (None: remove the one there). Its path."""
    path = root / RECIPE
    if recipe is None:
        path.unlink(missing_ok=True)
        return path
    return atomic_write(path, json.dumps(recipe.to_json(), separators=(",", ":")).encode())


def load(root: Path) -> Recipe | None:
    """The recipe in the build dir, or None (absent, or not one this qola wrote)."""
    try:
        data = json.loads(inputs.read_record(root / RECIPE))
        if data.get("format") != FORMAT:
            return None
        return Recipe(dict(data["plan"]), dict(data["toolchain"]), list(data["modules"]))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
