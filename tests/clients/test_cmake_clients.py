"""qola's CMake clients replayed on the example tree (nvcc, two sm archs; no GPU): Transformer Engine's
call form (``checkout`` from a git mirror, ``build --arch "a;b" --skip-checkout``, ``file(COPY)``,
``-l:<file>``), QoLA's ``cmake/QoLA.cmake`` API (``qola_add_modules()``, ``qola_checkout_aiter()`` +
``qola_build_modules()``) and its ``QOLA_PREBUILT_DIR_<GROUP>`` lookup, both a finished output and a
store of build-key archives. The real AITER tree: test_rocm_cmake_clients.py."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from support.cmake_clients import (
    ADD_MODULES_CMAKE,
    MANIFEST,
    TE_CMAKE,
    Mirror,
    cmake,
    mirror_tree,
    plain_checkout,
    project,
    read_vars,
    regular_tree,
)
from support.common import KERNELS, REPO, run_qola

pytestmark = [
    pytest.mark.skipif(not shutil.which("cmake"), reason="needs cmake"),
    pytest.mark.skipif(not shutil.which("nvcc"), reason="needs nvcc (the example tree for CUDA)"),
]

ARCHS = "sm_80;sm_90"  # the manifest says sm_90: the result proves the ;-list reached the build
NS, GROUP, LIB = "qk", "attn", "qk_libattn_fwd.so"
BUILD_ARGS = "-j;2"


# what TE's ck_fused_attn does with the library: call its C API (no GPU needed for these answers)
FUSED_ATTN_C = r"""
#include <stdio.h>
#include <string.h>
#include "qola_attn_fwd.h"
int fused_attn_probe(char* buf, size_t n) {
    qola_attn_fwd_params p;
    memset(&p, 0, sizeof p);
    p.batch = 1; p.seqlen_q = p.seqlen_k = 8; p.nhead_q = p.nhead_k = 1; p.hdim = 64; p.scale = 1.0f;
    p.dtype = "fp8";  /* no such instance: -1 */
    return snprintf(buf, n, "%s %s %d %d", QOLA_NAMESPACE_STR, QOLA_C_NAME(qola_version)(),
                    QOLA_C_NAME(libattn_fwd_attn_fwd)(NULL), QOLA_C_NAME(libattn_fwd_attn_fwd)(&p));
}
"""
MAIN_C = r"""
#include <stdio.h>
#include <stddef.h>
int fused_attn_probe(char* buf, size_t n);
int main(void) { char buf[256]; fused_attn_probe(buf, sizeof buf); puts(buf); return 0; }
"""
SOURCES = {"fused_attn.c": FUSED_ATTN_C, "main.c": MAIN_C}


def ran(exe: Path) -> list[str]:
    """The program's words: namespace, qola's version, -2 (bad arguments), -1 (no such instance)."""
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split()
    assert out[0] == NS and out[2:] == ["-2", "-1"], out
    return out


@pytest.fixture(scope="module")
def mirror(tmp_path_factory: pytest.TempPathFactory) -> Mirror:
    built = tuple(f"hsa/{d.name}" for d in (KERNELS / "hsa").iterdir() if d.is_dir())  # build_hsa.py's output
    return mirror_tree(KERNELS, tmp_path_factory.mktemp("mirror"), skip=built)


@pytest.fixture(scope="module")
def manifest(mirror: Mirror, tmp_path_factory: pytest.TempPathFactory) -> Path:
    m = tmp_path_factory.mktemp("manifest") / "qola_manifest.toml"
    m.write_text(MANIFEST.format(commit=mirror.commit))
    return m


def test_transformer_engine_call_form(mirror: Mirror, manifest: Path, tmp_path: Path) -> None:
    """TE's CMakeLists.txt as TE runs it, against a plain qola checkout at 3rdparty/QoLA."""
    qola_dir = plain_checkout(tmp_path)
    src = project(tmp_path / "te", TE_CMAKE, SOURCES)
    defs = {
        "QOLA_DIR": str(qola_dir),
        "QOLA_MANIFEST": str(manifest),
        "ARCHS": ARCHS,
        "QOLA_TEST_ARGS": BUILD_ARGS,
        "QOLA_LINK": f"-l:{LIB}",
        "QOLA_LIB_FILES": LIB,
        "CMAKE_INSTALL_PREFIX": str(tmp_path / "prefix"),
    }
    cfg = cmake(src, tmp_path / "bld", defs, mirror.env)
    assert cfg.returncode == 0, cfg.stdout + cfg.stderr

    tree, out = qola_dir / "build" / "third_party" / "aiter", qola_dir / "build"
    assert (
        subprocess.run(
            ["git", "-C", str(tree), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        == mirror.commit
    )  # cloned from the mirror, pinned commit
    data = json.loads((out / "manifest.json").read_text())
    assert data["archs"] == ["sm_80", "sm_90"]
    assert [m["name"] for m in data["modules"] if m["status"] == "built"] == ["libattn_fwd"]

    # file(COPY) gave real files equal to the output's
    cache = tmp_path / "bld" / "aiter-prebuilts" / "rocm-7_aiter-pinned"
    files = regular_tree(cache)
    assert {"include/qola_config.h", "include/qola_common.h", "include/qola_attn_fwd.h", f"lib/{LIB}"} <= set(files)
    assert (cache / "lib" / LIB).read_bytes() == (out / "lib" / LIB).read_bytes()
    assert (cache / "include" / "qola_config.h").read_text() == (out / "include" / "qola_config.h").read_text()

    ran(tmp_path / "bld" / "app")
    subprocess.run(["cmake", "--install", str(tmp_path / "bld")], capture_output=True, check=True)
    prefix_lib = tmp_path / "prefix" / "lib"
    assert ran(prefix_lib / "app")  # $ORIGIN: the installed copy of the library, next to it
    needed = subprocess.run(
        ["readelf", "-d", str(prefix_lib / "libfused_attn.so")], capture_output=True, text=True, check=True
    ).stdout
    assert f"[{LIB}]" in needed  # -l:<file> and the soname: DT_NEEDED is the bare file name

    # a second configure (TE reconfigures): the checkout is kept, the build is a no-op, same bytes
    before = (out / "lib" / LIB).read_bytes()
    cfg = cmake(src, tmp_path / "bld", defs, mirror.env)
    assert cfg.returncode == 0, cfg.stdout + cfg.stderr
    assert (out / "lib" / LIB).read_bytes() == before


def test_qola_add_modules(mirror: Mirror, manifest: Path, tmp_path: Path) -> None:
    """QoLA's qola_add_modules(): checkout into <BUILD_DIR>/third_party/aiter, build the group, results
    in QoLA's OUT_* variables (and qola's OUT_TARGETS); both link forms give a working program."""
    src = project(tmp_path / "proj", ADD_MODULES_CMAKE, SOURCES)
    out = tmp_path / "bld" / "qola"
    defs = {
        "QOLA_DIR": str(REPO),
        "QOLA_MANIFEST": str(manifest),
        "QOLA_OUT": str(out),
        "QOLA_GROUP": GROUP,
        "ARCHS": ARCHS,
        "QOLA_BUILD_ARGS": BUILD_ARGS,
    }
    cfg = cmake(src, tmp_path / "bld", defs, mirror.env)
    assert cfg.returncode == 0, cfg.stdout + cfg.stderr
    got = read_vars(tmp_path / "bld")
    assert got == {
        "include": f"{out}/include",
        "lib": f"{out}/lib",
        "libs": LIB,
        "configs": f"{out}/configs",
        "tree": f"{out}/third_party/aiter",
        "targets": f"qola::{NS}::libattn_fwd",
    }
    assert json.loads((out / "manifest.json").read_text())["archs"] == ["sm_80", "sm_90"]
    ran(tmp_path / "bld" / "app_files")
    ran(tmp_path / "bld" / "app_targets")

    # QOLA_PREBUILT_DIR_<GROUP> = that finished output: another project links it, builds nothing
    other = project(tmp_path / "proj2", ADD_MODULES_CMAKE, SOURCES)
    defs2 = {**defs, "QOLA_OUT": str(tmp_path / "never")}
    cfg = cmake(other, tmp_path / "bld2", defs2, {**mirror.env, "QOLA_PREBUILT_DIR_ATTN": str(out)})
    assert cfg.returncode == 0, cfg.stdout + cfg.stderr
    assert not (tmp_path / "never").exists()  # no checkout, no build
    got = read_vars(tmp_path / "bld2")
    assert (got["include"], got["lib"], got["libs"]) == (f"{out}/include", f"{out}/lib", LIB)
    ran(tmp_path / "bld2" / "app_files")

    # QOLA_PREBUILT_DIR_<GROUP> = a store of build-key archives: installed by key, nothing compiled
    store = tmp_path / "store"
    done = run_qola("package", str(out), "--into", str(store))
    assert done.returncode == 0, done.stdout + done.stderr
    key = json.loads((out / "manifest.json").read_text())["build_key"]
    out3 = tmp_path / "bld3" / "qola"
    defs3 = {**defs, "QOLA_OUT": str(out3)}
    cfg = cmake(
        project(tmp_path / "proj3", ADD_MODULES_CMAKE, SOURCES),
        tmp_path / "bld3",
        defs3,
        {**mirror.env, "QOLA_PREBUILT_DIR_ATTN": str(store)},
    )
    assert cfg.returncode == 0, cfg.stdout + cfg.stderr
    installed = json.loads((out3 / "manifest.json").read_text())
    assert installed["build_key"] == key
    assert (out3 / "lib" / LIB).read_bytes() == (out / "lib" / LIB).read_bytes()
    assert "nothing compiled" in cfg.stderr  # qola's own output streams through the configure
    assert not list(tmp_path.glob("bld3/qola.build/**/*.o")), "an archive install compiles nothing"
    ran(tmp_path / "bld3" / "app_targets")


TWO_PHASE_CMAKE = r"""cmake_minimum_required(VERSION 3.21)
project(two_phase LANGUAGES C)
include(${QOLA_DIR}/cmake/QoLA.cmake)
qola_checkout_aiter(MANIFEST ${QOLA_MANIFEST} AITER_DIR ${CMAKE_BINARY_DIR}/tree GROUPS ${QOLA_GROUP} OUT_DIR TREE)
qola_build_modules(GROUP ${QOLA_GROUP} MANIFEST ${QOLA_MANIFEST} BUILD_DIR ${CMAKE_BINARY_DIR}/out
                   AITER_DIR ${TREE} ARCHS ${ARCHS} LIBS qk_libattn_fwd.so
                   OUT_LIB_DIR LIBDIR OUT_LIBS FILES OUT_INCLUDE_DIR INC)
add_executable(app main.c fused_attn.c)
target_include_directories(app PRIVATE ${INC})
target_link_directories(app PRIVATE ${LIBDIR})
target_link_libraries(app PRIVATE -l:${FILES})
set_target_properties(app PROPERTIES BUILD_RPATH "${LIBDIR}")
"""


def test_two_phase_checkout_then_build(mirror: Mirror, manifest: Path, tmp_path: Path) -> None:
    """QoLA's two-phase form: qola_checkout_aiter() with GROUPS, then qola_build_modules() with LIBS;
    NVTE_AITER_SOURCE_DIR (a tree the user chose) skips the checkout."""
    src = project(tmp_path / "proj", TWO_PHASE_CMAKE, SOURCES)
    defs = {
        "QOLA_DIR": str(REPO),
        "QOLA_MANIFEST": str(manifest),
        "QOLA_GROUP": GROUP,
        "ARCHS": ARCHS,
        "QOLA_BUILD_ARGS": BUILD_ARGS,
    }
    cfg = cmake(src, tmp_path / "bld", defs, mirror.env)
    assert cfg.returncode == 0, cfg.stdout + cfg.stderr
    ran(tmp_path / "bld" / "app")
    # the same project against the user's own tree: nothing is checked out into bld2/tree
    cfg = cmake(
        project(tmp_path / "proj2", TWO_PHASE_CMAKE, SOURCES),
        tmp_path / "bld2",
        defs,
        {**mirror.env, "NVTE_AITER_SOURCE_DIR": str(tmp_path / "bld" / "tree")},
    )
    assert cfg.returncode == 0, cfg.stdout + cfg.stderr
    assert not (tmp_path / "bld2" / "tree").exists()
    ran(tmp_path / "bld2" / "app")


ERRORS_CMAKE = r"""cmake_minimum_required(VERSION 3.21)
project(errors LANGUAGES NONE)
include(${QOLA_DIR}/cmake/QoLA.cmake)
cmake_language(EVAL CODE "${CALL}")
"""


@pytest.mark.parametrize(
    ("call", "env", "message"),
    [
        ("qola_add_modules(MANIFEST m.toml BUILD_DIR b)", {}, "qola_add_modules: GROUP is required"),
        ("qola_add_modules(GROUP g BUILD_DIR b)", {}, "qola_add_modules: MANIFEST is required"),
        ("qola_add_modules(GROUP g MANIFEST m.toml BUILD_DIR b BOGUS x)", {}, "unknown arguments BOGUS;x"),
        ("qola_build_modules(GROUP g MANIFEST ${QOLA_MANIFEST} BUILD_DIR b)", {}, "AITER_DIR is required"),
        (
            "qola_build_modules(GROUP g BUILD_DIR b AITER_DIR t LIBS x.so OUT_LIBS LIBS y.so)",
            {},
            "qola_build_modules: OUT_LIBS is given without the name of a variable",
        ),
        (
            "qola_build_modules(GROUP g MANIFEST ${QOLA_MANIFEST} BUILD_DIR b AITER_DIR /nonexistent)",
            {},
            "/nonexistent is not a kernel tree",
        ),
        ("qola_checkout_aiter(MANIFEST /nonexistent.toml DEFAULT_DIR d OUT_DIR v)", {}, "manifest not found"),
        ("qola_checkout_aiter(MANIFEST ${QOLA_MANIFEST} OUT_DIR v)", {}, "AITER_DIR or DEFAULT_DIR"),
        (
            "qola_add_modules(GROUP attn MANIFEST ${QOLA_MANIFEST} BUILD_DIR b)",
            {"QOLA_PREBUILT_DIR_ATTN": "/nonexistent"},
            "QOLA_PREBUILT_DIR_ATTN=/nonexistent is not a directory",
        ),
        (
            "qola_add_modules(GROUP attn MANIFEST ${QOLA_MANIFEST} BUILD_DIR b)",
            {"QOLA_PREBUILT_DIR_ATTN": "relative/dir"},  # from the calling CMakeLists.txt's dir, as QoLA
            "QOLA_PREBUILT_DIR_ATTN=relative/dir (relative to",
        ),
        (
            "qola_add_modules(GROUP attn MANIFEST ${QOLA_MANIFEST} BUILD_DIR b)",
            {"QOLA_PREBUILT_DIR_ATTN": "@EMPTY@"},
            "holds neither a finished output",
        ),
    ],
)
def test_mistakes_are_clear_fatal_errors(
    manifest: Path, tmp_path: Path, call: str, env: dict[str, str], message: str
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    env = {k: v.replace("@EMPTY@", str(empty)) for k, v in env.items()}
    src = project(tmp_path / "proj", ERRORS_CMAKE, {})
    cfg = cmake(
        src, tmp_path / "bld", {"QOLA_DIR": str(REPO), "QOLA_MANIFEST": str(manifest), "CALL": call}, env, build=False
    )
    assert cfg.returncode != 0
    assert message in " ".join(cfg.stderr.split()), cfg.stderr
    assert "[qola]" in cfg.stderr


def test_a_failing_qola_shows_its_message(mirror: Mirror, manifest: Path, tmp_path: Path) -> None:
    """An unknown group: qola's refusal (exit 2) reaches the configure output whole."""
    src = project(tmp_path / "proj", ADD_MODULES_CMAKE, SOURCES)
    defs = {
        "QOLA_DIR": str(REPO),
        "QOLA_MANIFEST": str(manifest),
        "QOLA_OUT": str(tmp_path / "o"),
        "QOLA_GROUP": "atn",
        "ARCHS": ARCHS,
        "QOLA_BUILD_ARGS": BUILD_ARGS,
    }
    cfg = cmake(src, tmp_path / "bld", defs, mirror.env, build=False)
    assert cfg.returncode != 0
    text = " ".join(cfg.stderr.split())
    assert "[qola]" in text and "exit 2" in text and "atn" in text and "attn" in text, cfg.stderr


TWO_GROUPS_CMAKE = r"""cmake_minimum_required(VERSION 3.21)
project(two_groups LANGUAGES C)
include(${QOLA_DIR}/cmake/QoLA.cmake)
qola_add_modules(GROUP attn MANIFEST ${QOLA_MANIFEST} BUILD_DIR ${CMAKE_BINARY_DIR}/qola ARCHS sm_90
                 OUT_LIBS ATTN_LIBS OUT_LIB_DIR ATTN_DIR OUT_INCLUDE_DIR INC)
qola_add_modules(GROUP norm MANIFEST ${QOLA_MANIFEST} BUILD_DIR ${CMAKE_BINARY_DIR}/qola ARCHS sm_90
                 OUT_LIBS NORM_LIBS)
file(WRITE "${CMAKE_BINARY_DIR}/qola-vars.txt" "attn=${ATTN_LIBS}\nnorm=${NORM_LIBS}\n")
add_executable(app main.c fused_attn.c)
target_include_directories(app PRIVATE ${INC})
target_link_directories(app PRIVATE ${ATTN_DIR})
target_link_libraries(app PRIVATE -l:qk_libattn_fwd.so)
set_target_properties(app PROPERTIES BUILD_RPATH "${ATTN_DIR}")
"""


def test_two_groups_into_one_build_dir(mirror: Mirror, tmp_path: Path) -> None:
    """QoLA's README pattern: one qola_add_modules() per group, one BUILD_DIR. The first group's
    library is still there after the second group's build (QoLA's output accumulates; qola builds the
    groups of that dir together), and nothing of the first is compiled twice."""
    m = tmp_path / "two.toml"
    m.write_text(MANIFEST.format(commit=mirror.commit) + '\n[[modules]]\nname = "module_softmax"\ngroup = "norm"\n')
    src = project(tmp_path / "proj", TWO_GROUPS_CMAKE, SOURCES)
    cfg = cmake(
        src,
        tmp_path / "bld",
        {"QOLA_DIR": str(REPO), "QOLA_MANIFEST": str(m), "QOLA_BUILD_ARGS": BUILD_ARGS},
        mirror.env,
    )
    assert cfg.returncode == 0, cfg.stdout + cfg.stderr
    out = tmp_path / "bld" / "qola"
    assert read_vars(tmp_path / "bld") == {"attn": LIB, "norm": f"{LIB};qk_module_softmax.so"}
    assert sorted(p.name for p in (out / "lib").glob("*.so")) == [LIB, "qk_module_softmax.so"]
    assert {m_["name"] for m_ in json.loads((out / "manifest.json").read_text())["modules"]} == {
        "libattn_fwd",
        "module_softmax",
    }
    assert "building group(s) attn, norm" in cfg.stdout
    # ninja logs each build of an output: libattn_fwd's instance object was compiled once
    log = (tmp_path / "bld" / "qola.build" / ".ninja_log").read_text().splitlines()
    assert len([line for line in log if "obj/libattn_fwd/attn_fwd_d64" in line]) == 1, log
    ran(tmp_path / "bld" / "app")


def test_out_targets_of_a_pybind_only_group_is_a_clear_error(manifest: Path, tmp_path: Path) -> None:
    """Issue 32 item 7: OUT_TARGETS for a group of Python extension modules (no linkable target) is a
    clear FATAL_ERROR, not an empty list; without OUT_TARGETS the same group configures."""
    from qola.output import consumers

    out = tmp_path / "pybind_out"
    (out / "lib").mkdir(parents=True)
    (out / "lib" / "module_rmsnorm.cpython-311-x86_64-linux-gnu.so").write_bytes(b"")
    for rel, text in consumers.consumer_files(NS, [], "0.1.0").items():
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_text(text)
    env = {"QOLA_PREBUILT_DIR_ATTN": str(out)}
    base = "qola_add_modules(GROUP attn MANIFEST ${QOLA_MANIFEST} BUILD_DIR b OUT_LIBS L"
    for call, ok in ((base + " OUT_TARGETS T)", False), (base + ")", True)):
        src = project(tmp_path / f"proj{ok}", ERRORS_CMAKE, {})
        defs = {"QOLA_DIR": str(REPO), "QOLA_MANIFEST": str(manifest), "CALL": call}
        cfg = cmake(src, tmp_path / f"bld{ok}", defs, env, build=False)
        said = " ".join(cfg.stderr.split())
        if ok:
            assert cfg.returncode == 0, cfg.stderr
        else:
            assert cfg.returncode != 0 and "OUT_TARGETS: none of module_rmsnorm" in said, cfg.stderr
            assert "Python extension modules" in said


def test_qola_jit_switch_and_prebuilt_first(mirror: Mirror, manifest: Path, tmp_path: Path) -> None:
    """``-DQOLA_JIT=ON`` (TE's CK_JIT mode): the group is built with every generated instance deferred
    (stubs in the library, sources in BUILD_DIR/jit); the program links and answers as before. A
    ``QOLA_PREBUILT_DIR_<GROUP>`` store is tried first with the switch on and off: ON installs the JIT
    build's archive by its key, OFF (another key) finds none and builds everything ahead."""
    defs = {
        "QOLA_DIR": str(REPO),
        "QOLA_MANIFEST": str(manifest),
        "QOLA_GROUP": GROUP,
        "ARCHS": ARCHS,
        "QOLA_BUILD_ARGS": BUILD_ARGS,
    }

    def configure(
        proj: str, bld: str, out: Path, jit: str, env: dict[str, str], build: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """Configure (and build) a project adding the group with ``QOLA_OUT=out``, ``QOLA_JIT=jit``."""
        where = project(tmp_path / proj, ADD_MODULES_CMAKE, SOURCES)
        return cmake(where, tmp_path / bld, {**defs, "QOLA_OUT": str(out), "QOLA_JIT": jit}, env, build=build)

    out = tmp_path / "bld" / "qola"
    cfg = configure("p1", "bld", out, "ON", mirror.env)
    assert cfg.returncode == 0, cfg.stdout + cfg.stderr
    assert "JIT on (QOLA_JIT)" in cfg.stdout
    data = json.loads((out / "manifest.json").read_text())
    (mod,) = data["modules"]
    assert mod["jit"]["aot"]["count"] == 0 and mod["jit"]["deferred"]["count"] > 0, mod["jit"]
    assert (out / "jit" / "qk_libattn_fwd" / "index.json").is_file()
    ran(tmp_path / "bld" / "app_files")

    store = tmp_path / "store"
    done = run_qola("package", str(out), "--into", str(store))
    assert done.returncode == 0, done.stdout + done.stderr
    out2 = tmp_path / "bld2" / "qola"
    env = {**mirror.env, "QOLA_PREBUILT_DIR_ATTN": str(store)}
    cfg = configure("p2", "bld2", out2, "on", env)
    assert cfg.returncode == 0, cfg.stdout + cfg.stderr
    assert (
        "nothing compiled" in cfg.stderr
        and json.loads((out2 / "manifest.json").read_text())["build_key"] == data["build_key"]
    )
    assert (out2 / "jit" / "qk_libattn_fwd" / "index.json").is_file()  # the archive carries the JIT's sources

    out3 = tmp_path / "bld3" / "qola"
    cfg = configure("p3", "bld3", out3, "OFF", env)
    assert cfg.returncode == 0, cfg.stdout + cfg.stderr
    ahead = json.loads((out3 / "manifest.json").read_text())
    assert ahead["build_key"] != data["build_key"] and "nothing compiled" not in cfg.stderr
    assert not ahead["modules"][0].get("jit") and not (out3 / "jit" / "qk_libattn_fwd").exists()
    ran(tmp_path / "bld3" / "app_files")

    cfg = configure("p4", "bld4", tmp_path / "no", "maybe", mirror.env, build=False)
    assert cfg.returncode != 0 and "QOLA_JIT='maybe' is neither ON nor OFF" in cfg.stderr
    assert not (tmp_path / "no" / "lib").exists()
