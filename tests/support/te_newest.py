"""A test double of Transformer Engine's newest ROCm CMake (``ck_fused_attn/CMakeLists.txt`` and
``aiter_prebuilt.cmake`` at ROCm/TransformerEngine 0641f0c5, the manifests at 1e2a5e9d), acting as it
does, in its order:

1. the tree: ``$NVTE_AITER_SOURCE_DIR`` (then no checkout), else ``<QoLA>/build/third_party/aiter``
   brought to the manifest's pin by ``sh -c "PYTHONPATH=<QoLA>:… python -m qola.cli checkout
   --manifest M --aiter-root <tree>"``; the pin read from the manifest's one ``aiter_commit`` line
   (more or fewer: fatal);
2. the CK-full archs: the asked ones less the CK-free tier's arch (``V3_ARCH``: TE's ``gfx1250``),
   joined with ``;`` into ``GPU_ARCHS_STR``;
3. CK_JIT is on unless ``$NVTE_CK_JIT`` is ``0``. Off: the prebuilt cache ``rocm-<ver>_aiter-<sha>``
   (valid when every library of ``QOLA_LIB_FILES`` is there) is taken, else ``qola.cli build …
   --arch "${GPU_ARCHS_STR}" --skip-checkout`` into ``<QoLA>/build``, whose ``lib/*.so`` and
   ``include/`` are copied into the cache. On: no prebuilt lookup at all; ``ck_jit_build.py full
   --with-qola …`` (``CK_JIT_BUILD``) builds;
4. the CK-free tier, when ``V3_ARCH`` was asked: its own manifest (its own pin) into
   ``<QoLA>/build_gfx1250``, ``--arch V3_ARCH``, ``--skip-checkout`` only with ``NVTE_AITER_SOURCE_DIR``;
5. configure fails unless ``<include>/qola_config.h`` exists; the libraries linked ``-l:<file>``.

Every ``execute_process`` that fails is fatal, as in TE. ``V3_ARCH`` and ``QOLA_LIB_FILES`` stand for
what TE hard-codes (``gfx1250``; ``te_libmha_fwd.so``, ``te_libmha_bwd.so``) so that a CUDA fixture
tree can stand for AITER."""

from __future__ import annotations

CMAKE = r"""cmake_minimum_required(VERSION 3.21)
project(te_newest LANGUAGES C)
find_package(Python COMPONENTS Interpreter REQUIRED)
set(__QOLA_DIR "${QOLA_DIR}")
set(__QOLA_MANIFEST "${QOLA_MANIFEST}")
# aiter_prebuilt.cmake: the pin, from the manifest's one aiter_commit line
file(STRINGS "${__QOLA_MANIFEST}" __PIN_LINES REGEX "^aiter_commit[ ]*=")
list(LENGTH __PIN_LINES __PIN_COUNT)
if(NOT __PIN_COUNT EQUAL 1)
  message(FATAL_ERROR "[AITER-BUILD] expected one aiter_commit line in ${__QOLA_MANIFEST}")
endif()
string(REGEX REPLACE "^aiter_commit[ ]*=[ ]*\"([0-9a-fA-F]+)\".*" "\\1" __AITER_SHA "${__PIN_LINES}")
if(DEFINED ENV{NVTE_AITER_SOURCE_DIR})
  set(__AITER_SOURCE_DIR "$ENV{NVTE_AITER_SOURCE_DIR}")
  set(__SKIP_AITER_CHECKOUT ON)
else()
  set(__AITER_SOURCE_DIR "${__QOLA_DIR}/build/third_party/aiter")
  set(__SKIP_AITER_CHECKOUT OFF)
  execute_process(
    COMMAND sh -c "PYTHONPATH='${__QOLA_DIR}':$PYTHONPATH '${Python_EXECUTABLE}' -m qola.cli checkout --manifest '${__QOLA_MANIFEST}' --aiter-root '${__AITER_SOURCE_DIR}'"
    RESULT_VARIABLE __RC)
  if(NOT __RC EQUAL 0)
    message(FATAL_ERROR "[AITER-BUILD] QoLA checkout failed.")
  endif()
endif()
set(__CK_FULL_ARCHS ${ARCHS})
list(FIND __CK_FULL_ARCHS "${V3_ARCH}" __V3_IDX)
set(__HAS_V3 OFF)
if(NOT __V3_IDX EQUAL -1)
  set(__HAS_V3 ON)
  list(REMOVE_ITEM __CK_FULL_ARCHS "${V3_ARCH}")
endif()
list(JOIN __CK_FULL_ARCHS ";" GPU_ARCHS_STR)
if(NOT "$ENV{NVTE_CK_JIT}" STREQUAL "0")
  set(__USE_CK_JIT ON)
else()
  set(__USE_CK_JIT OFF)
endif()
set(__QOLA_CACHE_DIR "${CMAKE_BINARY_DIR}/aiter-prebuilts/rocm-7_aiter-${__AITER_SHA}")
set(__AITER_MHA_PATH "")
if(NOT __USE_CK_JIT)
  set(__HIT ON)
  foreach(_f IN LISTS QOLA_LIB_FILES)
    if(NOT EXISTS "${__QOLA_CACHE_DIR}/lib/${_f}")
      set(__HIT OFF)
    endif()
  endforeach()
  if(__HIT)
    message(STATUS "[AITER-BUILD] Using prebuilt AITER kernels at ${__QOLA_CACHE_DIR}")
    set(__AITER_MHA_PATH "${__QOLA_CACHE_DIR}/lib")
  endif()
endif()
if(__AITER_MHA_PATH STREQUAL "" AND NOT GPU_ARCHS_STR STREQUAL "")
  if(__USE_CK_JIT)
    message(STATUS "[AITER-BUILD] CK_JIT is enabled; will build CK kernels via CK_JIT.")
    set(__QOLA_BUILD_DIR "${CMAKE_BINARY_DIR}/ck_jit/qola")
    execute_process(
      COMMAND ${Python_EXECUTABLE} "${CK_JIT_BUILD}" full --with-qola --qola-dir ${__QOLA_DIR}
              --qola-manifest ${__QOLA_MANIFEST} --qola-output "${__QOLA_BUILD_DIR}"
              --gpu-archs "${GPU_ARCHS_STR}" --aiter-dir ${__AITER_SOURCE_DIR}
              --tmp-dir "${CMAKE_BINARY_DIR}/ck_jit" --install-dir "${CMAKE_BINARY_DIR}/te_lib"
              --jit-name "te_ck_jit"
      RESULT_VARIABLE __RC)
    if(NOT __RC EQUAL 0)
      message(FATAL_ERROR "[AITER-BUILD] QoLA build failed.")
    endif()
    set(__AITER_MHA_PATH "${CMAKE_BINARY_DIR}/te_lib")
    set(__QOLA_INCLUDE_DIR "${__QOLA_BUILD_DIR}/include")
  else()
    set(__QOLA_BUILD_DIR "${__QOLA_DIR}/build")
    execute_process(
      COMMAND ${CMAKE_COMMAND} -E env "PYTHONPATH=${__QOLA_DIR}:$ENV{PYTHONPATH}"
              ${Python_EXECUTABLE} -m qola.cli build
              --manifest ${__QOLA_MANIFEST}
              --aiter-root ${__AITER_SOURCE_DIR}
              --output-dir ${__QOLA_BUILD_DIR}
              --arch "${GPU_ARCHS_STR}"
              --skip-checkout ${QOLA_TEST_ARGS}
      RESULT_VARIABLE __RC)
    if(NOT __RC EQUAL 0)
      message(FATAL_ERROR "[AITER-BUILD] QoLA build failed.")
    endif()
    file(MAKE_DIRECTORY "${__QOLA_CACHE_DIR}/lib")
    file(GLOB __QOLA_BUILT_LIBS "${__QOLA_BUILD_DIR}/lib/*.so")
    file(COPY ${__QOLA_BUILT_LIBS} DESTINATION "${__QOLA_CACHE_DIR}/lib")
    file(COPY "${__QOLA_BUILD_DIR}/include" DESTINATION "${__QOLA_CACHE_DIR}")
    set(__AITER_MHA_PATH "${__QOLA_CACHE_DIR}/lib")
  endif()
endif()
if(__HAS_V3)
  if(__SKIP_AITER_CHECKOUT)
    set(__SKIP_CHECKOUT_ARGS "--skip-checkout")
  else()
    set(__SKIP_CHECKOUT_ARGS "")
  endif()
  set(__QOLA_BUILD_DIR_V3 "${__QOLA_DIR}/build_gfx1250")
  execute_process(
    COMMAND ${CMAKE_COMMAND} -E env "PYTHONPATH=${__QOLA_DIR}:$ENV{PYTHONPATH}"
            ${Python_EXECUTABLE} -m qola.cli build
            --manifest ${QOLA_MANIFEST_V3}
            --aiter-root ${__AITER_SOURCE_DIR}
            --output-dir ${__QOLA_BUILD_DIR_V3}
            --arch "${V3_ARCH}"
            ${__SKIP_CHECKOUT_ARGS} ${QOLA_TEST_ARGS}
    RESULT_VARIABLE __RC)
  if(NOT __RC EQUAL 0)
    message(FATAL_ERROR "[AITER-BUILD] QoLA gfx1250 V3 build failed.")
  endif()
endif()
if(NOT DEFINED __QOLA_INCLUDE_DIR)
  set(__QOLA_INCLUDE_DIR "${__AITER_MHA_PATH}/../include")
endif()
if(NOT EXISTS "${__QOLA_INCLUDE_DIR}/qola_config.h")
  message(FATAL_ERROR "Could not find QoLA public headers at ${__QOLA_INCLUDE_DIR}.")
endif()
file(WRITE "${CMAKE_BINARY_DIR}/te-vars.txt" "lib=${__AITER_MHA_PATH}\ninclude=${__QOLA_INCLUDE_DIR}\n")
"""

# ck_jit_build.py's command line as TE calls it, and what it does with qola: ``qola.cli build`` from
# the QoLA checkout (cwd, no PYTHONPATH) with --skip-checkout, then the libraries into --install-dir
# (the interceptor and the kernel records are tests/support/ckjit_fake.py's business, not this one's)
CK_JIT_BUILD = r"""import argparse, glob, os, shutil, subprocess, sys
p = argparse.ArgumentParser()
p.add_argument("mode", choices=["full"])
p.add_argument("--with-qola", action="store_true")
for o in ("--qola-dir", "--qola-manifest", "--qola-output", "--gpu-archs", "--aiter-dir", "--tmp-dir",
          "--install-dir", "--jit-name"):
    p.add_argument(o, required=True)
a = p.parse_args()
env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
rc = subprocess.call([sys.executable, "-m", "qola.cli", "build", "--manifest", a.qola_manifest, "--aiter-root",
                      a.aiter_dir, "--output-dir", a.qola_output, "--arch", a.gpu_archs, "--skip-checkout"],
                     cwd=a.qola_dir, env=env)
if rc:
    sys.exit(rc)
os.makedirs(a.install_dir, exist_ok=True)
for so in glob.glob(os.path.join(a.qola_output, "lib", "*.so")):
    shutil.copy(so, a.install_dir)
"""
