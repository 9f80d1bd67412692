"""``qola build`` with embedded code objects: module_asm of the example tree, its code objects built
by scripts/build_hsa.py and embedded through ``[[modules]] embed = [...]`` (nvcc sm_90, hipcc gfx90a).

No GPU needed: the keys come from the built module (its ``embedded_keys()`` touches no device) and
the bytes from the ELF (index, key table and blobs read back through the hidden symbols).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from subprocess import CompletedProcess

import pytest
from support.common import run_qola
from support.embed_tree import MD_NAME, MODULE, NS, TYPES, _run, qola_build, tree_with_code_objects
from support.libdata import embedded_blobs

from qola.hooks import embed

pytestmark = pytest.mark.slow

PREFIX = embed.symbol_prefix(NS, MODULE)

# Imports the built pybind module in a fresh interpreter and prints its embedded keys as JSON.
KEYS_PY = (
    "import importlib.util, json, sys\n"
    "spec = importlib.util.spec_from_file_location(sys.argv[2], sys.argv[1])\n"
    "mod = importlib.util.module_from_spec(spec)\n"
    "spec.loader.exec_module(mod)\n"
    "print(json.dumps(mod.embedded_keys()))\n"
)


def imported_keys(so: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", KEYS_PY, str(so), MD_NAME], capture_output=True, text=True, timeout=120
    )


def elf_embedded(so: Path) -> tuple[dict[str, bytes], int]:
    return embedded_blobs(so, PREFIX, embed.ALIGN)


def check_build(proc: subprocess.CompletedProcess[str], out: Path, tree: Path, arch: str, *, need_import: bool) -> None:
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads((out / "manifest.json").read_text())
    (mod,) = data["modules"]
    assert mod["status"] == "built" and mod["artifact"] == f"lib/{MD_NAME}.so", mod
    assert mod["exports"] == [f"PyInit_{MD_NAME}"], mod["exports"]
    so = out / mod["artifact"]

    blobs = embed.collect(tree / "hsa", [arch], list(TYPES))
    want = [b.key for b in blobs]
    assert len(want) == 5 and all(k.startswith(f"hsa/{arch}/") for k in want)

    imported = imported_keys(so)
    if imported.returncode == 0:
        assert json.loads(imported.stdout) == want  # sorted, exactly the collected set
    else:
        assert not need_import, imported.stderr
        assert "libamdhip64" in imported.stderr or "cannot open shared object" in imported.stderr, imported.stderr

    found, blob_bytes = elf_embedded(so)
    assert sorted(found) == want
    assert all(found[b.key] == b.path.read_bytes() for b in blobs)
    assert blob_bytes >= sum({b.sha256: b.size for b in blobs}.values())

    audit = run_qola("audit", str(out))
    assert audit.returncode == 0, audit.stdout + audit.stderr
    header = out / "include" / f"qola_embedded_{MODULE}.h"
    assert header.is_file() and f"{NS}_{MODULE}_embedded_find" in header.read_text()


def ninja_log(build_dir: Path) -> list[str]:
    """Outputs of the edges ninja ran, one per finished edge, oldest first."""
    lines = (build_dir / ".ninja_log").read_text().splitlines()[1:]
    return [ln.split("\t")[3] for ln in lines]


@pytest.fixture(scope="module")
def cuda_build(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, CompletedProcess[str], Path]:
    tmp = tmp_path_factory.mktemp("embed_cuda")
    tree = tree_with_code_objects(tmp, "sm_90")
    proc, out = qola_build(tmp, tree, "sm_90")
    return tmp, tree, proc, out


def test_cuda_build_embeds_code_objects(cuda_build: tuple[Path, Path, CompletedProcess[str], Path]) -> None:
    tmp, tree, proc, out = cuda_build
    check_build(proc, out, tree, "sm_90", need_import=True)
    graph = (tmp / "out.build" / "build.ninja").read_text()
    assert f"build obj/{MODULE}/qola_embedded_{MODULE}.o: asm " in graph


def test_cuda_rebuild_reassembles_only_what_changed(cuda_build: tuple[Path, Path, CompletedProcess[str], Path]) -> None:
    """Runs last on the shared build: a touched or changed .co re-assembles and relinks, compiles nothing."""
    tmp, tree, proc, out = cuda_build
    assert proc.returncode == 0, proc.stdout + proc.stderr
    build_dir = tmp / "out.build"
    asm_obj, lib = f"obj/{MODULE}/qola_embedded_{MODULE}.o", f"lib/{MD_NAME}.so"
    co = tree / "hsa" / "sm_90" / "vec_add" / "vec_add_fp16.co"

    def rebuild() -> list[str]:
        mark = len(ninja_log(build_dir))
        again, _ = qola_build(tmp, tree, "sm_90")
        assert again.returncode == 0, again.stdout + again.stderr
        return ninja_log(build_dir)[mark:]

    assert rebuild() == []  # a no-op: nothing re-assembled (the depfile names no temp file)
    later = time.time() + 2
    os.utime(co, (later, later))  # same bytes, newer: only GNU as' depfile knows the .S reads it
    assert sorted(rebuild()) == sorted([asm_obj, lib])
    co.write_bytes(co.read_bytes() + b"\0" * 100)  # new bytes: the header does not change, no recompile
    assert sorted(rebuild()) == sorted([asm_obj, lib])
    found, _ = elf_embedded(out / lib)
    assert found[f"hsa/sm_90/vec_add/{co.name}"] == co.read_bytes()
    shutil.copy(co, co.with_name("vec_add_copy.co"))  # a new file: the .S changes
    assert sorted(rebuild()) == sorted([asm_obj, lib])
    keys = json.loads(_run([sys.executable, "-c", KEYS_PY, out / lib, MD_NAME]).stdout)
    assert "hsa/sm_90/vec_add/vec_add_copy.co" in keys and len(keys) == 6
    assert rebuild() == []


@pytest.mark.hip
def test_hip_build_embeds_code_objects(tmp_path: Path) -> None:
    tree = tree_with_code_objects(tmp_path, "gfx90a")  # build_hsa.py sets HIP_PLATFORM=amd for hipcc only
    proc, out = qola_build(tmp_path, tree, "gfx90a")
    data = json.loads((out / "manifest.json").read_text()) if proc.returncode == 0 else {}
    assert data.get("toolchain", {}).get("kind") == "hip", proc.stdout + proc.stderr
    # importing needs libamdhip64 (not a GPU): where it is missing, the ELF alone is checked
    check_build(proc, out, tree, "gfx90a", need_import=False)


def test_cuda_failed_assembly_fails_the_module(
    cuda_build: tuple[Path, Path, CompletedProcess[str], Path], tmp_path: Path
) -> None:
    """A failing asm edge fails its module: nothing of it is published (OUT keeps its version)."""
    tmp, tree, proc, out = cuda_build
    assert proc.returncode == 0, proc.stdout + proc.stderr
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "cc").write_text("#!/bin/sh\necho 'qola-test: assembler refused' >&2\nexit 1\n")
    (fake / "cc").chmod(0o755)
    co = tree / "hsa" / "sm_90" / "vec_scale" / "vec_scale_fp32.co"
    later = time.time() + 4
    os.utime(co, (later, later))
    m = tmp / "q.toml"
    failed = run_qola(
        "build",
        "--manifest",
        str(m),
        "--aiter-root",
        str(tree),
        "-o",
        str(out),
        "-j",
        "2",
        env={"PATH": f"{fake}{os.pathsep}{os.environ['PATH']}"},
    )
    assert failed.returncode == 1, failed.stdout + failed.stderr
    # nothing published (issue 41 item 7): OUT keeps its version whole, the log is in the build dir
    (mod,) = json.loads((out / "manifest.json").read_text())["modules"]
    assert mod["status"] == "built" and "nothing published" in failed.stderr, mod
    log = out.parent / f"{out.name}.build" / "logs" / f"{mod['name']}.log"
    assert f"full log: {log}" in failed.stderr and "assembler refused" in log.read_text()
    fixed, _ = qola_build(tmp, tree, "sm_90")  # the real cc again: built
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
