"""Helpers shared by test files (first written in test_reproducible.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from qola.pipeline.record import BuildRecord
from support.common import KERNELS

# spells its own path (host and device) and has a kernel in an anonymous namespace, whose name nvcc
# derives from the source's path
TINY = r"""#if defined(__HIP__)
#include <hip/hip_runtime.h>
#endif
namespace { __global__ void tiny_kernel(char* out) { const char* f = __FILE__; out[0] = f[0]; } }
extern "C" __attribute__((visibility("default"))) const char* qk_tiny_file() {
    void (*k)(char*) = tiny_kernel; (void)k;
    return __FILE__ TINY_EXTRA;
}
"""


ATTN = (
    '[[modules]]\nname = "libattn_fwd"\nmode = "cpp_itfs"\nlink = "static"\nblob_gen_cmd = ["csrc/attn/generate.py '
    '-d fwd --filter attn_fwd_d64_fp16_batch*_nmask_nlse --output_dir {}"]\n\n'
)


SOFTMAX = '[[modules]]\nname = "module_softmax"\n\n'


# a generated source in the build dir that spells its own path, as AITER's asm fMHA v3 files do
TINY_GEN = (
    "import sys\n"
    "out = sys.argv[sys.argv.index('--output_dir') + 1]\n"
    "open(out + '/tiny_gen.cu', 'w').write('extern \"C\" __attribute__((visibility(\"default\"))) "
    "const char* qk_tiny_gen_file() { return __FILE__; }\\n')\n"
)


TINY_MODULE = (
    '[[modules]]\nname = "module_tiny"\nmode = "cpp_itfs"\nis_python_module = false\n'
    'srcs = ["csrc/tiny/tiny.cu"]\nblob_gen_cmd = ["csrc/tiny/gen.py --output_dir {}"]\nflags_extra_hip = [%s]\n\n'
)


def tree_copy(dest: Path) -> Path:
    shutil.copytree(KERNELS, dest, ignore=shutil.ignore_patterns("hsa", "__pycache__"))
    (dest / "csrc" / "tiny").mkdir()
    (dest / "csrc" / "tiny" / "tiny.cu").write_text(TINY)
    (dest / "csrc" / "tiny" / "gen.py").write_text(TINY_GEN)
    return dest


def manifest(path: Path, arch: str, modules: str, tiny_extra: str = "") -> Path:
    flags = json.dumps(f"-DTINY_EXTRA={tiny_extra}")
    path.write_text(f'[qola]\nnamespace = "qk"\n[build]\narchitectures = ["{arch}"]\n\n' + modules.replace("%s", flags))
    return path


def libraries(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((out / "lib").iterdir()) if p.is_file()}


def recorded_build(entry: object) -> BuildRecord:
    """manifest.json's ``build`` entry ``entry`` as ``qola audit --reproduce`` reads it."""
    rec = BuildRecord.parse(entry)
    assert rec is not None, entry
    return rec
