"""Reproducible across machines (issue 13): the same input built from two copies of the kernel tree
at different paths, into different build and output dirs, gives byte-identical libraries — a
Python module, a static archive and a shared library of cpp_itfs modules — for CUDA (nvcc, sm_90)
and HIP (the ROCm 7 compiler, gfx942; marker ``rocm``). And ``qola audit --reproduce OUT``, which
rebuilds OUT's build elsewhere and compares every library with manifest.json.

What made builds path-dependent, and the fixes: docs/design-notes.md, "Reproducible across machines".
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest
from support.common import run_qola
from support.repro import ATTN, SOFTMAX, TINY_MODULE, libraries, manifest, tree_copy

from qola.compile.link import Archiving, archive_steps
from qola.compile.pathmap import BUILD, TREE, PathMap, unit_id
from qola.pipeline import run as pipeline
from qola.pipeline.run import BuildSpec
from qola.toolchain import Toolchain
from qola.toolchain import cuda as cuda_mod
from qola.toolchain import hip as hip_mod

needs_nvcc = pytest.mark.skipif(
    not (shutil.which("nvcc") or os.path.exists("/usr/local/cuda/bin/nvcc")), reason="needs nvcc"
)
slow = pytest.mark.slow


def test_names_and_ids_do_not_depend_on_the_roots(tmp_path: Path) -> None:
    names = []
    for tree, build in (("/a/kernels", "/a/out.build"), ("/somewhere/else/kernels", "/b/bld")):
        paths = PathMap.of(tree, build)
        assert paths.compiler_maps == ((tree, TREE), (build, BUILD))  # both mapped on command lines (__FILE__)
        names.append([paths.name(f"{tree}/csrc/x.cu"), paths.name(f"{build}/gen/m/blob/i.cu"), paths.name("/usr/x.h")])
    assert names[0] == names[1] == [f"{TREE}/csrc/x.cu", f"{BUILD}/gen/m/blob/i.cu", "/usr/x.h"]
    assert PathMap.of("/a/k", "/b").name("/a/kernels/x.cu") == "/a/kernels/x.cu"  # a prefix, not a root
    ids = {unit_id(m, n) for m in ("m1", "m2") for n in names[0]}
    assert len(ids) == 6 and all(len(i) == 16 and int(i, 16) >= 0 for i in ids)
    link = tmp_path / "link"
    link.symlink_to(tmp_path)
    assert PathMap.of(link, "/b").name(tmp_path / "x.cu") == f"{TREE}/x.cu"  # as given and resolved


def test_each_compiler_gets_its_spelling() -> None:
    cuda = Toolchain(
        "cuda",
        "/x/nvcc",
        "13.0",
        "",
        "ab" * 32,
        ("sm_90",),
        "c++",
        {},
        host_wrap=("-Xcompiler",),
        unit_flags=cuda_mod.UNIT_FLAGS,
        discard_locals=True,
    )
    hip = Toolchain("hip", "/x/hipcc", "6.4", "", "ab" * 32, ("gfx942",), "c++", {}, unit_flags=hip_mod.UNIT_FLAGS)
    assert cuda.prefix_map_flags([("/t", TREE)]) == ["-Xcompiler", f"-ffile-prefix-map=/t={TREE}"]
    assert hip.prefix_map_flags([("/t", TREE)]) == [f"-ffile-prefix-map=/t={TREE}"]
    assert cuda.unit_flags_for("/qola/tree/a.cu", "0f") == [
        "-Xcudafe",
        "--orig_src_path_name=/qola/tree/a.cu",
        "-Xcicc",
        "--orig_src_path_name=/qola/tree/a.cu",
    ]
    assert hip.unit_flags_for("/qola/tree/a.cu", "0f") == ["-cuid=0f"]
    assert "-Wl,--discard-all" in cuda.shared_link_argv("o.rsp", "x.so", [])
    assert "-Wl,--discard-all" not in hip.shared_link_argv("o.rsp", "x.so", [])
    steps, _, _ = archive_steps(
        [Path("/b/a.o")], Path("/b/lib/x.a"), "qk", Path("/b/w"), how=Archiving(discard_locals=True)
    )
    assert steps[0][:2] == ["ld", "-r"] and "--discard-all" in steps[0]


def two_builds(tmp: Path, arch: str) -> tuple[dict[str, bytes], dict[str, bytes], list[Path]]:
    """Build the same manifest from two tree copies (paths of different lengths) into different
    build and output dirs; (libraries of each, the trees)."""
    trees, built = [], []
    for i, where in enumerate(("a", "somewhere/else/entirely")):
        tree = tree_copy(tmp / where / "kernels")
        m = manifest(tmp / f"q{i}.toml", arch, SOFTMAX + ATTN + TINY_MODULE)
        report = pipeline.build(
            BuildSpec.make(
                manifest=str(m),
                aiter_root=str(tree),
                output_dir=str(tmp / f"out{i}"),
                build_dir=str(tmp / f"b{i}" / ("x" * (i + 1))),
                jobs=2,
            )
        )
        assert report.ok, [r.detail for r in report.modules if r.status != "built"]
        trees.append(tree)
        built.append(libraries(tmp / f"out{i}"))
    return built[0], built[1], trees


def check_identical(tmp: Path, arch: str) -> None:
    first, second, trees = two_builds(tmp, arch)
    assert set(first) == {"qk_module_softmax.so", "qk_libattn_fwd.a", "qk_module_tiny.so"}, sorted(first)
    differ = [name for name in first if first[name] != second.get(name)]
    assert not differ, f"libraries differ between the two trees: {differ}"
    for name, data in first.items():  # neither tree's nor build dir's path is in any library
        for where in (*trees, tmp):
            assert str(where).encode() not in data, (name, where)
    assert b"/qola/tree/csrc/tiny/tiny.cu" in first["qk_module_tiny.so"]  # __FILE__, mapped
    assert b"/qola/build/gen/module_tiny/blob/tiny_gen.cu" in first["qk_module_tiny.so"]  # a generated one's too


@slow
@needs_nvcc
def test_cuda_libraries_identical_across_tree_and_build_paths(tmp_path: Path) -> None:
    check_identical(tmp_path, "sm_90")


@slow
@pytest.mark.rocm
def test_hip_libraries_identical_across_tree_and_build_paths(tmp_path: Path) -> None:
    check_identical(tmp_path, "gfx942")


# ---- qola audit --reproduce ---------------------------------------------------------------------


@slow
@needs_nvcc
def test_audit_reproduce(tmp_path: Path) -> None:
    tree = tree_copy(tmp_path / "kernels")
    temp = tmp_path / "temp"  # where the rebuilds go: empty again after each
    temp.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "SOURCE_DATE_EPOCH"} | {"TMPDIR": str(temp)}
    # a library whose bytes hold the time of day it was compiled: not reproducible ...
    m = manifest(tmp_path / "q.toml", "sm_90", TINY_MODULE, tiny_extra="__TIME__")
    out = tmp_path / "out"
    build = ["build", "--manifest", str(m), "--aiter-root", str(tree), "-o", str(out), "-j", "2"]
    assert run_qola(*build, env=env, whole_env=True).returncode == 0
    built_at = int(time.time())  # __TIME__ has a resolution of a second: the rebuild compiles in a later one
    while int(time.time()) == built_at:
        time.sleep(0.05)
    proc = run_qola("audit", str(out), "--reproduce", "-j", "2", env=env, whole_env=True)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "lib/qk_module_tiny.so" in proc.stdout and "differs" in proc.stdout, proc.stdout
    assert "lib/qk_module_tiny.so: differs" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert not list(temp.iterdir())
    # ... unless SOURCE_DATE_EPOCH fixes __TIME__: manifest.json records it and the rebuild sets it
    # again (the auditing shell has it unset)
    proc = run_qola(*build, env=env | {"SOURCE_DATE_EPOCH": "1700000000"}, whole_env=True)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((out / "manifest.json").read_text())["build"]["env"]["SOURCE_DATE_EPOCH"] == "1700000000"
    proc = run_qola("audit", str(out), "--reproduce", env=env, whole_env=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "lib/qk_module_tiny.so" in proc.stdout and "match" in proc.stdout and "byte-identical" in proc.stdout
    assert not list(temp.iterdir())
    # a tree file edited since (a comment: the same bytes) changes the build key, and the audit says so
    src = tree / "csrc" / "tiny" / "tiny.cu"
    src.write_text(src.read_text() + "// edited after the build\n")
    proc = run_qola("audit", str(out), "--reproduce", env=env, whole_env=True)
    assert proc.returncode == 0 and "the build key differs" in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    # a published library altered after the build: named, exit 1
    lib = (out / "lib" / "qk_module_tiny.so").resolve()
    lib.chmod(0o644)
    lib.write_bytes(lib.read_bytes() + b"\0")
    proc = run_qola("audit", str(out), "--reproduce", env=env, whole_env=True)
    assert proc.returncode == 1 and "lib/qk_module_tiny.so: altered in OUT" in proc.stderr, proc.stdout + proc.stderr
    # bad input: a clear error, exit 2, no traceback, nothing rebuilt
    m.write_text(m.read_text() + "# edited\n")
    proc = run_qola("audit", str(out), "--reproduce", env=env, whole_env=True)
    assert proc.returncode == 2 and "changed since OUT was built" in proc.stderr, proc.stderr
    for bad in (tmp_path / "nothing-here", tree):
        proc = run_qola("audit", str(bad), "--reproduce", env=env, whole_env=True)
        assert proc.returncode == 2 and "manifest.json" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and not list(temp.iterdir())
