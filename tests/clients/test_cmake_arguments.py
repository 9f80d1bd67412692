"""``cmake/QoLA.cmake`` hands qola each argument whole (issue 33): an interpreter whose path holds ``=``
(``cmake -E env`` read it as an assignment and qola never ran), and paths under a directory whose name
holds ``;`` (made absolute, they went into a CMake list unquoted and split: ``--arch sm_80`` arrived
as an option). The interpreter here is a stand-in that records its argv and writes what a build
writes, so no compiler is needed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support.common import REPO

pytestmark = pytest.mark.skipif(not shutil.which("cmake"), reason="needs cmake")

FAKE_PYTHON = r"""#!{python}
import json, os, sys
args = sys.argv[1:]
with open({log!r}, "a") as f:
    f.write(json.dumps({{"argv": args, "pythonpath": os.environ.get("PYTHONPATH")}}) + "\n")
if "build" in args:
    out = args[args.index("--output-dir") + 1]
    os.makedirs(os.path.join(out, "include"), exist_ok=True)
    os.makedirs(os.path.join(out, "lib"), exist_ok=True)
    open(os.path.join(out, "include", "qola_config.h"), "w").close()
    open(os.path.join(out, "lib", "qk_libx.so"), "w").close()
if "checkout" in args:
    root = args[args.index("--aiter-root") + 1]
    os.makedirs(os.path.join(root, "csrc", "include"), exist_ok=True)
"""

CMAKELISTS = """cmake_minimum_required(VERSION 3.16)
project(args_probe NONE)
include("{qola_cmake}")
qola_checkout_aiter(MANIFEST "{manifest_rel}" AITER_DIR "${{CMAKE_CURRENT_BINARY_DIR}}/t{odd}ree" OUT_DIR TREE)
qola_build_modules(GROUP g MANIFEST "{manifest_rel}" BUILD_DIR "${{CMAKE_CURRENT_BINARY_DIR}}/o{odd}ut"
                   AITER_DIR "${{TREE}}" ARCHS sm_80 sm_90 OUT_LIBS QLIBS)
file(WRITE "${{CMAKE_CURRENT_BINARY_DIR}}/libs.txt" "${{QLIBS}}")
"""


@pytest.mark.parametrize("odd", ["=", ";", "= ;"])
def test_every_argument_reaches_qola_whole(tmp_path: Path, odd: str) -> None:
    # CMake itself cannot configure in a dir whose path holds ';': the odd names are below it
    src, bld = tmp_path / "src", tmp_path / "bld"
    top = tmp_path / "tools"
    sub = f"s{odd}ub"
    (src / sub).mkdir(parents=True)
    (src / sub / "q.toml").write_text('[qola]\naiter_commit = "0123456789abcdef"\nnamespace = "qk"\n')
    pybin = top / f"py{odd}env" / "bin"
    pybin.mkdir(parents=True)
    log = tmp_path / "calls.jsonl"
    fake = pybin / "python"
    fake.write_text(FAKE_PYTHON.format(python=sys.executable, log=str(log)))
    fake.chmod(0o755)
    (src / "CMakeLists.txt").write_text(
        CMAKELISTS.format(qola_cmake=REPO / "cmake" / "QoLA.cmake", manifest_rel=f"{sub}/q.toml", odd=odd)
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    # the stand-in interpreter is named the CMake way (QOLA_PYTHON); the cache entry is quoted whole
    cfg = subprocess.run(
        ["cmake", "-S", str(src), "-B", str(bld), f"-DQOLA_PYTHON:FILEPATH={fake}"],
        capture_output=True,
        text=True,
        env=env,
        cwd=src,
    )
    assert cfg.returncode == 0, cfg.stdout[-3000:] + cfg.stderr[-3000:]
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    manifest = str(src / sub / "q.toml")
    tree, out = f"{bld}/t{odd}ree", f"{bld}/o{odd}ut"
    assert calls[0]["argv"] == ["-m", "qola.cli", "checkout", "--manifest", manifest, "--aiter-root", tree]
    assert calls[1]["argv"] == [
        "-m",
        "qola.cli",
        "build",
        "--manifest",
        manifest,
        "--aiter-root",
        tree,
        "--output-dir",
        out,
        "--skip-checkout",
        "--group",
        "g",
        "--arch",
        "sm_80",
        "--arch",
        "sm_90",
    ]
    assert all(c["pythonpath"] == str(REPO) for c in calls)  # qola's checkout first, set for the child only
    assert (bld / "libs.txt").read_text() == "qk_libx.so"
