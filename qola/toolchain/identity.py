"""What decides the compilers' output besides their command lines — in one place.

* :data:`COMPILER_ENV`: every environment variable nvcc, hipcc, clang, gcc and ld read that can
  change an object or a library (researched from nvcc's ``nvcc.profile`` variables and its
  ``NVCC_*`` variables, hipcc's Perl driver, clang's and gcc's documented variables, GNU ld);
* :data:`TOOLCHAIN_ENV`: what qola itself reads to find and configure the toolchain;
* :data:`PATH_TOOLS`: programs the drivers run by name from ``PATH`` (nvcc's host gcc/g++, the
  assembler and linker).

:func:`stamp_text` turns them, with the compiler's identity (path, ``--version`` output, the
resolved file's size and mtime), into the content of the build graph's toolchain stamp: every
compile and link depends on that file, and it is rewritten only when its content changes, so
replacing a compiler in place or changing ``NVCC_APPEND_FLAGS`` rebuilds what it affects. The no-op
fast path (:mod:`qola.store.fastpath`) digests the same variables.

Standard library only, nothing at import time.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

NVCC_ENV = (
    "NVCC_PREPEND_FLAGS", "NVCC_APPEND_FLAGS", "NVCC_CCBIN",
    # nvcc.profile variables, taken from the environment and extended by the profile
    "INCLUDES", "SYSTEM_INCLUDES", "LIBRARIES", "CICC_PATH", "NVVMIR_LIBRARY_DIR", "CUDAFE_FLAGS",
    "PTXAS_FLAGS", "NVLINK_FLAGS", "NVVM_FLAGS", "LLVMC_FLAGS", "OCG_FLAGS", "NVASM_FLAGS", "_NVVM_BRANCH_",
    "NV_NVVM_VERSION",
)  # fmt: skip
HIPCC_ENV = (
    "HIPCC_COMPILE_FLAGS_APPEND", "HIPCC_LINK_FLAGS_APPEND", "HIP_PATH", "ROCM_PATH", "ROCM_HOME",
    "HIP_PLATFORM", "HIP_COMPILER", "HIP_RUNTIME", "HIP_CLANG_PATH", "HIP_ROCCLR_HOME", "HIP_LIB_PATH",
    "HIP_INCLUDE_PATH", "HSA_PATH", "DEVICE_LIB_PATH", "HIP_DEVICE_LIB_PATH", "HIP_CLANG_HCC_COMPAT_MODE",
    "HIP_COMPILE_CXX_AS_HIP", "HCC_AMDGPU_TARGET", "HCC_EXTRA_LIBRARIES", "HIP_USE_PERL_SCRIPTS",
    "HIPCC_USE_PERL_SCRIPT", "CUDA_PATH",
)  # fmt: skip
CLANG_ENV = ("CCC_OVERRIDE_OPTIONS", "CLANG_NO_DEFAULT_CONFIG", "OBJCPLUS_INCLUDE_PATH")
GCC_ENV = (
    "CPATH", "C_INCLUDE_PATH", "CPLUS_INCLUDE_PATH", "OBJC_INCLUDE_PATH", "LIBRARY_PATH", "COMPILER_PATH",
    "GCC_EXEC_PREFIX", "SOURCE_DATE_EPOCH",
)  # fmt: skip
LINKER_ENV = ("LD_RUN_PATH", "GNUTARGET", "LDEMULATION")
# Read but left out on purpose (they change messages or side files, not what is built; tracking them
# would turn a changed terminal into a full rebuild): HIPCC_VERBOSE, DEPENDENCIES_OUTPUT,
# SUNPRO_DEPENDENCIES, GCC_COMPARE_DEBUG, TMPDIR, LANG/LC_* (GCC's input charset defaults to UTF-8),
# LD_LIBRARY_PATH (where ld looks for a library's own dependencies), launcher settings (CCACHE_*,
# SCCACHE_*). Which programs PATH finds is covered by PATH_TOOLS and the compiler's identity.
COMPILER_ENV: tuple[str, ...] = tuple(sorted(set(NVCC_ENV + HIPCC_ENV + CLANG_ENV + GCC_ENV + LINKER_ENV)))

TOOLCHAIN_ENV = (
    "PATH",
    "CUDACXX",
    "CUDA_HOME",
    "CUDA_PATH",
    "CUDAHOSTCXX",
    "HIPCC",
    "ROCM_HOME",
    "ROCM_PATH",
    "HIP_PATH",
    "CXX",
    "CC",
    "AITER_FP4x2",
    "QOLA_JIT_COMPILER",
)
PATH_TOOLS = ("gcc", "g++", "cc", "c++", "clang", "clang++", "as", "ld", "ld.bfd", "ld.gold", "ld.lld")

STAMP = "toolchain.id"  # in the build dir: every compile and link edge depends on it
FORMAT = 1


def compiler_env(env: Mapping[str, str]) -> dict[str, str]:
    """The :data:`COMPILER_ENV` variables set in ``env``."""
    return {k: env[k] for k in COMPILER_ENV if k in env}


def file_id(path: str | None) -> list[Any] | None:
    """[resolved path, size, mtime_ns] of ``path`` (None when absent)."""
    if not path:
        return None
    real = os.path.realpath(path)
    try:
        st = os.stat(real)
    except OSError:
        return [real, None]
    return [real, st.st_size, st.st_mtime_ns]


def stamp_text(tc: Any, env: Mapping[str, str]) -> str:
    """The toolchain stamp for ``tc`` (a :class:`~qola.toolchain.Toolchain`) run under ``env``
    (the compilers' environment: the caller's plus ``tc.child_env``)."""
    path = env.get("PATH", os.defpath)
    data = {
        "format": FORMAT,
        "compiler": tc.compiler,
        "identity": tc.identity,
        "version_output": tc.version_output,
        "compiler_file": file_id(tc.compiler),
        "host_cxx": tc.host_cxx,
        "host_cxx_file": file_id(tc.host_cxx),
        "path_tools": {t: file_id(shutil.which(t, path=path)) for t in PATH_TOOLS},
        "env": compiler_env(env),
    }
    return json.dumps(data, indent=1, sort_keys=True) + "\n"


def write_stamp(build_dir: Path, text: str) -> Path:
    """Write the stamp into ``build_dir`` unless it already says ``text`` (its mtime then stays)."""
    from qola.core.fsutil import write_if_changed  # lazy: this module is on the no-op path

    return write_if_changed(build_dir / STAMP, text)
