"""``QOLA_PREBUILT_DIR_<GROUP>`` in cmake/QoLA.cmake as QoLA reads it (issue 40 item 5), on a finished
output written by hand (cmake only: nothing is compiled).

* A relative value is taken from the calling CMakeLists.txt's directory (CMAKE_CURRENT_SOURCE_DIR).
  QoLA's module passes the value on unchanged: its ``file(GLOB)`` of ``lib/*.so`` reads it from that
  directory, and so do CMake's ``target_include_directories`` / ``target_link_directories`` the
  consumer hands the relative OUT_* dirs to (its ``if(EXISTS)`` reads cmake's working directory,
  which is the same dir when cmake runs there). qola resolves it there, whatever the working
  directory, and hands back absolute dirs; qola refused it before.
* ``QOLA_JIT`` against the output's manifest.json (a module built with ``[jit]`` records ``jit.dir``):
  ON with an output built ahead, or OFF with a JIT one, stops the configure naming both; a JIT module
  whose ``jit/`` dir is missing (stubs without their sources) stops it whatever QOLA_JIT says. Before,
  the group silently used whatever the output held."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from subprocess import CompletedProcess

import pytest
from support.cmake_clients import cmake, project
from support.common import REPO

pytestmark = pytest.mark.skipif(not shutil.which("cmake"), reason="needs cmake")

LIBS = ("te_libmha_bwd.so", "te_libmha_fwd.so")
CALL = """cmake_minimum_required(VERSION 3.21)
project(prebuilt_probe LANGUAGES NONE)
include(${QOLA_DIR}/cmake/QoLA.cmake)
qola_add_modules(GROUP ck_fused_attn MANIFEST ${CMAKE_CURRENT_SOURCE_DIR}/none.toml BUILD_DIR b
                 OUT_INCLUDE_DIR INC OUT_LIB_DIR QLIB OUT_LIBS QLIBS)
file(WRITE "${CMAKE_BINARY_DIR}/vars.json" "{\\"inc\\": \\"${INC}\\", \\"lib\\": \\"${QLIB}\\", \\"libs\\": \\"${QLIBS}\\"}")
"""


def output(root: Path, jit: bool, jit_dirs: bool = True) -> Path:
    """A finished output as qola writes it: lib/, include/qola_config.h, manifest.json (and jit/)."""
    (root / "lib").mkdir(parents=True)
    (root / "include").mkdir()
    (root / "include" / "qola_config.h").write_text("")
    mods = []
    for lib in LIBS:
        (root / "lib" / lib).write_bytes(b"")
        md = lib.removesuffix(".so")
        mod: dict[str, object] = {"name": md.removeprefix("te_"), "status": "built", "artifact": f"lib/{lib}"}
        if jit:
            mod["jit"] = {"dir": f"jit/{md}", "style": "stub"}
            if jit_dirs:
                (root / "jit" / md).mkdir(parents=True)
        mods.append(mod)
    (root / "manifest.json").write_text(json.dumps({"namespace": "te", "modules": mods}, indent=1))
    return root


def configure(tmp: Path, prebuilt: str, jit: str = "") -> tuple[CompletedProcess[str], dict[str, str]]:
    """Configure a project (in tmp/src/te, called from cmake run in tmp/elsewhere) with the group prebuilt."""
    src = project(tmp / "src" / "te", CALL, {})
    (tmp / "elsewhere").mkdir(exist_ok=True)
    defs = {"QOLA_DIR": str(REPO), "QOLA_JIT": jit}
    cfg = cmake(
        src, tmp / "bld", defs, {"QOLA_PREBUILT_DIR_CK_FUSED_ATTN": prebuilt}, build=False, cwd=tmp / "elsewhere"
    )
    found = json.loads((tmp / "bld" / "vars.json").read_text()) if cfg.returncode == 0 else {}
    return cfg, found


def said(cfg: CompletedProcess[str]) -> str:
    return " ".join(cfg.stderr.split())


def test_a_relative_prebuilt_dir_is_read_from_the_calling_cmakelists_dir(tmp_path: Path) -> None:
    out = output(tmp_path / "src" / "cache" / "aiter", jit=False)
    cfg, found = configure(tmp_path, "../cache/aiter")
    assert cfg.returncode == 0, cfg.stdout + cfg.stderr
    assert found == {"inc": str(out / "include"), "lib": str(out / "lib"), "libs": ";".join(LIBS)}
    assert f"prebuilt libraries from {out}" in cfg.stdout


def test_a_relative_prebuilt_dir_names_where_it_was_looked_for(tmp_path: Path) -> None:
    output(tmp_path / "elsewhere" / "cache", jit=False)  # relative to the working dir only: not it
    cfg, _ = configure(tmp_path, "cache")
    where = tmp_path / "src" / "te"
    assert cfg.returncode != 0
    assert f"QOLA_PREBUILT_DIR_CK_FUSED_ATTN=cache (relative to {where}: {where}/cache) is not a directory" in said(
        cfg
    ), cfg.stderr


@pytest.mark.parametrize("jit", ["", "ON", "on"])
def test_a_jit_output_is_used_unless_qola_jit_is_off(tmp_path: Path, jit: str) -> None:
    out = output(tmp_path / "jitout", jit=True)
    cfg, found = configure(tmp_path, str(out), jit)
    assert cfg.returncode == 0, cfg.stdout + cfg.stderr
    assert found["lib"] == str(out / "lib")


def test_qola_jit_on_with_an_output_built_ahead_names_both(tmp_path: Path) -> None:
    out = output(tmp_path / "aot", jit=False)
    assert configure(tmp_path / "a", str(out))[0].returncode == 0  # QOLA_JIT empty: used as it is
    cfg, _ = configure(tmp_path / "b", str(out), "ON")
    assert cfg.returncode != 0
    text = said(cfg)
    assert f"QOLA_JIT=ON asks for JIT libraries (TE's CK_JIT mode), but QOLA_PREBUILT_DIR_CK_FUSED_ATTN={out}" in text
    assert "built without [jit]" in text and "built ahead: libmha_bwd, libmha_fwd" in text, cfg.stderr
    assert "qola build --jit on" in text and "Traceback" not in cfg.stderr


def test_qola_jit_on_with_an_output_without_manifest_json_names_both(tmp_path: Path) -> None:
    out = output(tmp_path / "qola_written_elsewhere", jit=False)
    (out / "manifest.json").unlink()
    cfg, _ = configure(tmp_path, str(out), "ON")
    assert cfg.returncode != 0 and "built without [jit]" in said(cfg), cfg.stderr


def test_qola_jit_off_with_a_jit_output_names_both(tmp_path: Path) -> None:
    out = output(tmp_path / "jitout", jit=True)
    cfg, _ = configure(tmp_path, str(out), "OFF")
    assert cfg.returncode != 0
    text = said(cfg)
    assert f"QOLA_JIT=OFF asks for every kernel ahead, but QOLA_PREBUILT_DIR_CK_FUSED_ATTN={out}" in text
    assert "libmha_bwd, libmha_fwd compile their kernels on first call" in text, cfg.stderr


@pytest.mark.parametrize("manifest", ["gone", "ahead"])
def test_qola_jit_off_with_a_jit_output_is_refused_by_its_contents(tmp_path: Path, manifest: str) -> None:
    """Issue 51: OFF is checked against what the output holds (JIT sources in jit/<ns>_<module>), not
    only its manifest.json: one removed, or one that records no JIT module, took the JIT output silently."""
    out = output(tmp_path / "jitout", jit=True)
    if manifest == "gone":
        (out / "manifest.json").unlink()
    else:
        (out / "manifest.json").write_text(json.dumps({"namespace": "te", "modules": []}))
    cfg, _ = configure(tmp_path, str(out), "OFF")
    assert cfg.returncode != 0, cfg.stdout
    text = said(cfg)
    assert f"QOLA_JIT=OFF asks for every kernel ahead, but QOLA_PREBUILT_DIR_CK_FUSED_ATTN={out}" in text, text
    assert f"holds the JIT's sources ({out}/jit/: te_libmha_bwd, te_libmha_fwd)" in text, text
    assert configure(tmp_path / "empty", str(output(tmp_path / "aot", jit=False)), "OFF")[0].returncode == 0


@pytest.mark.parametrize("jit", ["", "ON"])
def test_jit_stubs_without_their_jit_dir_are_refused(tmp_path: Path, jit: str) -> None:
    out = output(tmp_path / "stubs_only", jit=True, jit_dirs=False)
    cfg, _ = configure(tmp_path, str(out), jit)
    assert cfg.returncode != 0
    text = said(cfg)
    assert "module libmha_bwd was built with [jit]" in text and f"{out}/jit/te_libmha_bwd is missing" in text
    assert "the stubs cannot compile without their sources" in text, cfg.stderr
