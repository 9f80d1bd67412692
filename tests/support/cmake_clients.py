"""Helpers of the tests that replay qola's CMake clients (test_cmake_clients.py, test_rocm_cmake_clients.py):
a kernel tree served from a local bare git mirror, a plain qola checkout laid out like TE's
``3rdparty/QoLA``, and the two CMake projects — Transformer Engine's call form and ``qola_add_modules()``."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from subprocess import CompletedProcess

from support.common import REPO

# where `qola checkout` clones from by default; the tests point git's url rewriting at the mirror
UPSTREAMS = ("https://github.com/ROCm/aiter.git", "https://github.com/ROCm/aiter")
GIT_ID = {
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.invalid",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.invalid",
}


def sh(*argv: object, cwd: Path | None = None, env: dict[str, str] | None = None) -> str:
    proc = subprocess.run(
        [str(a) for a in argv], cwd=cwd, env={**os.environ, **(env or {})}, capture_output=True, text=True
    )
    assert proc.returncode == 0, f"{argv} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


@dataclass(frozen=True)
class Mirror:
    bare: Path  # the bare repository
    commit: str  # its one commit: the tree
    env: dict[str, str]  # git url rewriting: the upstream URLs fetch from `bare`


def mirror_tree(tree: Path, where: Path, *, skip: tuple[str, ...] = ()) -> Mirror:
    """``tree`` committed into a new repository and cloned bare into ``where/aiter-mirror.git``;
    ``skip``: paths relative to ``tree`` left out (build outputs git would ignore)."""
    src = where / "aiter-src"
    left_out = {tree / s for s in skip}
    # a nested .git (the sdist's composable_kernel has a dangling `gitdir:` file) would make git keep the
    # directory as a submodule link without its files: the mirror holds the files themselves
    plain = shutil.ignore_patterns("__pycache__", "*.pyc", ".qola-unpacked", ".git")

    def ignore(d: str, names: list[str]) -> set[str]:
        return set(plain(d, names)) | {n for n in names if Path(d) / n in left_out}

    shutil.copytree(tree, src, symlinks=True, ignore=ignore)
    if not (src / ".gitignore").exists():  # the sdist has none; AITER's own ignores Python's caches
        (src / ".gitignore").write_text("__pycache__\n*.pyc\n")
    sh("git", "init", "-q", "-b", "main", src)
    sh("git", "add", "-A", "-f", ".", cwd=src)  # -f: the tree's own .gitignore files (CK's) do not apply
    sh("git", "commit", "-q", "-m", "kernel tree", cwd=src, env=GIT_ID)
    bare = where / "aiter-mirror.git"
    sh("git", "clone", "-q", "--bare", src, bare)
    shutil.rmtree(src)
    commit = sh("git", "-C", bare, "rev-parse", "HEAD").strip()
    env = {"GIT_CONFIG_COUNT": str(len(UPSTREAMS))}
    for i, url in enumerate(UPSTREAMS):
        env[f"GIT_CONFIG_KEY_{i}"] = f"url.file://{bare}.insteadOf"
        env[f"GIT_CONFIG_VALUE_{i}"] = url
    return Mirror(bare, commit, env)


def plain_checkout(where: Path) -> Path:
    """This qola as a plain checkout (no install) at ``where/3rdparty/QoLA``: the package and cmake/."""
    root = where / "3rdparty" / "QoLA"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(REPO / "qola", root / "qola", ignore=ignore)
    shutil.copytree(REPO / "cmake", root / "cmake", ignore=ignore)
    shutil.copy(REPO / "pyproject.toml", root / "pyproject.toml")
    return root


# Transformer Engine's ck_fused_attn/CMakeLists.txt, QoLA part, as TE runs it: `checkout` into
# <QoLA>/build/third_party/aiter, `build --arch "a;b" --skip-checkout` into <QoLA>/build, file(COPY) of
# lib/*.so and include/ into a cache dir, `-l:<file>` links, $ORIGIN rpath, install(FILES) of the .so.
TE_CMAKE = r"""cmake_minimum_required(VERSION 3.21)
project(te_like LANGUAGES C)
find_package(Python COMPONENTS Interpreter REQUIRED)
set(__QOLA_DIR "${QOLA_DIR}")
set(__QOLA_BUILD_DIR "${__QOLA_DIR}/build")
set(__AITER_SOURCE_DIR "${__QOLA_BUILD_DIR}/third_party/aiter")
set(__QOLA_MANIFEST "${QOLA_MANIFEST}")
execute_process(
  COMMAND ${CMAKE_COMMAND} -E env "PYTHONPATH=${__QOLA_DIR}:$ENV{PYTHONPATH}"
          ${Python_EXECUTABLE} -m qola.cli checkout
          --manifest ${__QOLA_MANIFEST}
          --aiter-root ${__AITER_SOURCE_DIR}
  RESULT_VARIABLE QOLA_CHECKOUT_RESULT)
if(NOT QOLA_CHECKOUT_RESULT EQUAL 0)
  message(FATAL_ERROR "[AITER-BUILD] QoLA checkout failed.")
endif()
list(JOIN ARCHS ";" V3_ASM_ARCHS_STR)
execute_process(
  COMMAND ${CMAKE_COMMAND} -E env "PYTHONPATH=${__QOLA_DIR}:$ENV{PYTHONPATH}"
          ${Python_EXECUTABLE} -m qola.cli build
          --manifest ${__QOLA_MANIFEST}
          --aiter-root ${__AITER_SOURCE_DIR}
          --output-dir ${__QOLA_BUILD_DIR}
          --arch "${V3_ASM_ARCHS_STR}"
          --skip-checkout ${QOLA_TEST_ARGS}
  RESULT_VARIABLE QOLA_BUILD_RESULT)
if(NOT QOLA_BUILD_RESULT EQUAL 0)
  message(FATAL_ERROR "[AITER-BUILD] QoLA build failed.")
endif()
set(__QOLA_CACHE_DIR "${CMAKE_BINARY_DIR}/aiter-prebuilts/rocm-7_aiter-pinned")
set(__QOLA_CACHE_LIB "${__QOLA_CACHE_DIR}/lib")
file(MAKE_DIRECTORY ${__QOLA_CACHE_LIB})
file(GLOB __QOLA_BUILT_LIBS "${__QOLA_BUILD_DIR}/lib/*.so")
file(COPY ${__QOLA_BUILT_LIBS} DESTINATION ${__QOLA_CACHE_LIB})
file(COPY "${__QOLA_BUILD_DIR}/include" DESTINATION "${__QOLA_CACHE_DIR}")
set(__AITER_MHA_PATH "${__QOLA_CACHE_LIB}")
set(__QOLA_INCLUDE_DIR "${__AITER_MHA_PATH}/../include")
if(NOT EXISTS "${__QOLA_INCLUDE_DIR}/qola_config.h")
  message(FATAL_ERROR "Could not find QoLA public headers at ${__QOLA_INCLUDE_DIR}.")
endif()
add_library(fused_attn SHARED fused_attn.c)
target_include_directories(fused_attn PRIVATE ${__QOLA_INCLUDE_DIR})
target_link_directories(fused_attn PUBLIC ${__AITER_MHA_PATH})
target_link_libraries(fused_attn PUBLIC -Wl,--no-as-needed ${QOLA_LINK})
set_target_properties(fused_attn PROPERTIES INSTALL_RPATH "$ORIGIN")
add_executable(app main.c)
target_link_libraries(app PRIVATE fused_attn)
set_target_properties(app PROPERTIES INSTALL_RPATH "$ORIGIN")
foreach(_f IN LISTS QOLA_LIB_FILES)
  install(FILES ${__AITER_MHA_PATH}/${_f} DESTINATION lib)
endforeach()
install(TARGETS fused_attn app DESTINATION lib)
"""

# A project that includes this qola's cmake/QoLA.cmake and calls qola_add_modules(), linking the
# group's libraries both ways: QoLA's variables (-l:<file>) and qola's imported targets.
ADD_MODULES_CMAKE = r"""cmake_minimum_required(VERSION 3.21)
project(add_modules LANGUAGES C)
include(${QOLA_DIR}/cmake/QoLA.cmake)
qola_add_modules(
  GROUP            ${QOLA_GROUP}
  MANIFEST         ${QOLA_MANIFEST}
  BUILD_DIR        ${QOLA_OUT}
  ARCHS            ${ARCHS}
  OUT_INCLUDE_DIR  QOLA_INC
  OUT_LIB_DIR      QOLA_LIBDIR
  OUT_LIBS         QOLA_LIBS
  OUT_CONFIG_DIR   QOLA_CFG
  OUT_AITER_DIR    QOLA_TREE
  OUT_TARGETS      QOLA_TARGETS)
file(WRITE "${CMAKE_BINARY_DIR}/qola-vars.txt"
     "include=${QOLA_INC}\nlib=${QOLA_LIBDIR}\nlibs=${QOLA_LIBS}\nconfigs=${QOLA_CFG}\n"
     "tree=${QOLA_TREE}\ntargets=${QOLA_TARGETS}\n")
set(_link)
foreach(_f IN LISTS QOLA_LIBS)
  list(APPEND _link "-l:${_f}")
endforeach()
add_executable(app_files main.c fused_attn.c)
target_include_directories(app_files PRIVATE ${QOLA_INC})
target_link_directories(app_files PRIVATE ${QOLA_LIBDIR})
target_link_libraries(app_files PRIVATE -Wl,--no-as-needed ${_link})
set_target_properties(app_files PROPERTIES BUILD_RPATH "${QOLA_LIBDIR}")
if(QOLA_TARGETS)
  add_executable(app_targets main.c fused_attn.c)
  target_link_libraries(app_targets PRIVATE ${QOLA_TARGETS})
endif()
"""


def cmake(
    src: Path,
    bld: Path,
    defs: dict[str, str],
    env: dict[str, str] | None = None,
    *,
    build: bool = True,
    cwd: Path | None = None,
) -> CompletedProcess[str]:
    """Configure (and build) ``src`` into ``bld`` (cmake started in ``cwd``); the configure's CompletedProcess."""
    defs = {"Python_EXECUTABLE": sys.executable, **defs}  # the interpreter running the tests runs qola
    argv = ["cmake", "-S", str(src), "-B", str(bld), *(f"-D{k}={v}" for k, v in defs.items())]
    full = {**os.environ, **(env or {})}
    cfg = subprocess.run(argv, capture_output=True, text=True, env=full, cwd=cwd)
    if build and cfg.returncode == 0:
        made = subprocess.run(["cmake", "--build", str(bld)], capture_output=True, text=True, env=full)
        assert made.returncode == 0, made.stdout + made.stderr
    return cfg


def project(where: Path, cmakelists: str, sources: dict[str, str]) -> Path:
    where.mkdir(parents=True)
    (where / "CMakeLists.txt").write_text(cmakelists)
    for name, text in sources.items():
        (where / name).write_text(text)
    return where


def read_vars(bld: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in (bld / "qola-vars.txt").read_text().splitlines())


def regular_tree(root: Path) -> list[str]:
    """Relative paths of everything under ``root``, asserting each is a real dir or regular file."""
    seen = []
    for path in sorted(root.rglob("*")):
        assert not path.is_symlink(), f"{path} is a symlink"
        assert path.is_dir() or path.is_file(), path
        seen.append(str(path.relative_to(root)))
    return seen


# the attention library of the example tree, narrowed to one generated instance
MANIFEST = """[qola]
aiter_commit = "{commit}"
namespace = "qk"

[build]
architectures = ["sm_90"]

[[modules]]
name = "libattn_fwd"
mode = "cpp_itfs"
group = "attn"

[[variants]]
module = "libattn_fwd"
pattern = "attn_fwd_d64_fp32_batch_*_nmask_nlse"
"""
