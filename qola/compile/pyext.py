"""Compile and link flags for Python extension modules: pybind11, and torch when a module needs it."""

from __future__ import annotations

import json
import os
import sys
import sysconfig
from dataclasses import dataclass
from functools import lru_cache

from qola.core import proc
from qola.core.errors import FailedProcessError, QolaError


@dataclass(frozen=True)
class ExtFlags:
    cflags: tuple[str, ...]
    ldflags: tuple[str, ...]


def python_headers() -> str:
    """The directory of this interpreter's ``Python.h`` (a pybind module includes it); QolaError
    naming the package that provides it when it is not installed."""
    include = sysconfig.get_paths()["include"]
    if not os.path.isfile(os.path.join(include, "Python.h")):
        ver = f"{sys.version_info[0]}.{sys.version_info[1]}"
        raise QolaError(
            f"Python {ver}'s headers are not installed ({include}/Python.h is missing): pybind modules cannot compile",
            hint=f"install them (Debian/Ubuntu: apt-get install python{ver}-dev; Fedora: dnf install python3-devel)",
        )
    return include


def pybind11_flags(md_name: str, table_md_name: str = "") -> ExtFlags:
    """``md_name`` is the namespaced module name (``<ns>_<table_md_name>``): sources name their module
    ``TORCH_EXTENSION_NAME``, or (AITER's aiter_enum_pybind.cu) spell the table's md_name itself, which
    AITER's own build makes the module name; the macro maps that spelling to the namespaced name too."""
    import pybind11  # lazy: only needed when a Python module is built

    includes = [pybind11.get_include(), sysconfig.get_paths()["include"]]
    defines = [f"-DTORCH_EXTENSION_NAME={md_name}", "-DPYBIND11_DETAILED_ERROR_MESSAGES"]
    if table_md_name and table_md_name != md_name:
        defines.append(f"-D{table_md_name}={md_name}")
    return ExtFlags(tuple(f"-I{i}" for i in includes) + tuple(defines), ())


_TORCH_PROBE = r"""
import json, os, torch
from torch.utils import cpp_extension as c
print(json.dumps({"include": c.include_paths(), "lib": os.path.join(os.path.dirname(torch.__file__), "lib"),
                  "abi": int(torch._C._GLIBCXX_USE_CXX11_ABI), "hip": torch.version.hip, "cuda": torch.version.cuda}))
"""


@lru_cache(maxsize=4)
def torch_flags(kind: str, python: str = sys.executable) -> ExtFlags:
    """Flags for a torch extension, found by asking torch in a child process (never imported here)."""
    hint = 'install PyTorch in this Python, set torch_exclude = true for the module, or use mode = "cpp_itfs"'
    try:
        out = proc.run_checked([python, "-c", _TORCH_PROBE], out=proc.SEPARATE, timeout=300, hint=hint)
    except FailedProcessError as exc:
        if exc.returncode in (124, 127):  # could not run the interpreter, or it hung
            raise
        raise QolaError(
            "this module is a torch extension (torch_exclude is false) but torch is not importable"
            + (f" ({exc.output.strip().splitlines()[-1]})" if exc.output.strip() else ""),
            hint=hint,
        ) from None
    info = json.loads(out.stdout.strip().splitlines()[-1])
    cflags = [f"-I{p}" for p in info["include"]] + [
        "-DTORCH_API_INCLUDE_EXTENSION_H",
        f"-D_GLIBCXX_USE_CXX11_ABI={info['abi']}",
    ]
    gpu_libs = ["-lc10_hip", "-ltorch_hip"] if kind == "hip" else ["-lc10_cuda", "-ltorch_cuda"]
    ldflags = [
        f"-L{info['lib']}",
        f"-Wl,-rpath,{info['lib']}",
        "-lc10",
        "-ltorch",
        "-ltorch_cpu",
        "-ltorch_python",
        *gpu_libs,
    ]
    return ExtFlags(tuple(cflags), tuple(ldflags))
