"""Helpers for the JIT tests (no tests here): a small library built by hand from stubs,
the generated table and the runtime, a caller program, and a counting fake compiler."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from subprocess import CompletedProcess
from typing import Any

import qola
from qola.jit import key as jkey
from qola.jit import layout

DATA = Path(qola.__file__).parent / "runtime"
NVCC = shutil.which("nvcc") or ("/usr/local/bin/nvcc" if os.path.exists("/usr/local/bin/nvcc") else None)
HIPCC = shutil.which("hipcc") or ("/usr/bin/hipcc" if os.path.exists("/usr/bin/hipcc") else None)
NS = "qt"

API_H = """#pragma once
#define HEADER_CONST 7
template <int N> struct Traits {};
template <typename T> int compute_(int x);
template <typename T> void store_(int* out, int x);
"""

UNIT = """#include "api.h"

template <>
int compute_<Traits<{n}>>(int x)
{{
    return x * 10 + HEADER_CONST + {n};
}}

template <>
void store_<Traits<{n}>>(int* out, int x)
{{
    *out = x + 1000 * {n};
}}
"""

DISPATCH = """#include "api.h"
extern "C" int qt_call(int n, int x)
{
    switch(n) {
    case 1: return compute_<Traits<1>>(x);
    case 2: return compute_<Traits<2>>(x);
    }
    return -100;
}
extern "C" int qt_store(int n, int x)
{
    int v = -1;
    if(n == 1) store_<Traits<1>>(&v, x);
    if(n == 2) store_<Traits<2>>(&v, x);
    return v;
}
"""

CALLER = r"""#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>
extern "C" int qt_call(int, int);
extern "C" int qt_store(int, int);
extern "C" const char* qt_qola_jit_last_error(void);
extern "C" int qt_qola_jit_last_status(void);
extern "C" int qt_qola_jit_prepare(const char*, const char*);
int main(int argc, char** argv)
{
    int n = atoi(argv[1]), x = atoi(argv[2]);
    const char* mode = argc > 3 ? argv[3] : "call";
    if(strcmp(mode, "threads") == 0) { // 16 threads, both units, all at once
        std::vector<int> got(16);
        std::vector<std::thread> ts;
        for(int i = 0; i < 16; ++i) ts.emplace_back([&got, i, x] { got[i] = qt_call(1 + i % 2, x); });
        for(auto& t : ts) t.join();
        for(int i = 0; i < 16; ++i) printf("%d ", got[i]);
        printf("\n");
        return 0;
    }
    if(strcmp(mode, "wait") == 0) { // unit n; then, after a line on stdin, unit 3 - n
        int r = qt_call(n, x);
        printf("first %d status %d\n", r, qt_qola_jit_last_status());
        fflush(stdout);
        char buf[8];
        if(!fgets(buf, sizeof buf, stdin)) return 4;
        r = qt_call(3 - n, x);
        int st = qt_qola_jit_last_status();
        printf("second %d status %d\n", r, st);
        if(st) fprintf(stderr, "error: %s\n", qt_qola_jit_last_error());
        return st ? 3 : 0;
    }
    if(strcmp(mode, "prepare") == 0) {
        printf("failed %d unknown %d\n", qt_qola_jit_prepare("tm", argv[4]), qt_qola_jit_prepare("nope", nullptr));
        return 0;
    }
    int r = strcmp(mode, "store") == 0 ? qt_store(n, x) : qt_call(n, x);
    int st = qt_qola_jit_last_status();
    printf("result %d status %d\n", r, st);
    if(st) fprintf(stderr, "error: %s\n", qt_qola_jit_last_error());
    return st ? 3 : 0;
}
"""

FAKE_CC = """#!/bin/sh
# counting fake compiler: --version is not counted; a compile appends its pid to {count}
if [ "$1" = "--version" ]; then exec {real} --version; fi
echo "$$" >> {count}
if [ -f {fail} ]; then echo "fake compiler error: boom" >&2; exit 1; fi
if [ -f {slow} ]; then sleep "$(cat {slow})"; fi
exec {real} "$@"
"""

CXXFLAGS = ["-std=c++17", "-O1", "-fPIC"]


def sh(argv: Sequence[object], **kw: Any) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([str(a) for a in argv], capture_output=True, text=True, **kw)
    if proc.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, argv))} failed:\n{proc.stdout}\n{proc.stderr}")
    return proc


def write_config(include: Path) -> None:
    include.mkdir(parents=True, exist_ok=True)
    (include / "qola_config.h").write_text(
        f'#define QOLA_NAMESPACE {NS}\n#define QOLA_NAMESPACE_STR "{NS}"\n#define QOLA_VERSION_STR "0"\n'
    )


def build_runtime(objdir: Path) -> list[Path]:
    """The runtime's objects for namespace qt (compiled once per session)."""
    write_config(objdir / "include")
    objs = []
    for src in layout.runtime_sources():
        obj = objdir / (src.stem + ".o")
        sh(
            [
                "g++",
                *CXXFLAGS,
                "-Wall",
                "-Werror",
                "-I",
                objdir / "include",
                "-I",
                DATA,
                "-I",
                DATA / "jit",
                "-c",
                src,
                "-o",
                obj,
            ]
        )
        objs.append(obj)
    return objs


def fake_compiler(root: Path, real: str = "g++") -> Path:
    cc = root / "fakecc"
    cc.write_text(FAKE_CC.format(real=real, count=root / "count", slow=root / "slow", fail=root / "fail"))
    cc.chmod(0o755)
    return cc


@dataclass
class TestLib:
    root: Path
    env: dict[str, str]
    compiler: Path
    caller: Path

    __test__ = False  # not a pytest class

    @property
    def cache(self) -> Path:
        return Path(self.env["QOLA_JIT_CACHE_DIR"])

    def compiles(self) -> int:
        try:
            return len((self.root / "count").read_text().split())
        except FileNotFoundError:
            return 0

    def run(
        self,
        n: int = 1,
        x: int = 5,
        *,
        extra: dict[str, Any] | None = None,
        store: bool = False,
        mode: tuple[Any, ...] = (),
    ) -> CompletedProcess[str]:
        env = {**self.env, **(extra or {})}
        argv = [str(self.caller), str(n), str(x)] + (["store"] if store else []) + list(mode)
        return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)

    def spawn(self, n: int = 1, x: int = 5, extra: dict[str, Any] | None = None) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [str(self.caller), str(n), str(x)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**self.env, **(extra or {})},
        )

    def entries(self) -> list[Path]:
        if not self.cache.exists():
            return []
        return sorted(p for p in self.cache.glob("*.so") if not p.name.startswith("."))


def expected(n: int, x: int) -> int:
    return x * 10 + 7 + n


def make_lib(
    root: Path,
    runtime: list[Path],
    *,
    lang: str = "cxx",
    real: str = "g++",
    archs: tuple[str, ...] = (),
    flags: tuple[str, ...] = ("-O1",),
    child_env: dict[str, str] | None = None,
    units: tuple[int, ...] = (1, 2),
    batch: int = 1,
) -> TestLib:
    """Sources -> OUT/jit + stubs + table -> lib/libqt.so + bin/caller. The JIT compiler is a
    wrapper around ``real`` that counts compiles (and sleeps/fails on request)."""
    root.mkdir(parents=True, exist_ok=True)
    src = root / "src"
    (src / "include").mkdir(parents=True, exist_ok=True)
    (src / "include" / "api.h").write_text(API_H)
    ext = ".cu" if lang == "cuda" else ".cpp"
    unit_files = []
    for n in units:
        p = src / f"unit_{n}{ext}"
        p.write_text(UNIT.format(n=n))
        unit_files.append((f"unit_{n}", p))
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(root / "home"),
        "QOLA_JIT_CACHE_DIR": str(root / "cache"),
        **(child_env or {}),
    }
    cc = fake_compiler(root, real)
    jc = jkey.probe_compiler(str(cc), env)
    spec = layout.JitModuleSpec(
        module="tm",
        lang=lang,
        arch=";".join(archs) or "host",
        compiler=jc,
        flags=(*layout.shared_object_flags(lang, archs), *flags),
        include_dirs=(src / "include",),
        style="generic",
    )
    out = layout.write_jit_module(spec, unit_files, out_jit=root / "out" / "jit", stub_dir=root / "build", batch=batch)
    caller = _link(root, src, out, runtime)
    return TestLib(root=root, env=env, compiler=cc, caller=caller)


def _link(root: Path, src: Path, out: layout.JitModuleOutput, runtime: list[Path]) -> Path:
    """lib/libqt.so from the stubs, the table and the dispatcher; bin/caller linked against it."""
    write_config(root / "build" / "include")
    (root / "build" / "dispatch.cpp").write_text(DISPATCH)
    (root / "out" / "lib").mkdir(parents=True, exist_ok=True)
    (root / "out" / "bin").mkdir(parents=True, exist_ok=True)
    lib = root / "out" / "lib" / f"lib{NS}.so"
    incs = ["-I", root / "build" / "include", "-I", DATA, "-I", DATA / "jit", "-I", src / "include"]
    sh(
        [
            "g++",
            *CXXFLAGS,
            "-shared",
            *incs,
            "-x",
            "c++",
            *out.stub_sources,
            out.table_source,
            root / "build" / "dispatch.cpp",
            "-x",
            "none",
            *runtime,
            "-o",
            lib,
            "-ldl",
            "-pthread",
        ]
    )
    caller = root / "out" / "bin" / "caller"
    (root / "build" / "caller.cpp").write_text(CALLER)
    sh(
        [
            "g++",
            "-O1",
            root / "build" / "caller.cpp",
            "-L",
            lib.parent,
            f"-l{NS}",
            f"-Wl,-rpath,{lib.parent}",
            "-pthread",
            "-o",
            caller,
        ]
    )
    return caller


def remove(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def counting_nvcc(tmp_path: Path) -> tuple[Path, Path]:
    """(a wrapper of nvcc that logs one line per compile to the count file, that count file)."""
    count = tmp_path / "count"
    cc = tmp_path / "countcc"
    cc.write_text(
        f'#!/bin/sh\nif [ "$1" = "--version" ]; then exec {NVCC} --version; fi\n'
        f'echo "$$" >> {count}\nexec {NVCC} "$@"\n'
    )
    cc.chmod(0o755)
    return cc, count
