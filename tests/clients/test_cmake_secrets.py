"""cmake/QoLA.cmake prints no credential (issue 51 item 1): ``QOLA_PREBUILT_DIR_<GROUP>`` as a store
URL with a password (a raw '#' in it too) and ``QOLA_BUILD_ARGS`` holding ``--prebuilt;URL`` with a
token were shown whole in its STATUS lines; every message goes through one masking function."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from support.cmake_clients import cmake, project
from support.common import KERNELS, REPO

pytestmark = pytest.mark.skipif(not shutil.which("cmake"), reason="needs cmake")

PASSWORD = "Pl4nted#pw"
TOKEN = "Pl4ntedT0ken"

CALL = """cmake_minimum_required(VERSION 3.21)
project(secrets_probe LANGUAGES NONE)
include(${QOLA_DIR}/cmake/QoLA.cmake)
qola_build_modules(GROUP g MANIFEST ${CMAKE_CURRENT_SOURCE_DIR}/q.toml BUILD_DIR b AITER_DIR ${TREE})
"""


def test_cmake_messages_mask_url_credentials(tmp_path: Path) -> None:
    manifest = '[qola]\nnamespace = "qk"\n[build]\narchitectures = ["sm_90"]\n[[modules]]\nname = "module_softmax"\n'
    src = project(tmp_path / "src", CALL, {"q.toml": manifest})
    defs = {
        "QOLA_DIR": str(REPO),
        "TREE": str(KERNELS),
        "QOLA_BUILD_ARGS": f"--prebuilt;https://bob:{TOKEN}@127.0.0.1:1/s",
    }
    env = {"QOLA_PREBUILT_DIR_G": f"http://alice:{PASSWORD}@127.0.0.1:1/store"}
    cfg = cmake(src, tmp_path / "bld", defs, env, build=False)
    said = cfg.stdout + cfg.stderr
    assert "[qola] python -m qola.cli build" in said and "http://***@127.0.0.1:1/store" in said, said
    assert "https://***@127.0.0.1:1/s" in said
    assert PASSWORD not in said and TOKEN not in said, said
    for d, _, files in os.walk(tmp_path):  # CMake's own cache keeps the -D value it was given
        for name in files:
            p = Path(d) / name
            if name != "CMakeCache.txt" and p.is_file():
                assert TOKEN.encode() not in p.read_bytes() and PASSWORD.encode() not in p.read_bytes(), p
