"""Nothing read from an output is executed (issue 41 item 5): ``qola audit OUT --reproduce`` applies
of OUT/manifest.json's recorded environment only the variables qola itself declares as build inputs,
each checked as a build checks it, and never a loader, injection or search-path variable; every other
recorded value that differs from the auditor's is named in a note, not applied.

Each case writes one variable into a real OUT's manifest.json and runs the audit with a fake nvcc
(g++ underneath) that appends its whole environment to a file: the variable must not be there.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from support.common import run_qola
from support.fake_nvcc import FAKE_NVCC, make_tree
from support.fake_nvcc import pytestmark as needs_fake_nvcc
from support.repro import recorded_build

from qola.core.secret import recorded_value
from qola.pipeline.reproduce import rebuild_env

pytestmark = needs_fake_nvcc

MANIFEST = (
    '[qola]\nnamespace = "qk"\n[build]\narchitectures = ["sm_90"]\n'
    '[[modules]]\nname = "module_tiny"\nsrcs = ["csrc/tiny/tiny.cu"]\nis_python_module = false\n'
)


def env_dumping_nvcc(path: Path, log: Path) -> Path:
    """The fake nvcc, which first appends its environment (one ``KEY=value`` a line) to ``log``."""
    body = FAKE_NVCC.replace("{tag}", "env-dump").replace("{release}", "13.0")
    head, rest = body.split("\n", 1)
    path.write_text(f"{head}\nenv >> '{log}'\necho '----' >> '{log}'\n{rest}")
    path.chmod(0o755)
    return path


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str], Path]:
    """(OUT, the auditor's environment, the compiler's env log) of one real build."""
    tmp = tmp_path_factory.mktemp("repro")
    tree = make_tree(tmp / "tree")
    m = tmp / "q.toml"
    m.write_text(MANIFEST)
    log = tmp / "compiler-env.log"
    env = {"CUDACXX": str(env_dumping_nvcc(tmp / "nvcc", log)), "TMPDIR": str(tmp)}
    out = tmp / "out"
    res = run_qola("build", "--manifest", str(m), "--aiter-root", str(tree), "-o", str(out), "-j", "1", env=env)
    assert res.returncode == 0, res.stderr
    return out, env, log


def with_recorded(out: Path, key: str, value: str) -> None:
    path = out / "manifest.json"
    data = json.loads(path.read_text())
    data["build"].setdefault("env", {})[key] = value
    data["build"]["env_keys"] = sorted({*data["build"].get("env_keys", []), key})
    path.chmod(0o644)
    path.write_text(json.dumps(data))


@pytest.mark.parametrize(
    "key, value",
    [
        ("LD_PRELOAD", "/nonexistent/qola-evil.so"),  # a loader variable
        ("NVCC_PREPEND_FLAGS", "-DQOLA_EVIL_FLAG=1"),  # an injection variable (declared: a compiler input)
        ("PATH", "/nonexistent/qola-evil-bin"),  # a search path
        ("QOLA_UNDECLARED_EVIL", "1"),  # a variable qola does not declare
    ],
)
def test_reproduce_never_applies_a_recorded_runner_variable(
    built: tuple[Path, dict[str, str], Path], key: str, value: str
) -> None:
    out, env, log = built
    original = (out / "manifest.json").read_text()
    try:
        with_recorded(out, key, value)
        log.write_text("")
        res = run_qola("audit", str(out), "--reproduce", "-j", "1", env=env)
        assert "Traceback" not in res.stderr, res.stderr
        dumps = [dict(ln.split("=", 1) for ln in d.splitlines() if "=" in ln) for d in log.read_text().split("----")]
        dumps = [d for d in dumps if d]
        assert dumps, "the rebuild ran no compiler: " + res.stdout + res.stderr
        assert all(value not in d.get(key, "") for d in dumps), f"the recorded {key} reached the compiler"
        assert f"manifest.json records {key}=" in res.stdout and "not applied" in res.stdout, res.stdout
        assert res.returncode == 0, res.stdout + res.stderr  # the rebuild itself is the original's
    finally:
        (out / "manifest.json").write_text(original)


def test_reproduce_applies_declared_data_checked_as_a_build_checks_it(tmp_path: Path) -> None:
    """A declared data variable is applied only with a value a build would accept."""
    settings = {"env_keys": ["MAX_JOBS", "GPU_ARCHS"], "env": {"MAX_JOBS": "2", "GPU_ARCHS": "gfx942"}}
    env, notes = rebuild_env({}, recorded_build(settings), {"PATH": "/usr/bin"}, None)
    assert env["MAX_JOBS"] == "2" and env["GPU_ARCHS"] == "gfx942" and not notes, notes
    settings = {"env_keys": ["MAX_JOBS", "GPU_ARCHS"], "env": {"MAX_JOBS": "-3", "GPU_ARCHS": "-fplugin=x"}}
    env, notes = rebuild_env({}, recorded_build(settings), {"PATH": "/usr/bin"}, None)
    assert "MAX_JOBS" not in env and "GPU_ARCHS" not in env
    assert any("MAX_JOBS" in n and "not applied" in n for n in notes), notes
    assert any("GPU_ARCHS" in n and "not applied" in n for n in notes), notes


def tree_reading(tmp: Path, *keys: str) -> Path:
    """A tree whose module table reads ``keys`` into compile flags."""
    root = tmp / "tree"
    (root / "aiter" / "jit").mkdir(parents=True, exist_ok=True)
    flags = [f'f\'-D{k}={{os.environ.get("{k}", "1")}}\'' for k in keys]
    (root / "aiter" / "jit" / "optCompilerConfig.json").write_text(json.dumps({"m": {"flags_extra_hip": flags}}))
    return root


def test_a_tree_read_variable_is_applied_only_as_a_plain_word(tmp_path: Path) -> None:
    """What the tree's table reads goes into compile flags: a recorded value that is a flag, or a
    variable whose name says it holds flags or a path, is not applied."""
    tree = str(tree_reading(tmp_path, "QK_TILE", "QK_EXTRA_FLAGS", "QK_PLUGIN_PATH"))
    recorded = {"QK_TILE": "128", "QK_EXTRA_FLAGS": "-O0", "QK_PLUGIN_PATH": "/tmp/p"}
    env, notes = rebuild_env({}, recorded_build({"env_keys": sorted(recorded), "env": recorded}), {}, tree)
    assert env == {"QK_TILE": "128"}, env
    for bad in ("-fplugin=/tmp/evil.so", "1 -fplugin=/tmp/evil.so", "/tmp/evil"):
        env, notes = rebuild_env({}, recorded_build({"env_keys": ["QK_TILE"], "env": {"QK_TILE": bad}}), {}, tree)
        assert "QK_TILE" not in env and any("QK_TILE" in n and "not applied" in n for n in notes), (bad, notes)


def test_a_manifest_or_tree_inside_out_is_never_rebuilt(built: tuple[Path, dict[str, str], Path]) -> None:
    """Whoever writes OUT could name a manifest (with flags of their own) or a tree (with generators
    of their own) they put in OUT: refused before anything runs."""
    out, env, log = built
    original = (out / "manifest.json").read_text()
    data = json.loads(original)
    evil = out / "evil.toml"
    try:
        evil.write_text(Path(data["manifest"]["path"]).read_text())
        for key, value in (("manifest", str(evil)), ("tree", str(out))):
            changed = json.loads(original)
            changed[key]["path"] = value
            if key == "manifest":
                changed["manifest"]["sha256"] = hashlib.sha256(evil.read_bytes()).hexdigest()
            (out / "manifest.json").write_text(json.dumps(changed))
            log.write_text("")
            res = run_qola("audit", str(out), "--reproduce", env=env)
            assert res.returncode == 2 and "inside the output" in res.stderr, res.stdout + res.stderr
            assert "Traceback" not in res.stderr and not log.read_text(), res.stderr
    finally:
        evil.unlink(missing_ok=True)
        (out / "manifest.json").write_text(original)


def test_a_credential_recorded_as_its_digest_is_never_applied_as_a_value(tmp_path: Path) -> None:
    """A credential-like variable is recorded as ``sha256:<digest>`` (qola.core.secret.recorded_value):
    the rebuild keeps the auditor's value when it has that digest, and otherwise says so; the digest
    itself is never set as the variable's value."""
    tree = str(tree_reading(tmp_path, "HF_TOKEN"))
    recorded = {"HF_TOKEN": recorded_value("HF_TOKEN", "hunter2")}
    settings = recorded_build({"env_keys": ["HF_TOKEN"], "env": recorded})
    env, notes = rebuild_env({}, settings, {"HF_TOKEN": "hunter2"}, tree)
    assert env["HF_TOKEN"] == "hunter2" and not notes, notes
    env, notes = rebuild_env({}, settings, {}, tree)
    assert "HF_TOKEN" not in env and any("HF_TOKEN" in n and "digest" in n for n in notes), notes
    env, notes = rebuild_env({}, settings, {"HF_TOKEN": "other"}, tree)
    assert env["HF_TOKEN"] == "other" and any("another value" in n for n in notes), notes
