"""Issue 12: one build pipeline in the library (qola.pipeline.run.build), a Plan that is the whole plan
(generator filters, the filter wrapper, the JIT split), one layout for every build-dir path, typed
hook extras that compute and never write."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path
from typing import Any, cast

import pytest
from support.common import KERNELS, run_qola
from support.example_variants import EXAMPLE_VARIANTS, expected_example
from support.jit_manifests import AOT_TWO, TWO

from qola.compile import extras
from qola.compile.layout import BuildLayout, object_path
from qola.compile.pathmap import PathMap
from qola.compile.steps import Stage
from qola.core.errors import QolaError
from qola.hooks import isolation
from qola.hooks import jit as jitbuild
from qola.pipeline import run as pipeline
from qola.pipeline.begin import ask
from qola.pipeline.machine import settings
from qola.pipeline.run import BuildSpec, Reporter
from qola.pipeline.spec import Settings
from qola.plan import variants
from qola.plan.model import Generator, ModulePlan, Plan

HAS_NVCC = shutil.which("nvcc") is not None


def whole_manifest(path: Path) -> Path:
    """Variants for the pybind attention module, [jit] with two instances ahead for the library."""
    path.write_text(
        '[qola]\nnamespace = "qj"\n[build]\narchitectures = ["sm_90"]\nmode = "pybind"\n'
        '[[modules]]\nname = "module_attn_fwd"\n'
        '[[modules]]\nname = "libattn_fwd"\nmode = "cpp_itfs"\n'
        + EXAMPLE_VARIANTS
        + AOT_TWO.replace("[jit]\n", '[jit]\nmodules = ["libattn_fwd"]\n', 1)
    )
    return path


# --------------------------------------------------------------------------- the plan


def test_plan_json_shows_filters_and_the_jit_split(tmp_path: Path) -> None:
    m = whole_manifest(tmp_path / "q.toml")
    proc = run_qola("plan", "--manifest", str(m), "--aiter-root", str(KERNELS), "--json", check=True)
    data = json.loads(proc.stdout)
    mods = {x["name"]: x for x in data["modules"]}
    assert data["mode"] == "pybind"
    (gen,) = mods["module_attn_fwd"]["generators"]
    assert gen["filter"] == "attn_fwd_d128_fp16_*_mask_*,attn_fwd_d*_bf16_*_*_nlse" and gen["wrapper"] is None
    assert gen["run_argv"][-2:] == ["--filter", gen["filter"]] and "--filter" not in gen["argv"]
    assert mods["module_attn_fwd"]["jit"] is None
    (lib_gen,) = mods["libattn_fwd"]["generators"]
    assert lib_gen["filter"] is None  # no top-level variant: every instance is generated ...
    assert mods["libattn_fwd"]["jit"] == {
        "ahead": sorted(TWO),
        "declared": True,
        "style": "example_attn",
        "compiler": None,
    }  # ... two built ahead, the rest deferred
    # the JSON is the Plan: it reads back into the same frozen data
    plan = pipeline.plan(BuildSpec.make(manifest=str(m), aiter_root=str(KERNELS))).plan
    assert Plan.from_json(json.loads(proc.stdout)) == plan == Plan.from_json(json.loads(json.dumps(plan.to_json())))
    # the text form names them too
    text = run_qola("plan", "--manifest", str(m), "--aiter-root", str(KERNELS), check=True).stdout
    assert f"filter    {gen['filter']}" in text and "2 instance(s) ahead" in text


def test_ck_filters_run_under_the_any_of_wrapper(tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    (ck / "codegen" / "ops").mkdir(parents=True)
    (ck / "generate.py").write_text("")
    gen = Generator(f"{ck}/generate.py -d fwd --output_dir {{}}", "fwd")
    plan = Plan("qk", "hip", ("gfx942",), "/t", "/t", None, "q.toml", "0" * 64, modules=(_module("m", (gen, gen)),))
    out = variants.with_filters(plan, {("m", 0): "*_lse_*|*_nlse_*", ("m", 1): "*_lse_*"})
    one, two = out.modules[0].generators
    assert one.wrapper == str(variants.shim()) and one.run_argv[0] == str(variants.shim())
    assert one.run_argv[1:] == [*gen.argv, "--filter", "*_lse_*|*_nlse_*"] and one.script == gen.script
    assert two.wrapper is None and two.run_argv == [*gen.argv, "--filter", "*_lse_*"]


def _module(name: str, gens: tuple[Any, ...] = (), **kw: Any) -> ModulePlan:
    from qola.plan.model import ModulePlan

    base = {
        "name": name,
        "md_name": f"qk_{name}",
        "mode": "cpp_itfs",
        "link": "shared",
        "sources": (),
        "flags_extra_cc": (),
        "flags_extra_hip": (),
        "include_dirs": (),
        "generators": tuple(gens),
        "torch_exclude": True,
        "is_python_module": False,
        "is_standalone": True,
        "hip_clang_path": None,
    }
    return ModulePlan(**{**base, **kw})


def test_mode_default_is_decided_once(tmp_path: Path) -> None:
    m = tmp_path / "q.toml"
    m.write_text(
        '[build]\narchitectures = ["sm_90"]\nmode = "cpp_itfs"\n[[modules]]\nname = "libattn_fwd"\n'
        '[[modules]]\nname = "module_softmax"\nmode = "pybind"\n'
    )
    spec = BuildSpec.make(manifest=str(m), aiter_root=str(KERNELS))
    plan = pipeline.plan(spec).plan
    assert plan.mode == "cpp_itfs" and [x.mode for x in plan.modules] == ["cpp_itfs", "pybind"]
    plan = pipeline.plan(spec.changed(mode="pybind")).plan  # --mode beats the manifest
    assert plan.mode == "pybind" and [x.mode for x in plan.modules] == ["pybind", "pybind"]
    m.write_text(m.read_text().replace('mode = "cpp_itfs"\n[[', "[[", 1))
    assert pipeline.plan(spec).plan.mode == "pybind"  # the default


def test_settings_precedence(tmp_path: Path) -> None:
    q = tmp_path / "q.toml"
    q.write_text('[build]\narchitectures = ["sm_90"]\njobs = 3\nlauncher = "true"\n')
    lay = BuildLayout(tmp_path / "b", tmp_path / "o")
    spec = BuildSpec.make(manifest=str(q), output_dir=str(tmp_path / "o"))
    env = {"PATH": os.environ["PATH"], "MAX_JOBS": "5"}

    def resolved(spec: BuildSpec, env: dict[str, str] = env) -> Settings:
        return settings(spec, ask(spec, env), lay, env)

    s = resolved(spec)
    assert s.jobs == 3 and s.launcher == shutil.which("true") and s.isolate and not s.dry_run
    assert resolved(spec.changed(jobs=7)).jobs == 7  # -j beats the manifest
    q.write_text('[build]\narchitectures = ["sm_90"]\n')
    assert resolved(spec).jobs == 5  # MAX_JOBS beats the default
    assert resolved(spec, {"PATH": env["PATH"]}).jobs >= 1  # AITER's cpu/memory rule
    with pytest.raises(QolaError, match="launcher 'no-such-launcher' not found"):
        resolved(spec.changed(launcher="no-such-launcher"))
    with pytest.raises(QolaError, match="MAX_JOBS"):  # a bad value is an error even where -j hides it
        resolved(spec.changed(jobs=2), {**env, "MAX_JOBS": "-1"})


def test_plan_json_prints_the_settings_as_resolved(tmp_path: Path) -> None:
    """``qola plan --json`` shows the build's settings by the same chains the build resolves them
    (manifest > environment > default here: plan takes no -j), nothing on the machine asked: a
    launcher that is not installed is shown as named, not refused."""
    m = tmp_path / "q.toml"
    m.write_text('[qola]\nnamespace = "qj"\n[build]\narchitectures = ["sm_90"]\nlauncher = "no-such-launcher"\n')
    args = ("plan", "--manifest", str(m), "--aiter-root", str(KERNELS), "--json")
    got = json.loads(run_qola(*args, env={"MAX_JOBS": "3"}, check=True).stdout)["settings"]
    assert got == {
        "jobs": 3,
        "launcher": "no-such-launcher",
        "dry_run": False,
        "verbose": False,
        "isolate": True,
        "farm": None,
        "notes": [],
        "output_dir": None,
        "build_dir": None,
        "remote": None,
        "record_ahead": False,
    }
    sources = json.loads(run_qola(*args, env={"MAX_JOBS": "3"}, check=True).stdout)["sources"]
    assert sources["jobs"] == {"value": 3, "from": "MAX_JOBS"}  # each value with where it came from
    assert sources["launcher"] == {"value": "no-such-launcher", "from": "[build].launcher"}
    assert sources["aiter_root"]["from"] == "--aiter-root" and sources["mode"] == {"value": "pybind", "from": "default"}
    ahead = json.loads(run_qola(*args, "--record-ahead", env={"MAX_JOBS": "3"}, check=True).stdout)
    assert ahead["settings"]["record_ahead"] is True  # the flag, as [usage] record_ahead (docs/usage.md)
    m.write_text(m.read_text() + "jobs = 5\n")
    assert json.loads(run_qola(*args, env={"MAX_JOBS": "3"}, check=True).stdout)["settings"]["jobs"] == 5
    bad = run_qola(*args, env={"MAX_JOBS": "-1"})  # checked as a build checks it
    assert bad.returncode == 2 and "MAX_JOBS" in bad.stderr
    assert run_qola(*args[:-1], env={"MAX_JOBS": "-1"}).returncode == 0  # the text plan shows no settings


# --------------------------------------------------------------------------- layout and hooks


def test_layout_spells_every_build_path(tmp_path: Path) -> None:
    lay = BuildLayout(tmp_path / "b", tmp_path / "o")
    b = tmp_path / "b"
    assert lay.graph == b / "build.ninja" and lay.blob("m") == b / "gen" / "m" / "blob"
    assert lay.include == b / "include" and lay.embed_dir("m") == b / "embed" / "m"
    assert lay.embed_object("m") == "obj/m/qola_embedded_m.o" and object_path(
        "m", "/x/a.cu", PathMap.of("/x", b)
    ).startswith("obj/m/a-")
    # the same unit, the same object name, wherever the tree and the build dir lie
    here, there = PathMap.of("/x", b), PathMap.of("/elsewhere/x", tmp_path / "b2")
    assert object_path("m", "/x/a.cu", here) == object_path("m", "/elsewhere/x/a.cu", there)
    assert object_path("m", "/x/a.cu", here) != object_path("m", "/x/sub/a.cu", here)
    assert lay.probes == b / "probes" and lay.tools_bin == b / "tools" / "bin"
    assert lay.jit_tree("qk_m") == b / "jit-out" / "qk_m" and lay.jit_stubs("qk_m") == b / "jit" / "qk_m"
    assert lay.artifact("qk_m.so") == b / "lib" / "qk_m.so" and lay.artifact_rel("qk_m.so") == "lib/qk_m.so"
    assert lay.log("m") == tmp_path / "o" / "logs" / "m.log"
    with pytest.raises(QolaError, match="refusing"):  # names from input never leave the build dir
        lay.blob("../x")


def test_hooks_compute_and_write_nothing(tmp_path: Path) -> None:
    hsa = tmp_path / "meta" / "hsa" / "sm_90" / "vec"
    hsa.mkdir(parents=True)
    (hsa / "k.co").write_bytes(b"\x7fELF")
    plan = Plan("qk", "cuda", ("sm_90",), str(tmp_path), str(tmp_path / "meta"), None, "q.toml", "0" * 64, modules=())
    lay = BuildLayout(tmp_path / "b", tmp_path / "o")
    mod = _module("m", embed=("vec",), link="static")
    inner = extras.ModuleExtra(
        extra_inputs=("obj/m/jit.o",), localize_hidden=True, drop_sources=("/s/b.cu",), add_sources=("/s/stub.cu",)
    )
    more = isolation.extra(mod, ("/s/a.cu", "/s/b.cu"), inner, plan, lay)
    assert not (tmp_path / "b").exists(), "a hook wrote into the build dir"
    assert more.rule == "archive" and [e.rule for e in more.edges] == ["asm"]
    cmd = dict(more.variables)["archive_cmd"]
    assert "--localize-hidden" in cmd and str(lay.archive_work("m")) in cmd
    rsp = next(w for w in more.writes if w.path.suffix == ".rsp")
    objs = rsp.text.split()
    paths = PathMap.of(plan.tree_root, lay.root)
    assert objs == [str(lay.root / object_path("m", s, paths)) for s in ("/s/a.cu", "/s/stub.cu")] + [
        str(lay.root / lay.embed_object("m")),
        str(lay.root / "obj/m/jit.o"),
    ]
    assert {w.path.suffix for w in more.writes} == {".S", ".h", ".json", ".rsp"}
    extras.write([more], isolation.shared_files(plan, lay))  # the one stage that writes
    assert all(w.path.read_text() == w.text for w in more.writes)
    assert (lay.include / "qola_config.h").is_file() and lay.version_script("qk").is_file()
    # the JIT's extra of a module without [jit] is empty
    assert jitbuild.extra(mod, (), Stage(plan, cast(Any, None), lay), lambda: cast(Any, None)) == extras.ModuleExtra()


# --------------------------------------------------------------------------- build() itself


class Recorder(Reporter):
    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    def warning(self, text: str) -> None:
        self.seen.append(("warning", text))

    def info(self, text: str) -> None:
        self.seen.append(("info", text))

    def status(self, done: int, total: int, text: str) -> None:
        self.seen.append(("status", text))


@pytest.mark.slow
@pytest.mark.skipif(not HAS_NVCC, reason="needs nvcc")
def test_build_runs_the_stages_and_reports(tmp_path: Path) -> None:
    m = whole_manifest(tmp_path / "q.toml")
    spec = BuildSpec.make(
        manifest=str(m), aiter_root=str(KERNELS), output_dir=str(tmp_path / "out"), jobs=2, argv=("build", "test")
    )
    # a dry run plans and writes the graph; OUT stays untouched
    ui = Recorder()
    dry = pipeline.build(dataclasses.replace(spec, dry_run=True), ui)
    assert dry.dry_run and dry.ok and dry.manifest_json is None and not (tmp_path / "out").exists()
    assert {r.status for r in dry.modules} == {"planned"} and dry.layout.graph.is_file()
    assert any(k == "info" and "2 module(s)" in t for k, t in ui.seen)
    # the build
    ui = Recorder()
    report = pipeline.build(spec, ui)
    assert report.ok and report.exit_code == 0 and not report.up_to_date, [r.detail for r in report.modules]
    assert report.manifest_json == tmp_path / "out" / "manifest.json"
    assert any(k == "status" for k, _ in ui.seen)
    data = json.loads(report.manifest_json.read_text())
    mods = {x["name"]: x for x in data["modules"]}
    assert data["mode"] == "pybind" and mods["module_attn_fwd"]["status"] == mods["libattn_fwd"]["status"] == "built"
    assert set(mods["module_attn_fwd"]["instances"]["names"]) == expected_example() | {"attn_fwd_api"}
    assert set(mods["libattn_fwd"]["jit"]["aot"]["names"]) == TWO
    assert (tmp_path / "out" / "jit" / "qj_libattn_fwd" / "index.json").is_file()
    # the same spec again: the no-op fast path answers
    again = pipeline.build(spec)
    assert again.up_to_date and again.ok and again.compiled is None


def test_build_user_errors_raise(tmp_path: Path) -> None:
    m = whole_manifest(tmp_path / "q.toml")
    spec = BuildSpec.make(manifest=str(m), aiter_root=str(KERNELS), output_dir=str(tmp_path / "out"))
    with pytest.raises(QolaError, match="inside"):
        pipeline.build(dataclasses.replace(spec, build_dir=str(tmp_path / "out" / "b")))
    with pytest.raises(QolaError, match="no output dir"):
        pipeline.build(dataclasses.replace(spec, output_dir=None))
    with pytest.raises(QolaError, match="launcher"):
        pipeline.build(spec.changed(launcher="no-such-launcher", dry_run=True))
    assert not (tmp_path / "out").exists()
