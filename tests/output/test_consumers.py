"""Consumer files: qola_config.h, CMake package config, pkg-config — rendered, then used by a real
CMake project, a pkg-config build and ctypes against a fake output directory built from the demo
module of test_isolation (g++ only, no GPU)."""

from __future__ import annotations

import ctypes
import os
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from support.link_objects import build_objects, link_shared, sh, write_includes

from qola.compile import link
from qola.core.errors import QolaError
from qola.output import consumers
from qola.output.consumers import ConsumerModule

VERSION = "1.2.3"
MAIN_C = r"""
#include <stdio.h>
#include <string.h>
#include "qola_demo.h"
int main(void) {
    const char* v = QOLA_C_NAME(qola_version)();
    printf("%s %s %d\n", QOLA_NAMESPACE_STR, v, QOLA_C_NAME(demo_get_value)());
    return strcmp(v, QOLA_VERSION_STR) != 0;
}
"""
CMAKE_LISTS = """cmake_minimum_required(VERSION 3.16)
project(consumer LANGUAGES C CXX)
find_package(qola-te 1.0 REQUIRED CONFIG)
add_executable(consumer main.c)
target_link_libraries(consumer PRIVATE qola::te::demo)
"""


def test_config_header() -> None:
    text = consumers.render_config_header("te", "0.1.0")
    assert "#define QOLA_NAMESPACE te\n" in text and '#define QOLA_NAMESPACE_STR "te"' in text
    assert '#define QOLA_VERSION_STR "0.1.0"' in text
    with pytest.raises(QolaError):
        consumers.render_config_header("t-e", "0.1")
    with pytest.raises(QolaError):
        consumers.render_config_header("te", '1"; evil')


def test_render_cmake_and_pkgconfig() -> None:
    mods = [
        ConsumerModule("libmha_fwd", "te_libmha_fwd.so", "shared", ["amdhip64"], ["/opt/rocm/lib"]),
        ConsumerModule("libmha_bwd", "te_libmha_bwd.a", "static", ["amdhip64"], ["/opt/rocm/lib"]),
    ]
    cm = consumers.render_cmake_config("te", mods, version="0.1.0")
    assert '"${CMAKE_CURRENT_LIST_DIR}/../../.." ABSOLUTE' in cm
    assert "add_library(qola::te::libmha_fwd SHARED IMPORTED)" in cm
    assert "add_library(qola::te::libmha_bwd STATIC IMPORTED)" in cm
    assert 'IMPORTED_LOCATION "${_qola_te_prefix}/lib/te_libmha_fwd.so"' in cm
    assert 'find_library(QOLA_TE_AMDHIP64_LIBRARY NAMES amdhip64 HINTS "/opt/rocm/lib")' in cm
    assert "/work" not in cm and str(Path.cwd()) not in cm  # nothing absolute but the toolchain dir
    pc = consumers.render_pkgconfig("te", mods, "0.1.0")
    assert "prefix=${pcfiledir}/../..\n" in pc and "Version: 0.1.0" in pc
    libs = next(line for line in pc.splitlines() if line.startswith("Libs: "))
    assert "-l:te_libmha_fwd.so" in libs and "-l:te_libmha_bwd.a" in libs and "-lamdhip64" in libs
    assert "-lstdc++" in libs and "-Wl,-rpath,${libdir}" in libs
    files = consumers.consumer_files("te", mods, "0.1.0")
    assert set(files) == {
        "include/qola_common.h",
        "include/qola_config.h",
        "lib/pkgconfig/qola-te.pc",
        "share/cmake/qola-te/qola-te-config.cmake",
        "share/cmake/qola-te/qola-te-config-version.cmake",
    }
    assert "QOLA_NS_BEGIN" in files["include/qola_common.h"]
    with pytest.raises(QolaError):
        ConsumerModule("x", "te_x.so", "dynamic")


def make_output(root: Path, kind: str) -> Path:
    """A fake qola output dir: lib/te_demo.{so,a}, include/, share/cmake/, lib/pkgconfig/."""
    out = root / f"O-{kind}"
    objs = build_objects(root, "te", 5)
    if kind == "shared":
        link_shared(objs, out / "lib" / "te_demo.so", "te")
        shutil.rmtree(out / "lib" / "te_demo.so.work")
        lib_file = "te_demo.so"
    else:
        link.run_static(objs, out / "lib" / "te_demo.a", "te", root / f"work-{kind}")
        lib_file = "te_demo.a"
    mods = [ConsumerModule("demo", lib_file, kind, ["m"])]
    for rel, text in consumers.consumer_files("te", mods, VERSION).items():
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_text(text)
    write_includes(root / "hdr", "te")
    shutil.copy(root / "hdr" / "qola_demo.h", out / "include" / "qola_demo.h")
    return out


@pytest.fixture(scope="module", params=["shared", "static"])
def output_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    root = tmp_path_factory.mktemp(f"consumer-{request.param}")
    built = make_output(root, request.param)
    moved = root / "moved elsewhere" / "qola-out"  # relocatable: nothing points back to `built`
    moved.parent.mkdir()
    shutil.move(str(built), str(moved))
    return request.param, moved


@pytest.mark.skipif(not shutil.which("cmake"), reason="needs cmake")
def test_cmake_find_package(output_dir: tuple[Any, Path], tmp_path: Path) -> None:
    _kind, out = output_dir
    for langs in ("C CXX", "C"):  # a C-only project still gets the C++ runtime of a static module
        src, build = tmp_path / f"src {langs}", tmp_path / f"build {langs}"
        src.mkdir()
        (src / "CMakeLists.txt").write_text(CMAKE_LISTS.replace("C CXX", langs))
        (src / "main.c").write_text(MAIN_C)
        sh("cmake", "-S", src, "-B", build, f"-Dqola-te_DIR={out}/share/cmake/qola-te", "-DCMAKE_BUILD_TYPE=Release")
        sh("cmake", "--build", build)
        assert sh(build / "consumer").split() == ["te", VERSION, "5"]
    # a version the package does not satisfy is refused
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "CMakeLists.txt").write_text(CMAKE_LISTS.replace("qola-te 1.0", "qola-te 2.0"))
    (bad / "main.c").write_text(MAIN_C)
    proc = subprocess.run(
        ["cmake", "-S", str(bad), "-B", str(tmp_path / "bb"), f"-Dqola-te_DIR={out}/share/cmake/qola-te"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode != 0 and "1.2.3" in proc.stderr


@pytest.mark.skipif(not shutil.which("pkg-config"), reason="needs pkg-config")
def test_pkg_config(output_dir: tuple[Any, Path], tmp_path: Path) -> None:
    kind, out = output_dir
    env = {**os.environ, "PKG_CONFIG_PATH": str(out / "lib" / "pkgconfig")}
    printed = subprocess.run(
        ["pkg-config", "--cflags", "--libs", "qola-te"], capture_output=True, text=True, env=env, check=True
    ).stdout
    flags = shlex.split(printed)  # pkg-config escapes the space of "moved elsewhere" with a backslash
    assert f"-l:te_demo.{'so' if kind == 'shared' else 'a'}" in flags
    (tmp_path / "main.c").write_text(MAIN_C)
    sh("cc", tmp_path / "main.c", "-o", tmp_path / "consumer", *flags)
    assert sh(tmp_path / "consumer").split() == ["te", VERSION, "5"]  # rpath: no LD_LIBRARY_PATH needed


def test_ctypes(output_dir: tuple[Any, Path]) -> None:
    kind, out = output_dir
    if kind != "shared":
        pytest.skip("ctypes loads shared libraries")
    lib = ctypes.CDLL(str(out / "lib" / "te_demo.so"))
    lib.te_qola_version.restype = ctypes.c_char_p
    assert lib.te_qola_version() == VERSION.encode() and lib.te_demo_get_value() == 5
