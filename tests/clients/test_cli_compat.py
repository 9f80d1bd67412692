"""Every call Transformer Engine, ck-jit and QoLA's docs make (issue 21, the CLI side): a plain checkout
imports (PYTHONPATH and cwd), a missing dependency is one line, ';'-separated lists, module groups,
pins of a tree the user chose, a kernel tree inside the output dir, the HIP compiler found the way
AITER finds it, and the ck-jit call form."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any, cast

import pytest
from support.cli import MODULE, copy_checkout, no_pythonpath, qola_cli
from support.common import KERNELS, REPO, run_qola
from support.fake_hipcc import fake_hipcc
from support.fake_nvcc import make_tree

from qola import cli
from qola.core.rules import split_list

EX = REPO / "examples"


def plan_json(*args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    proc = run_qola("plan", *args, "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    return cast("dict[Any, Any]", json.loads(proc.stdout))


# ---- importable from a plain checkout, one line for a missing dependency ------------------------------


@pytest.mark.cli
def test_plain_checkout_runs_from_pythonpath_and_from_cwd(tmp_path: Path) -> None:
    checkout = copy_checkout(tmp_path / "QoLA")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for cwd, env in (
        (elsewhere, no_pythonpath(PYTHONPATH=str(checkout))),  # TE's CMake
        (checkout, no_pythonpath()),
    ):  # ck-jit: cwd=<checkout>, no PYTHONPATH
        proc = run_qola("--version", entry="qola.cli", cwd=cwd, env=env, whole_env=True)
        assert proc.returncode == 0 and proc.stdout.strip() == "qola 0.1.0+copy", proc.stderr
    proc = run_qola(
        "plan",
        "-m",
        str(EX / "quickstart.toml"),
        "-a",
        str(KERNELS),
        "--json",
        entry="qola.cli",
        cwd=checkout,
        env=no_pythonpath(),
        whole_env=True,
    )
    assert proc.returncode == 0 and json.loads(proc.stdout)["namespace"] == "qk", proc.stderr


@pytest.mark.cli
def test_missing_dependency_is_one_line(tmp_path: Path) -> None:
    shadow = tmp_path / "shadow" / "pydantic"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'pydantic'\", name='pydantic')\n")
    env = no_pythonpath(PYTHONPATH=f"{tmp_path / 'shadow'}{os.pathsep}{REPO}")
    proc = run_qola(
        "plan",
        "-m",
        str(EX / "quickstart.toml"),
        "-a",
        str(KERNELS),
        entry="qola.cli",
        env=env,
        whole_env=True,
        cwd=tmp_path,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "'pydantic'" in lines[0] and "-m pip install 'pydantic>=2.5'" in lines[0]


@pytest.mark.cli
def test_dependency_table_matches_pyproject() -> None:
    from qola.core import tomlfile

    deps = tomlfile.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    names = {d.split(">")[0].split("=")[0].split(";")[0].strip().lower() for d in deps}
    table = {req.split(">")[0].lower() for req in cli.DEPENDENCIES.values()}
    assert names <= table | {"tomli"}, names - table


# ---- ';'-separated lists, groups -----------------------------------------------------------------------


@pytest.mark.cli
def test_split_list() -> None:
    assert split_list(["gfx942;gfx950", "gfx90a", " ;", ""]) == ["gfx942", "gfx950", "gfx90a"]
    assert split_list("a; b;;") == ["a", "b"] and split_list(None) == []


def test_semicolon_lists_for_arch_and_gpu_archs(tmp_path: Path) -> None:
    m = tmp_path / "q.toml"
    m.write_text('[qola]\nnamespace = "qk"\n[[modules]]\nname = "module_rmsnorm"\n')
    base = ("-m", str(m), "-a", str(KERNELS))
    assert plan_json(*base, "--arch", "sm_90;sm_80")["archs"] == ["sm_90", "sm_80"]
    assert plan_json(*base, "--arch", "sm_90", "--arch", "sm_80;")["archs"] == ["sm_90", "sm_80"]
    assert plan_json(*base, env={"GPU_ARCHS": "sm_90;sm_80"})["archs"] == ["sm_90", "sm_80"]
    assert plan_json(*base, "--arch", "", env={"GPU_ARCHS": "sm_80"})["archs"] == ["sm_80"]  # CMake's empty list
    proc = run_qola("plan", *base, "--arch", "sm_90;gfx942")
    assert proc.returncode == 2 and "mix HIP and CUDA" in proc.stderr


def test_groups_select_modules(tmp_path: Path) -> None:
    m = tmp_path / "q.toml"
    m.write_text(
        '[qola]\nnamespace = "qk"\n[build]\narchitectures = ["sm_90"]\n'
        '[[modules]]\nname = "module_rmsnorm"\ngroup = "norm"\n'
        '[[modules]]\nname = "module_softmax"\ngroup = "soft"\n'
        '[[modules]]\nname = "module_attn_fwd"\n'
    )
    base = ("-m", str(m), "-a", str(KERNELS))

    def names(*args: str, env: dict[str, str] | None = None) -> list[str]:
        return [mod["name"] for mod in plan_json(*base, *args, env=env)["modules"]]

    assert names() == ["module_rmsnorm", "module_softmax", "module_attn_fwd"]  # no selection: every module
    assert names("--group", "norm") == ["module_rmsnorm"]  # ungrouped modules left out while selecting
    assert (
        names("--group", "norm;soft")
        == names("--group", "soft", "--group", "norm")
        == ["module_rmsnorm", "module_softmax"]
    )
    assert names(env={"QOLA_BUILD_GROUPS": "soft"}) == ["module_softmax"]
    assert names("--group", "norm", env={"QOLA_BUILD_GROUPS": "soft"}) == ["module_rmsnorm"]  # the flag wins
    proc = run_qola("plan", *base, "--group", "norm;attn")
    assert proc.returncode == 2 and "unknown module group(s) 'attn'" in proc.stderr, proc.stderr
    assert "the manifest declares the groups: 'norm', 'soft'" in proc.stderr
    proc = run_qola("plan", *base, env={"QOLA_BUILD_GROUPS": "nope"})
    assert proc.returncode == 2 and "QOLA_BUILD_GROUPS: unknown module group(s) 'nope'" in proc.stderr
    bad = tmp_path / "bad.toml"
    bad.write_text(m.read_text().replace('group = "soft"', 'group = "../x"'))
    proc = run_qola("plan", "-m", str(bad), "-a", str(KERNELS))
    assert proc.returncode == 2 and "modules[1].group" in proc.stderr


# ---- the HIP compiler: ROCM_HOME / ROCM_PATH before PATH; rocm_versions recorded, not enforced ------------


def test_hipcc_is_found_the_way_aiter_finds_it(tmp_path: Path) -> None:
    from qola.toolchain import hip

    on_path = fake_hipcc(tmp_path / "path" / "hipcc")
    rocm_path = fake_hipcc(tmp_path / "rocm" / "bin" / "hipcc")
    rocm_home = fake_hipcc(tmp_path / "home" / "bin" / "hipcc")
    base = {"PATH": f"{on_path.parent}{os.pathsep}/usr/bin:/bin"}
    assert hip.locate_why(base) == (str(on_path), "hipcc on PATH")
    env = {**base, "ROCM_PATH": str(tmp_path / "rocm"), "ROCM_HOME": ""}  # ck-jit's environment
    assert hip.locate_why(env) == (str(rocm_path), "$ROCM_PATH/bin/hipcc (ROCM_PATH)")
    assert hip.locate(dict(env, ROCM_HOME=str(tmp_path / "home"))) == str(rocm_home)
    assert hip.locate(dict(env, HIPCC=str(on_path))) == str(on_path)
    path, why = hip.locate_why(dict(base, ROCM_PATH=str(tmp_path / "empty")))
    assert path == str(on_path) and "empty/bin/hipcc is not an executable" in why
    proc = run_qola("doctor", env={**env, "PATH": f"{on_path.parent}{os.pathsep}{os.environ['PATH']}"})
    assert f"{rocm_path} (HIP 6.4.43484; found by $ROCM_PATH/bin/hipcc (ROCM_PATH))" in proc.stdout, proc.stdout


def test_rocm_versions_is_recorded_not_enforced(tmp_path: Path) -> None:
    from qola.toolchain.hip import find_hip

    hipcc = fake_hipcc(tmp_path / "hipcc", "6.4.43484")
    tc = find_hip(
        ["gfx942"], env={**os.environ, "HIPCC": str(hipcc)}, accepted_versions=["7.2"], cache_dir=tmp_path / "probes"
    )
    check = tc.version_check
    assert check is not None
    assert check.status == "mismatch" and check.accepted == ("7.2",) and check.found["hip"] == "6.4.43484"
    assert check.message is not None
    assert "accepts only ['7.2']" in check.message and "recorded in manifest.json" in check.message
    ok = find_hip(
        ["gfx942"], env={**os.environ, "HIPCC": str(hipcc)}, accepted_versions=["6.4"], cache_dir=tmp_path / "probes"
    )
    assert ok.version_check is not None
    assert ok.version_check.status == "match" and ok.version_check.message is None
    assert "message" not in ok.version_check.to_json()  # the recorded form: no message on a match


@pytest.mark.hip
def test_ck_jit_call_form(tmp_path: Path) -> None:
    """ck-jit: ``sys.executable -m qola.cli build … --skip-checkout`` with cwd=<checkout>, no PYTHONPATH,
    ROCM_PATH=<fake ROCm> whose bin/hipcc intercepts every compile and link, ROCM_HOME=""."""
    real = shutil.which("hipcc") or "/usr/bin/hipcc"
    checkout = copy_checkout(tmp_path / "QoLA")
    fake = tmp_path / "fake-rocm" / "bin" / "hipcc"
    fake.parent.mkdir(parents=True)
    log = tmp_path / "intercepted.log"
    fake.write_text(f'#!/bin/sh\necho "$*" >> {log}\nexec env -u ROCM_PATH -u ROCM_HOME {real} "$@"\n')
    fake.chmod(0o755)
    tree = make_tree(tmp_path / "aiter")
    m = tmp_path / "te.toml"
    m.write_text(f'[qola]\nnamespace = "te"\nrocm_versions = ["7.2"]\n{MODULE}')
    out = tmp_path / "qola-out"
    proc = qola_cli(
        "build",
        "--manifest",
        str(m),
        "--aiter-root",
        str(tree),
        "--output-dir",
        str(out),
        "--arch",
        "gfx90a",
        "--skip-checkout",
        cwd=checkout,
        pythonpath=None,
        env={
            "ROCM_PATH": str(fake.parent.parent),
            "ROCM_HOME": "",
            "GPU_ARCHS": "gfx90a",
            "HIPCC": "",
            "PATH": f"{Path(real).parent}{os.pathsep}{os.environ['PATH']}",
        },
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads((out / "manifest.json").read_text())
    assert data["qola_version"] == "0.1.0+copy" and data["toolchain"]["compiler"] == str(fake)
    assert data["version_check"]["status"] in ("match", "mismatch")  # recorded either way, never a refusal
    calls = log.read_text().splitlines()
    assert any("--version" in c for c in calls) and any("tiny.cu" in c and " -c " in f" {c} " for c in calls)


@pytest.mark.cli
@pytest.mark.parametrize("where", ["-o", "-m", "-a"])
def test_an_argument_that_is_not_utf8_is_one_line_not_a_traceback(tmp_path: Path, where: str) -> None:
    """Python carries undecodable bytes as surrogate escapes, which crashed qola where a path is
    encoded (a build dir's hash, a log): refused at the command line, naming the argument (issue 23)."""
    bad = str(tmp_path / "o\udcffut")
    args = {"-o": bad, "-m": str(KERNELS.parent / "quickstart.toml"), "-a": str(KERNELS)}
    args[where] = bad
    proc = run_qola("build", "-m", args["-m"], "-a", args["-a"], "-o", args["-o"], "--dry-run")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "is not valid UTF-8 (byte 0xff)" in proc.stderr and "o\\xffut" in proc.stderr
    assert not (tmp_path / "o\udcffut").exists() and not any(tmp_path.iterdir())


HIDE = """import importlib.abc, sys
HIDDEN = {hidden!r}
class Hide(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in HIDDEN:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None
sys.meta_path.insert(0, Hide())
"""


@pytest.mark.cli
def test_every_missing_dependency_in_one_message_before_any_work(tmp_path: Path) -> None:
    """Issue 32 item 2: a venv without several of qola's dependencies hears of all of them at once, with
    one pip command, before anything runs (the output dir is never created)."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(HIDE.format(hidden=["pydantic", "ninja", "elftools", "pybind11"]))
    env = no_pythonpath(PYTHONPATH=f"{hook}{os.pathsep}{REPO}")
    out = tmp_path / "out"
    args = ["build", "-m", str(EX / "quickstart.toml"), "-a", str(KERNELS), "-o", str(out)]
    proc = run_qola(*args, entry="qola.cli", env=env, whole_env=True, cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    for name in ("pydantic", "ninja", "pyelftools", "pybind11"):
        assert name in proc.stderr, proc.stderr
    assert "rich" not in proc.stderr  # only what is missing
    pips = [ln for ln in proc.stderr.splitlines() if "-m pip install" in ln]
    assert len(pips) == 1 and all(r in pips[0] for r in ("'pydantic>=2.5'", "'ninja>=1.11'", "'pyelftools>=0.30'"))
    assert not out.exists() and not (tmp_path / "out.build").exists()


def test_reader_gone_exits_quietly(tmp_path: Path) -> None:
    """Issue 32 item 7: `qola plan | head` (here: a pipe whose reader is already gone) ends quietly."""
    r, w = os.pipe()
    os.close(r)  # every write to w now fails with EPIPE: no timing involved
    try:
        proc = run_qola(
            "plan",
            "-m",
            str(EX / "quickstart.toml"),
            "-a",
            str(KERNELS),
            entry="qola.cli",
            stdout=w,
            env=no_pythonpath(PYTHONPATH=str(REPO)),
            whole_env=True,
            cwd=tmp_path,
        )
    finally:
        os.close(w)
    assert proc.returncode == 141, proc.stderr
    assert "Broken pipe" not in proc.stderr and "errno 32" not in proc.stderr and "Traceback" not in proc.stderr


def test_doctor_checks_python_headers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 32 item 4: pybind modules need Python.h; doctor says whether this interpreter has it."""
    import sysconfig

    from qola.commands import doctor

    found = {c.name: c for c in doctor.checks(dict(os.environ))}
    assert found["Python headers"].ok == (Path(sysconfig.get_paths()["include"]) / "Python.h").is_file()
    real = sysconfig.get_paths
    monkeypatch.setattr(sysconfig, "get_paths", lambda *a, **k: {**real(*a, **k), "include": str(tmp_path)})
    c = {c.name: c for c in doctor.checks(dict(os.environ))}["Python headers"]
    assert not c.ok and not c.required and "Python.h is missing" in c.detail and "-dev" in c.detail
