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

import dataclasses
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


def artifact_key(path: str | os.PathLike[str]) -> tuple[int, ...] | None:
    """What tells a relinked artifact from the one recorded (None: absent)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev)


@dataclass(frozen=True)
class Audited:
    """A module's artifact as last audited: its :func:`artifact_key` and its exported symbols."""

    key: tuple[int, ...] | None
    exports: tuple[str, ...]

    def to_json(self) -> dict[str, list[int] | list[str] | None]:
        return {"key": None if self.key is None else list(self.key), "exports": list(self.exports)}

    @classmethod
    def of(cls, data: object) -> Audited:
        """From :meth:`to_json`'s form; TypeError or KeyError for anything else."""
        if not isinstance(data, dict):
            raise TypeError("not an audited artifact")
        key, exports = data["key"], data["exports"]
        if key is not None and not (isinstance(key, list) and all(isinstance(k, int) for k in key)):
            raise TypeError("key: not a list of integers")
        if not isinstance(exports, list) or not all(isinstance(e, str) for e in exports):
            raise TypeError("exports: not a list of strings")
        return cls(None if key is None else tuple(key), tuple(exports))


def _mapping(data: object, what: str) -> dict[str, str]:
    """A JSON object of strings, or TypeError."""
    if not isinstance(data, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in data.items()):
        raise TypeError(f"{what}: not an object of strings")
    return dict(data)


@dataclass(frozen=True)
class Run:
    """How the incremental path runs ninja and what it knows of each artifact (kept in the no-op
    record: a no-op reads nothing more)."""

    jobs: int
    targets: tuple[str, ...]
    env: Mapping[str, str]  # the toolchain's additions to the environment
    artifacts: Mapping[str, str]  # artifact (relative to the build dir) -> module
    state: Mapping[str, Audited]  # module -> its artifact as last audited
    launcher: str | None = None  # the compiler launcher the graph names (sccache: its statistics are shown)

    def owner(self, out: str) -> str | None:
        """The module of a ninja output: its artifact's, or (objects live in obj/<module>/) its dir's."""
        found = self.artifacts.get(out)
        if found is None and out.startswith("obj/") and out.count("/") > 1:
            found = out.split("/")[1]
        return found

    def changed(self, root: Path) -> set[str]:
        """The modules whose artifact is not the one last audited (relinked, or gone)."""
        return {mod for rel, mod in self.artifacts.items() if artifact_key(root / rel) != self.state[mod].key}

    def after(self, report: CompileReport, root: Path) -> Run:
        """This run once ``report`` (every module built) is published: its artifacts and exports."""
        exports = {r.name: tuple(r.exports) for r in report.modules}
        state = {mod: Audited(artifact_key(root / rel), exports[mod]) for rel, mod in self.artifacts.items()}
        return Run(self.jobs, self.targets, self.env, self.artifacts, state, self.launcher)

    def to_json(self) -> dict[str, object]:
        return {
            "jobs": self.jobs,
            "targets": list(self.targets),
            "env": dict(self.env),
            "artifacts": dict(self.artifacts),
            "state": {k: v.to_json() for k, v in self.state.items()},
            "launcher": self.launcher,
        }

    @classmethod
    def of(cls, data: object) -> Run:
        """From :meth:`to_json`'s form (JSON read back); KeyError, TypeError or ValueError for anything else."""
        if not isinstance(data, dict) or not isinstance(data["state"], dict):
            raise TypeError("not a run")
        state = {str(k): Audited.of(v) for k, v in data["state"].items()}
        artifacts = _mapping(data["artifacts"], "artifacts")
        if set(artifacts.values()) != set(state):
            raise ValueError("artifacts and state name different modules")
        jobs, targets, launcher = data["jobs"], data["targets"], data.get("launcher")
        if not isinstance(jobs, int) or not isinstance(targets, list) or not all(isinstance(t, str) for t in targets):
            raise TypeError("jobs or targets: not a run's")
        return cls(
            jobs,
            tuple(targets),
            _mapping(data["env"], "env"),
            artifacts,
            state,
            launcher if isinstance(launcher, str) else None,
        )


@dataclass(frozen=True)
class Recipe:
    """What the publish needs of the last full build: its plan and toolchain as JSON (``Plan.to_json``,
    ``Toolchain.to_dict``: their own readers validate them, :meth:`typed`) and each module's result as
    it stood before ninja ran (status pending, no exports: :meth:`results` adds the last audited)."""

    plan: dict[str, Any]  # Plan.to_json(): JSON read back, validated by Plan.from_json
    toolchain: dict[str, Any]  # Toolchain.to_dict(): JSON read back, validated by Toolchain.from_dict
    modules: tuple[ModuleResult, ...]

    def to_json(self) -> dict[str, object]:
        return {
            "format": FORMAT,
            "plan": self.plan,
            "toolchain": self.toolchain,
            "modules": [_module(m) for m in self.modules],
        }

    @classmethod
    def of(cls, data: object) -> Recipe:
        """From :meth:`to_json`'s form; TypeError, KeyError or ValueError for anything else."""
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ValueError("not a recipe of this format")
        plan, tc, modules = data["plan"], data["toolchain"], data["modules"]
        if not isinstance(plan, dict) or not isinstance(tc, dict) or not isinstance(modules, list):
            raise TypeError("not a recipe")
        return cls(plan, tc, tuple(_result(m) for m in modules))

    def results(self, run: Run) -> list[ModuleResult]:
        """Each module's result as it stood before ninja ran (status pending, exports as last audited)."""
        return [dataclasses.replace(m, exports=run.state[m.name].exports) for m in self.modules]

    def typed(self) -> tuple[Plan, Toolchain]:
        from qola.plan.model import Plan  # lazy: the no-op path reads records, not plans
        from qola.toolchain import Toolchain  # lazy: as Plan

        return Plan.from_json(self.plan), Toolchain.from_dict(self.toolchain)


def _module(r: ModuleResult) -> dict[str, object]:
    """A module of the recipe as JSON: its result before ninja ran."""
    return {
        **{k: getattr(r, k) for k in _FIELDS},
        "warnings": list(r.warnings),
        "instances": list(r.instances),
        "log": list(r.log),
        "artifact": str(r.artifact),
    }


def _result(data: object) -> ModuleResult:
    """A module of the recipe read back (:func:`_module`'s form), or TypeError / KeyError."""
    if not isinstance(data, dict):
        raise TypeError("not a module")
    text = {k: data[k] for k in ("name", "md_name", "mode", "link", "artifact")}
    counts = {k: data[k] for k in ("sources", "generated")}
    lists = {k: data[k] for k in ("warnings", "instances", "log")}
    if not all(isinstance(v, str) for v in text.values()) or not all(isinstance(v, int) for v in counts.values()):
        raise TypeError("a module's name, mode, link, artifact or counts")
    if not all(isinstance(v, list) and all(isinstance(x, str) for x in v) for v in lists.values()):
        raise TypeError("a module's warnings, instances or log")
    return ModuleResult(
        text["name"],
        text["md_name"],
        text["mode"],
        text["link"],
        sources=counts["sources"],
        generated=counts["generated"],
        warnings=tuple(lists["warnings"]),
        instances=tuple(lists["instances"]),
        log=tuple(lists["log"]),
        artifact=Path(text["artifact"]),
    )


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
    mods: list[ModuleResult] = []
    artifacts: dict[str, str] = {}
    for r in report.modules:
        assert r.artifact is not None
        artifacts[r.artifact.relative_to(root).as_posix()] = r.name
        before = ModuleResult(r.name, r.md_name, r.mode, r.link, sources=r.sources, generated=r.generated)
        log = tuple(logs.get(r.name, []))  # the log as it stood before ninja ran
        mods.append(
            dataclasses.replace(before, warnings=r.warnings, instances=r.instances, log=log, artifact=r.artifact)
        )
    recipe = Recipe(plan.to_json(), tc.to_dict(), tuple(mods))
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
        return Recipe.of(json.loads(inputs.read_record(root / RECIPE)))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
