"""A whole build keys its generators by what they read (issue 41): a generator that imports a helper
from another directory (AITER's ``mha_fwd_generate.py`` imports ``chip_info`` from
``aiter/jit/utils/`` through ``sys.path.insert``) — a change to the helper alone is no no-op: the
generator reruns, the changed source is recompiled, and the build after that is a no-op again.
Before, the no-op record and the generator stamp hashed only the ``*.py`` beside the script: rc 0,
the library still built from the old generated code."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from support.common import KERNELS, run_qola

GEN = """
import os, pathlib, sys
sys.path.insert(0, {lib!r})
from chip import VALUE
out = pathlib.Path(sys.argv[sys.argv.index("--output_dir") + 1])
out.mkdir(parents=True, exist_ok=True)
(out / "k_value.cu").write_text(f'extern "C" int qk_value() {{{{ return {{VALUE}}; }}}}\\n')
with open(os.environ["GEN_CALLS"], "a") as fh:
    fh.write("ran\\n")
"""


def one_generator(tmp_path: Path, stem: str, text: str) -> tuple[Path, Path]:
    """The example tree with ``csrc/gen_<stem>.py`` = ``text``, and a manifest of one module
    ``module_<stem>`` that it generates alone: (tree, manifest)."""
    tree = tmp_path / "tree"
    shutil.copytree(KERNELS, tree, ignore=shutil.ignore_patterns("__pycache__", "hsa"))
    (tree / "csrc" / f"gen_{stem}.py").write_text(text)
    m = tmp_path / "q.toml"
    m.write_text(
        '[qola]\nnamespace = "qk"\n[build]\narchitectures = ["sm_90"]\n'
        f'[[modules]]\nname = "module_{stem}"\nsrcs = []\nis_python_module = false\n'
        f'blob_gen_cmd = ["csrc/gen_{stem}.py --output_dir {{}}"]\n'
    )
    return tree, m


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_a_helper_imported_from_elsewhere_is_no_no_op(tmp_path: Path) -> None:
    lib = tmp_path / "tree" / "aiter" / "jit" / "utils"
    tree, m = one_generator(tmp_path, "value", GEN.format(lib=str(lib)))
    lib.mkdir(parents=True, exist_ok=True)
    (lib / "chip.py").write_text("VALUE = 1\n")
    out, calls = tmp_path / "out", tmp_path / "calls"
    env = {"GEN_CALLS": str(calls), "XDG_CACHE_HOME": str(tmp_path / "cache")}

    def build() -> str:
        proc = run_qola("build", "-m", str(m), "--aiter-root", str(tree), "-o", str(out), "-j", "2", env=env)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return str(proc.stdout + proc.stderr)

    build()
    generated = next((tmp_path / "out.build").rglob("k_value.cu"))
    assert "return 1;" in generated.read_text() and calls.read_text().count("ran") == 1
    assert "up to date" in build().lower() and calls.read_text().count("ran") == 1  # a no-op
    (lib / "chip.py").write_text("VALUE = 22\n")  # the helper alone
    build()
    assert "return 22;" in generated.read_text() and calls.read_text().count("ran") == 2
    assert json.loads((out / "manifest.json").read_text())["modules"][0]["status"] == "built"
    assert "up to date" in build().lower() and calls.read_text().count("ran") == 2


KNOB_GEN = """
import os, pathlib, sys
out = pathlib.Path(sys.argv[sys.argv.index("--output_dir") + 1])
out.mkdir(parents=True, exist_ok=True)
knob = os.environ.get("MY_GEN_KNOB", "0")
(out / "k_knob.cu").write_text(f'extern "C" int qk_knob() {{ return {knob}; }}\\n')
with open(os.environ["GEN_CALLS"], "a") as fh:
    fh.write("ran\\n")
"""


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_a_variable_a_generator_read_is_no_no_op(tmp_path: Path) -> None:
    """A variable no list of qola's names (fastpath.ENV_KEYS) but a generator looked up: a change is
    no no-op (before: "up to date", rc 0, the old generated source kept); its value is in no record
    in clear."""
    tree, m = one_generator(tmp_path, "knob", KNOB_GEN)
    out, calls = tmp_path / "out", tmp_path / "calls"
    env = {"GEN_CALLS": str(calls), "XDG_CACHE_HOME": str(tmp_path / "cache"), "MY_GEN_KNOB": "0x5EC1"}

    def build(**more: str) -> str:
        proc = run_qola(
            "build", "-m", str(m), "--aiter-root", str(tree), "-o", str(out), "-j", "2", env={**env, **more}
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return str(proc.stdout + proc.stderr)

    build()
    generated = next((tmp_path / "out.build").rglob("k_knob.cu"))
    assert "return 0x5EC1;" in generated.read_text() and calls.read_text().count("ran") == 1
    assert "up to date" in build().lower() and calls.read_text().count("ran") == 1  # a no-op
    said = build(MY_GEN_KNOB="0x5EC2")
    assert "up to date (nothing to do)" not in said.lower()
    assert "return 0x5EC2;" in generated.read_text() and calls.read_text().count("ran") == 2
    assert "up to date" in build(MY_GEN_KNOB="0x5EC2").lower() and calls.read_text().count("ran") == 2
    held = [p.name for p in tmp_path.glob("out*/**/*") if p.is_file() and b"0x5EC2" in p.read_bytes()]
    assert held == ["k_knob.cu"]  # the generated source alone: no record, stamp or log holds the value


ARGPARSE_GEN = """
import argparse, os, pathlib
p = argparse.ArgumentParser()  # its formatter looks up COLUMNS and LINES (shutil.get_terminal_size)
p.add_argument("--output_dir")
out = pathlib.Path(p.parse_args().output_dir)
out.mkdir(parents=True, exist_ok=True)
(out / "k_cols.cu").write_text('extern "C" int qk_cols() { return 3; }\\n')
with open(os.environ["GEN_CALLS"], "a") as fh:
    fh.write("ran\\n")
"""


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_a_terminal_resize_is_still_a_no_op(tmp_path: Path) -> None:
    """Every generator's argparse reads COLUMNS and LINES: qola gives its generators fixed ones
    (genrules.aiter_env), so the caller's terminal size is no input (before: a resize reran the
    generator and ended the no-op)."""
    tree, m = one_generator(tmp_path, "cols", ARGPARSE_GEN)
    out, calls = tmp_path / "out", tmp_path / "calls"
    env = {"GEN_CALLS": str(calls), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    for cols, lines in (("100", "30"), ("133", "41"), ("", "")):
        proc = run_qola(
            "build",
            "-m",
            str(m),
            "--aiter-root",
            str(tree),
            "-o",
            str(out),
            env={**env, "COLUMNS": cols, "LINES": lines},
        )
        assert proc.returncode == 0, proc.stderr
        assert calls.read_text().count("ran") == 1, (cols, proc.stderr)
        assert cols == "100" or "up to date (nothing to do)" in proc.stderr, proc.stderr
