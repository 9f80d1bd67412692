"""A failed module never takes a good library out of OUT (issue 41 item 7). By default a build with
any failed module publishes nothing: OUT keeps its previous version whole (every library, manifest.json
byte for byte), the exit is non-zero and the failure is named. ``--keep-going`` publishes the modules
that built and says which failed modules kept their previous library and which are absent.

Builds use the fake nvcc (g++ underneath) and a generator that fails once its script says so."""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

import pytest
from support.common import run_qola
from support.fake_nvcc import fake_nvcc, make_tree
from support.fake_nvcc import pytestmark as needs_fake_nvcc

pytestmark = needs_fake_nvcc

GEN_OK = (
    "import sys\nd = sys.argv[sys.argv.index('--output_dir') + 1]\n"
    "open(d + '/gen.cu', 'w').write('extern \"C\" __attribute__((visibility(\"default\"))) int qk_gen_answer() "
    "{ return %d; }\\n')\n"
)
GEN_FAIL = "import sys\nprint('GEN-BROKEN-MARK', file=sys.stderr)\nsys.exit(3)\n"
QK_TINY = 'extern "C" __attribute__((visibility("default"))) int qk_tiny_answer() { return 42; }\n'
HEAD = '[qola]\nnamespace = "qk"\n[build]\narchitectures = ["sm_90"]\n'
TINY = '[[modules]]\nname = "module_tiny"\nsrcs = ["csrc/tiny/tiny.cu"]\nis_python_module = false\n'
GEN = '[[modules]]\nname = "module_gen"\nblob_gen_cmd = ["csrc/gen/gen.py --output_dir {}"]\nis_python_module = false\n'
NEW = '[[modules]]\nname = "module_new"\nblob_gen_cmd = ["csrc/gen/bad.py --output_dir {}"]\nis_python_module = false\n'


def sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


@pytest.fixture
def first(tmp_path: Path) -> tuple[Path, Path, Path, dict[str, str]]:
    """(tree, manifest, OUT, env) after a build where every module built."""
    tree = make_tree(tmp_path / "tree")
    (tree / "csrc" / "gen").mkdir()
    (tree / "csrc" / "gen" / "gen.py").write_text(GEN_OK % 7)
    (tree / "csrc" / "gen" / "bad.py").write_text(GEN_FAIL)
    (tree / "csrc" / "tiny" / "tiny.cu").write_text(QK_TINY)  # exports the namespace's prefix: the audit passes
    m = tmp_path / "q.toml"
    m.write_text(HEAD + TINY + GEN)
    env = {"CUDACXX": str(fake_nvcc(tmp_path / "nvcc"))}
    out = tmp_path / "out"
    res = build(m, tree, out, env)
    assert res.returncode == 0, res.stderr
    assert (out / "lib" / "qk_module_gen.so").is_file() and (out / "lib" / "qk_module_tiny.so").is_file()
    return tree, m, out, env


def build(m: Path, tree: Path, out: Path, env: dict[str, str], *extra: str) -> subprocess.CompletedProcess[str]:
    return run_qola(
        "build", "--manifest", str(m), "--aiter-root", str(tree), "-o", str(out), "-j", "1", *extra, env=env
    )


def test_a_failed_module_publishes_nothing_by_default(first: tuple[Path, Path, Path, dict[str, str]]) -> None:
    tree, m, out, env = first
    before = {p.name: sha(p) for p in (out / "lib").glob("*.so")}
    record = (out / "manifest.json").read_bytes()
    (tree / "csrc" / "gen" / "gen.py").write_text(GEN_FAIL)  # the generator breaks
    (tree / "csrc" / "tiny" / "tiny.cu").write_text((tree / "csrc" / "tiny" / "tiny.cu").read_text() + "// edit\n")
    res = build(m, tree, out, env)
    assert res.returncode == 1, res.stderr
    err = res.stderr
    assert "Traceback" not in err and "module_gen" in err and "nothing published" in err, err
    assert str(out) in err and "previous version" in err and "--keep-going" in err, err
    log = out.parent / "out.build" / "logs" / "module_gen.log"  # OUT/logs holds the previous version's
    assert f"full log: {log}" in err and "GEN-BROKEN-MARK" in log.read_text(), err
    assert {p.name: sha(p) for p in (out / "lib").glob("*.so")} == before, "OUT lost or changed a library"
    assert (out / "manifest.json").read_bytes() == record
    assert run_qola("audit", str(out)).returncode == 0


def test_keep_going_publishes_what_built_and_names_kept_and_absent(
    first: tuple[Path, Path, Path, dict[str, str]],
) -> None:
    tree, m, out, env = first
    old_gen = sha(out / "lib" / "qk_module_gen.so")
    (tree / "csrc" / "gen" / "gen.py").write_text(GEN_FAIL)
    (tree / "csrc" / "tiny" / "tiny.cu").write_text(
        'extern "C" __attribute__((visibility("default"))) int qk_t() { return 5; }\n'
    )
    m.write_text(HEAD + TINY + GEN + NEW)
    res = build(m, tree, out, env, "--keep-going")
    err = res.stderr
    assert res.returncode == 1 and "Traceback" not in err, err
    assert "kept the previous version: module_gen" in err and "absent: module_new" in err, err
    data = json.loads((out / "manifest.json").read_text())
    mods = {x["name"]: x for x in data["modules"]}
    assert mods["module_tiny"]["status"] == "built"
    assert mods["module_gen"]["status"] == "built" and mods["module_gen"]["kept"], mods["module_gen"]
    assert mods["module_gen"]["sha256"] == old_gen == sha(out / "lib" / "qk_module_gen.so")
    assert mods["module_new"]["status"] == "failed" and not (out / "lib" / "qk_module_new.so").exists()
    assert run_qola("audit", str(out), "--allow-failed").returncode == 0
