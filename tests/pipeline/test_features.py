"""Issue 43 item 3: one protocol for a feature that spans stages (:mod:`qola.compile.feature`) and one
ordered list of them (:data:`qola.pipeline.features.FEATURES`) that every stage loops over: a toy
feature registered in the list is called at each of its stages, in order, on the full path and on
the incremental path, and what each of its parts adds reaches the build's outcome."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Collection
from pathlib import Path

import pytest
from support.fake_nvcc import fake_nvcc, make_tree
from support.fake_nvcc import pytestmark as needs_fake_nvcc

from qola.compile import feature as feat
from qola.compile.extras import ModuleExtra
from qola.compile.results import CompileReport
from qola.compile.steps import ModuleSources
from qola.pipeline import features
from qola.pipeline import run as pipeline
from qola.pipeline.run import BuildSpec, Reporter
from qola.plan.manifest import Manifest
from qola.plan.model import ModulePlan, Plan
from qola.plan.variants import GenEnv

MANIFEST = (
    '[qola]\nnamespace = "qk"\n[build]\narchitectures = ["sm_90"]\n'
    '[[modules]]\nname = "module_tiny"\nsrcs = ["csrc/tiny/tiny.cu"]\nis_python_module = false\n'
)
TINY = 'extern "C" __attribute__((visibility("default"))) int qk_tiny_answer() { return %d; }\n'


def toy(name: str, calls: list[str]) -> feat.Feature:
    """A feature whose every part says it ran (``calls``) and leaves a mark where its stage's
    outcome shows it: a plan warning, a module warning, an audit warning, a record in manifest.json."""

    def plan(p: Plan, manifest: Manifest, env: GenEnv) -> Plan:
        calls.append(f"{name}:plan")
        return dataclasses.replace(p, warnings=(*p.warnings, f"{name}: plan"))

    def extra(ctx: feat.ExtraContext) -> feat.ModuleHook:
        calls.append(f"{name}:extra")

        def one(mod: ModulePlan, sources: ModuleSources, so_far: ModuleExtra) -> ModuleExtra:
            calls.append(f"{name}:extra:{mod.name}:{len(so_far.warnings)}")
            return ModuleExtra(warnings=(f"{name}: extra",))

        return one

    def audit(report: CompileReport, only: Collection[str] | None) -> CompileReport:
        calls.append(f"{name}:audit")
        return report.with_modules({r.name: r.noted([f"{name}: audit"]) for r in report.modules})

    def publish(ctx: feat.PublishContext) -> feat.PublishItems:
        calls.append(f"{name}:publish")
        return feat.PublishItems(records={r.name: {name: "published"} for r in ctx.compiled.modules})

    return feat.Feature(name, plan=plan, extra=extra, audit=audit, publish=publish)


def write_tiny(tmp_path: Path) -> tuple[Path, Path]:
    """(the tree, the manifest) of one tiny module (the fake nvcc builds it)."""
    tree = make_tree(tmp_path / "tree")
    (tree / "csrc" / "tiny" / "tiny.cu").write_text(TINY % 42)
    (tmp_path / "q.toml").write_text(MANIFEST)
    return tree, tmp_path / "q.toml"


def test_each_stage_loops_the_features_in_their_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The loops take every feature in the list's order; a feature without a part is a no-op there;
    the extra of one feature sees what the ones before it added; publish items merge per module."""
    calls: list[str] = []
    one, two, bare = toy("one", calls), toy("two", calls), feat.Feature("bare")
    monkeypatch.setattr(features, "FEATURES", (*features.FEATURES, one, bare, two))
    tree, manifest = write_tiny(tmp_path)
    plan = pipeline.plan(BuildSpec.make(manifest=str(manifest), aiter_root=str(tree))).plan
    assert calls == ["one:plan", "two:plan"] and plan.warnings[-2:] == ("one: plan", "two: plan")

    def adds(tag: str) -> feat.ModuleHook:
        def one(mod: ModulePlan, sources: ModuleSources, so_far: ModuleExtra) -> ModuleExtra:
            return ModuleExtra(warnings=(f"{tag} after {len(so_far.warnings)}",))

        return one

    got = feat.extra_of([adds("a"), adds("b")], plan.modules[0], ModuleSources((), ()))
    assert got.warnings == ("a after 0", "b after 1")
    a = feat.PublishItems(records={"m": {"a": 1}}, headers=(Path("x.h"),))
    b = feat.PublishItems(records={"m": {"b": 2}}, headers=(Path("y.h"),))
    assert a.then(b).records == {"m": {"a": 1, "b": 2}} and a.then(b).headers == (Path("x.h"), Path("y.h"))
    assert [f.name for f in features.FEATURES[:4]] == ["jit", "isolation", "kernels", "usage"]


class Seen(Reporter):
    def __init__(self) -> None:
        self.warnings: list[str] = []

    def warning(self, text: str) -> None:
        self.warnings.append(text)


@needs_fake_nvcc
def test_a_registered_feature_is_called_at_each_stage(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(features, "FEATURES", (*features.FEATURES, toy("toy", calls)))
    tree, manifest = write_tiny(tmp_path)
    env = {**os.environ, "CUDACXX": str(fake_nvcc(tmp_path / "nvcc"))}
    out = tmp_path / "out"
    spec = BuildSpec.make(
        manifest=str(manifest), aiter_root=str(tree), output_dir=str(out), jobs=1, argv=("build",), env=env
    )
    ui = Seen()
    report = pipeline.build(spec, ui)
    assert report.ok, [r.detail for r in report.modules]
    assert calls == ["toy:plan", "toy:extra", "toy:extra:module_tiny:0", "toy:audit", "toy:publish"]
    assert "toy: plan" in ui.warnings
    (tiny,) = report.modules
    assert tiny.warnings[-2:] == ("toy: extra", "toy: audit")
    record = {m["name"]: m for m in json.loads((out / "manifest.json").read_text())["modules"]}["module_tiny"]
    assert record["toy"] == "published"
    # the incremental path (a source changed, nothing the plan reads): ninja, then the audit and publish loops
    calls.clear()
    (tree / "csrc" / "tiny" / "tiny.cu").write_text(TINY % 43)
    again = pipeline.build(spec, Seen())
    assert again.ok and again.compiled is not None and not again.up_to_date
    assert calls == ["toy:audit", "toy:publish"]
