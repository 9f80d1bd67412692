"""A credential planted in each source a build reads (issue 51 item 1): a clone URL's password (the
manifest's ``[qola] aiter_url``), a token a module table merely names (``os.environ.get('HF_TOKEN')``
in a module the build does not build) and a credential-like variable. Nothing qola prints (``plan
--json``, ``plan --key --json``, the build, the no-op) and no file a build writes holds any of them
in clear; a variable only an unbuilt module reads is not recorded at all."""

from __future__ import annotations

import json
import os
from pathlib import Path

from support.cli import MODULE
from support.common import run_qola
from support.fake_nvcc import fake_nvcc, make_tree
from support.fake_nvcc import pytestmark as needs_fake_nvcc  # g++ and a CUDA toolkit's cudart

PASSWORD = "Pl4nted-pw"  # the clone URL's
TOKEN = "hf_Pl4ntedT0ken"  # HF_TOKEN's: named only by a module the build leaves out

pytestmark = needs_fake_nvcc


def _holding(root: Path, secrets: tuple[str, ...]) -> list[str]:
    """Files under ``root`` holding any of ``secrets``."""
    found = []
    for d, _, files in os.walk(root):
        for name in files:
            p = Path(d) / name
            if p.is_file() and not p.is_symlink() and any(s.encode() in p.read_bytes() for s in secrets):
                found.append(str(p))
    return found


def _tree_naming_a_token(root: Path) -> Path:
    """The fake-nvcc tree, its table with one more module whose flags read ``HF_TOKEN``."""
    tree = make_tree(root)
    table_path = tree / "aiter" / "jit" / "optCompilerConfig.json"
    table = json.loads(table_path.read_text())
    table["module_hf"] = {**table["module_softmax"], "flags_extra_cc": ['f\'-DTOK={os.environ.get("HF_TOKEN", "")}\'']}
    table_path.write_text(json.dumps(table, indent=1))
    return tree


def test_no_planted_credential_is_printed_or_written(tmp_path: Path) -> None:
    tree = _tree_naming_a_token(tmp_path / "tree")
    m = tmp_path / "q.toml"
    url = f"https://alice:{PASSWORD}@git.invalid/aiter.git"
    m.write_text(f'[qola]\nnamespace = "qk"\naiter_url = "{url}"\n[build]\narchitectures = ["sm_90"]\n' + MODULE)
    env = {"CUDACXX": str(fake_nvcc(tmp_path / "nvcc")), "HF_TOKEN": TOKEN}
    common = ("--manifest", m, "--aiter-root", tree)
    said = ""
    for args in (("plan", *common, "--json"), ("plan", *common, "--key", "--json")):
        proc = run_qola(*args, env=env, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        said += proc.stdout + proc.stderr
    sources = json.loads(run_qola("plan", *common, "--json", env=env, cwd=tmp_path).stdout)["sources"]
    assert sources["aiter_url"]["value"] == "https://***@git.invalid/aiter.git"
    key = run_qola("plan", *common, "--key", "--json", env=env, cwd=tmp_path, check=True).stdout
    assert "HF_TOKEN" not in key  # only a module the build leaves out reads it
    build = ("build", *common, "-o", tmp_path / "out", "-j", "2")
    for _ in range(2):  # the build, then the no-op
        proc = run_qola(*build, env=env, cwd=tmp_path)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        said += proc.stdout + proc.stderr
    assert "is up to date" in proc.stderr
    assert PASSWORD not in said and TOKEN not in said, said
    recorded = json.loads((tmp_path / "out" / "manifest.json").read_text())["build"]
    assert "HF_TOKEN" not in json.dumps(recorded)
    assert _holding(tmp_path, (PASSWORD, TOKEN)) == [str(m)]  # the manifest the user wrote, alone
