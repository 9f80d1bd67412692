"""Helpers shared by test files (first written in test_embed_build.py)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from support.common import KERNELS, run_qola

TYPES = ("vec_add", "vec_scale")


NS, MODULE, MD_NAME = "qk", "module_asm", "qk_module_asm"


def _run(cmd: Sequence[object], **kw: Any) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    assert proc.returncode == 0, f"{cmd}\n{proc.stdout}\n{proc.stderr}"
    return proc


def tree_with_code_objects(tmp: Path, arch: str) -> Path:
    """A copy of the example tree (never the repo's) with hsa/<arch>/ built by its own script."""
    tree = tmp / "kernels"
    shutil.copytree(KERNELS, tree, ignore=shutil.ignore_patterns("hsa", "__pycache__"))
    (tree / "hsa").mkdir()
    _run([sys.executable, tree / "scripts" / "build_hsa.py", "--arch", arch, "--output", tree / "hsa"])
    return tree


def qola_build(tmp: Path, tree: Path, arch: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    m = tmp / "q.toml"
    m.write_text(
        f'[qola]\nnamespace = "{NS}"\n[build]\narchitectures = ["{arch}"]\n\n'
        f'[[modules]]\nname = "{MODULE}"\nembed = {json.dumps(list(TYPES))}\n'
    )
    out = tmp / "out"
    return run_qola("build", "--manifest", str(m), "--aiter-root", str(tree), "-o", str(out), "-j", "2"), out


PIN_LOADER = r"""#pragma once
// The shape of AITER's loader at Transformer Engine's pin (aiter_hip_common.h,
// AiterAsmKernel::load_hsaco_file): $AITER_ASM_DIR/<arch>/<path> is read first, the embedded map
// only when the variable is unset. Included after AITER_EMBEDDED_HSA_HEADER, as AITER's is.
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

struct AiterAsmLoader
{
    static const void* load_hsaco_file(const std::string& arch_name, const char* hsaco_path,
                                       std::vector<std::string>& storage, std::string& where)
    {
        const char* AITER_ASM_DIR = std::getenv("AITER_ASM_DIR");
        if(AITER_ASM_DIR != nullptr)
        {
            where = std::string(AITER_ASM_DIR) + "/" + arch_name + "/" + hsaco_path;
            std::ifstream file(where, std::ios::binary);
            std::string bytes((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
            if(bytes.empty())
                return nullptr;
            storage.push_back(std::move(bytes));
            return storage.back().data();
        }
        else
        {
#if defined(AITER_EMBEDDED_HSA_HEADER) && defined(AITER_EMBEDDED_HSA_MAP)
            where    = "embedded hsa/" + arch_name + "/" + hsaco_path;
            auto hit = AITER_EMBEDDED_HSA_MAP.find("hsa/" + arch_name + "/" + hsaco_path);
            return hit == AITER_EMBEDDED_HSA_MAP.end() ? nullptr : hit->second.data();
#else
            return nullptr;
#endif
        }
    }
};
"""


def tree_with_pin_loader(tmp: Path, arch: str) -> Path:
    """:func:`tree_with_code_objects` whose module_asm finds its code objects through a loader of the
    shape of AITER's at TE's pin (:data:`PIN_LOADER` in ``csrc/include/aiter_hip_common.h``: the
    variable before the embedded map), the one qola's fix ``asm-embedded-first`` changes."""
    tree = tree_with_code_objects(tmp, arch)
    (tree / "csrc" / "include" / "aiter_hip_common.h").write_text(PIN_LOADER)
    src = tree / "csrc" / "asm" / "asm_launch.cu"
    text = src.read_text()
    embedded = (
        "#include AITER_EMBEDDED_HSA_HEADER // defines AITER_EMBEDDED_HSA_MAP, as for aiter_hip_common.h\n#endif\n"
    )
    start = text.index("const void* find_code_object(")
    end = text.index("struct Cache")
    body = (
        "const void* find_code_object(const std::string& arch, const char* co, const char* asm_dir,\n"
        "                             std::vector<std::string>& storage, std::string& where)\n"
        "{\n    (void)asm_dir; // the pin's loader reads $AITER_ASM_DIR itself\n"
        "    return AiterAsmLoader::load_hsaco_file(arch, co, storage, where);\n}\n\n"
    )
    assert embedded in text
    text = text.replace(embedded, embedded + '#include "aiter_hip_common.h"\n', 1)
    src.write_text(text[: text.index("const void* find_code_object(")] + body + text[text.index("struct Cache") :])
    assert start < end
    return tree


def other_code_objects(tmp: Path, arch: str) -> Path:
    """An ``$AITER_ASM_DIR`` of another build: the same code objects' names, built from a vec_add that
    subtracts (what another AITER's kernels of the same name would do differently)."""
    other = tmp / "other-tree"
    shutil.copytree(KERNELS, other, ignore=shutil.ignore_patterns("hsa", "__pycache__"))
    src = other / "csrc" / "hsa_src" / "vec_add.cu"
    text = src.read_text()
    assert "qk_to_float(a[i]) + qk_to_float(b[i])" in text
    src.write_text(text.replace("qk_to_float(a[i]) + qk_to_float(b[i])", "qk_to_float(a[i]) - qk_to_float(b[i])"))
    asm = tmp / "other-asm"
    asm.mkdir()
    _run([sys.executable, other / "scripts" / "build_hsa.py", "--arch", arch, "--output", asm])
    return asm
