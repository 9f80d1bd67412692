"""Helpers shared by test files (first written in test_isolation.py)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import qola
from qola.compile import link
from qola.core.fsutil import write_if_changed
from qola.output import consumers

RUNTIME = Path(qola.__file__).parent / "runtime"  # the package's data, wherever link.py lies


DEMO_CPP = r"""
#include <map>
#include <vector>
#include "qola_common.h"
#include "qola_demo.h"
int internal_helper();                        // helper.cpp: same name in every copy
inline __attribute__((noinline)) int inline_fn() { return VALUE * 100; }  // COMDAT, weak
inline int inline_static() { static int base = VALUE * 10; return base; } // g++: GNU unique
#ifdef PLANT_LEAK
__attribute__((visibility("default"))) int leaky_helper() { return 42; }
#endif
QOLA_NS_BEGIN
int get_value() { std::vector<int> v; v.push_back(internal_helper()); std::map<int, int> m; m[v[0]] = v[0]; return m[v[0]]; }
Shape::~Shape() {}
int Shape::sides() const { return 3; }
template <class T> T twice(T x) { return x + x; }
template int twice<int>(int);
QOLA_NS_END
QOLA_DEFINE_VERSION()
QOLA_C_API int QOLA_C_NAME(demo_get_value)(void) { return QOLA_NS(get_value)(); }
QOLA_C_API int QOLA_C_NAME(demo_get_inline)(void) { return inline_fn() + inline_static(); }
"""


HELPER_CPP = "__attribute__((noinline)) int internal_helper() { return VALUE; }\n"


DEMO_H = r"""#pragma once
#include "qola_common.h"
#ifdef __cplusplus
QOLA_NS_BEGIN
int get_value();
struct Shape { virtual ~Shape(); virtual int sides() const; };
template <class T> T twice(T x);
QOLA_NS_END
#endif
QOLA_C_API int QOLA_C_NAME(demo_get_value)(void);
QOLA_C_API int QOLA_C_NAME(demo_get_inline)(void);
"""


def sh(*cmd: object, cwd: Path | None = None) -> str:
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, cwd=cwd)
    assert proc.returncode == 0, f"{cmd} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def write_includes(inc: Path, ns: str, version: str = "1.2.3") -> Path:
    inc.mkdir(parents=True, exist_ok=True)
    shutil.copy(RUNTIME / "qola_common.h", inc / "qola_common.h")
    (inc / "qola_config.h").write_text(consumers.render_config_header(ns, version))
    (inc / "qola_demo.h").write_text(DEMO_H)
    return inc


def build_objects(root: Path, ns: str, value: int, leak: bool = False) -> list[Path]:
    """Compile the demo module for namespace ``ns`` (in a directory with a space in its name)."""
    d = root / f"obj {ns}{value}{'-leak' if leak else ''}"
    inc = write_includes(d / "include", ns)
    (d / "demo.cpp").write_text(DEMO_CPP)
    (d / "helper.cpp").write_text(HELPER_CPP)
    objs = []
    for src in ("demo.cpp", "helper.cpp"):
        obj = d / src.replace(".cpp", ".o")
        sh(
            "g++",
            "-std=c++17",
            "-O2",
            "-fPIC",
            f"-DVALUE={value}",
            *(["-DPLANT_LEAK"] if leak else []),
            f"-I{inc}",
            "-c",
            d / src,
            "-o",
            obj,
        )
        objs.append(obj)
    return objs


def link_shared(objs: list[Path], out: Path, ns: str, isolate: bool = True, script: str | None = None) -> Path:
    work = out.parent / (out.name + ".work")
    rsp = write_if_changed(work / "objs.rsp", link.rsp_text(objs))
    vs = None
    if isolate:
        vs = write_if_changed(work / "exports.map", script or link.version_script(ns))
    out.parent.mkdir(parents=True, exist_ok=True)
    link.run_step(link.shared_link_argv("g++", rsp, out, link.library_ldflags(vs, out.name)))
    return out
