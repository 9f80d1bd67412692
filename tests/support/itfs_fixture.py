"""A kernel tree in AITER's layout, written by the tests, whose cpp_itfs API comes in three shapes
(no AITER code: the declarations are the project's own, in the shapes the generations take):

* ``old``: AITER before 2025-12-30 (``mha_fwd(args, stream_config, q_dtype_str, ..., 12 params)``);
* ``new``: every TE pin since: ``float mha_fwd(mha_fwd_args, const ck_tile::stream_config&)`` and
  ``mha_bwd(mha_bwd_args, const ck_tile::stream_config&)`` (unnamed), CK's ``fmha_bwd_launcher``
  with ``workspace_size`` included under a condition (``#if FIXTURE_CK``);
* ``future``: an invented next one: an inline namespace, an export macro, a struct returned, an
  enum default, ``std::function``, a nested template, a function pointer, an rvalue reference.

The functions compute something from their arguments, so a consumer can tell that the call went
through: ``mha_fwd`` returns 1 for a ``v3_api_check`` dry run, else ``hdim_q * 2 + log_level``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

STREAM = """#pragma once
namespace ck_tile {
struct stream_config { void* stream_id_ = nullptr; bool time_kernel_ = false; int log_level_ = 0; };
using index_t = int;
}
"""

FWD_ARGS = """struct mha_fwd_args {
    bool use_asm_v3; bool v3_api_check; int how_v3_bf16_cvt; std::string data_type; bool is_group_mode;
    int bias_type; bool has_lse; const void* q_ptr = nullptr; ck_tile::index_t hdim_q; ck_tile::index_t mask_type;
    std::variant<std::pair<uint64_t, uint64_t>, std::pair<const void*, const void*>> drop_seed_offset;
};
"""

HEADERS = {
    "old": {
        "csrc/include/mha_fwd.h": """#pragma once
#include <string>
#include <variant>
#include <cstdint>
#include "ck_tile/host/stream_config.hpp"
enum class mask_enum { no_mask = 0, mask_top_left };
enum class bias_enum { no_bias = 0, alibi };
namespace aiter {
"""
        + FWD_ARGS
        + """
__attribute__((visibility("default"))) float mha_fwd(mha_fwd_args args,
                                                     const ck_tile::stream_config& stream_config,
                                                     std::string q_dtype_str, bool is_group_mode,
                                                     mask_enum mask_type, bias_enum bias_type,
                                                     bool has_lse, bool use_ext_asm,
                                                     int how_v3_bf16_cvt = 1,
                                                     const void* seqstart_q_padding_ptr = nullptr,
                                                     const void* seqstart_k_padding_ptr = nullptr,
                                                     bool is_v3_api_check = false);
} // namespace aiter
""",
    },
    "new": {
        "csrc/include/mha_fwd.h": """#pragma once
// the two-argument generation
#include <string>
#include <variant>
#include <cstdint>
#include "ck_tile/host/stream_config.hpp"
enum class mask_enum { no_mask = 0, mask_top_left };
enum class bias_enum { no_bias = 0, alibi };
namespace aiter {
"""
        + FWD_ARGS
        + """
/* the entry point */
__attribute__((visibility("default"))) float mha_fwd(mha_fwd_args args,
                                                     const ck_tile::stream_config& s);
float fmha_fwd_v3(mha_fwd_args a, const ck_tile::stream_config& s);  // internal, not exported
} // namespace aiter
""",
        "csrc/include/mha_bwd.h": """#ifndef FIXTURE_MHA_BWD_H
#define FIXTURE_MHA_BWD_H
#include <functional>
#include <string>
#include "ck_tile/host/stream_config.hpp"
#if FIXTURE_CK
#include "fmha_bwd.hpp"
#endif
namespace aiter {
struct mha_bwd_args {
    bool use_asm_v3; bool v3_api_check; int hdim_q; std::string data_type;
    std::function<void*(size_t bytes, bool zero_init)> workspace_alloc{};
};
__attribute__((visibility("default"))) float mha_bwd(mha_bwd_args, const ck_tile::stream_config&);
} // namespace aiter
#endif
""",
        "3rdparty/composable_kernel/example/ck_tile/01_fmha/fmha_bwd.hpp": """#pragma once
#include <cstddef>
struct fmha_bwd_traits { int seqlen_q; int hdim_q; bool is_deterministic; };
struct fmha_bwd_launcher {
    size_t workspace_size = 0;
    explicit fmha_bwd_launcher(const fmha_bwd_traits& t)
        : workspace_size(static_cast<size_t>(t.seqlen_q) * t.hdim_q * (t.is_deterministic ? 8 : 4)) {}
};
""",
    },
    "future": {
        "csrc/include/mha_fwd.h": """#ifndef FIXTURE_FUTURE_FWD_H
#define FIXTURE_FUTURE_FWD_H
#include <functional>
#include <map>
#include <string>
#include <variant>
#include <vector>
#include <cstdint>
#include "ck_tile/host/stream_config.hpp"
#define AITER_API __attribute__((visibility("default")))
namespace aiter {
inline namespace v4 {
enum class fwd_mode { plain = 0, fast = 3 };
"""
        + FWD_ARGS
        + """
struct mha_fwd_result { float ms; int kernels; };
[[nodiscard]] AITER_API mha_fwd_result
mha_fwd(const mha_fwd_args& args,
        const ck_tile::stream_config& s,
        fwd_mode mode                                           = fwd_mode::fast,
        std::function<void*(size_t, bool)> alloc                = {},
        const std::map<std::string, std::vector<int>>* tuning   = nullptr,
        int (*on_kernel)(const char* name)                     = nullptr,
        int&& token                                             = 0) noexcept;
} // namespace v4
} // namespace aiter
#endif
""",
    },
}

SOURCES = {
    "old": """#include "mha_fwd.h"
namespace aiter {
float mha_fwd(mha_fwd_args args, const ck_tile::stream_config& s, std::string, bool, mask_enum, bias_enum, bool,
              bool, int how_v3_bf16_cvt, const void*, const void*, bool is_v3_api_check)
{
    if(is_v3_api_check) return 1;
    return float(args.hdim_q * 2 + s.log_level_ + 100 * how_v3_bf16_cvt);
}
}
""",
    "new": """#include "mha_fwd.h"
namespace aiter {
float mha_fwd(mha_fwd_args args, const ck_tile::stream_config& s)
{
    if(args.v3_api_check) return 1;
    return float(args.hdim_q * 2 + s.log_level_);
}
float fmha_fwd_v3(mha_fwd_args, const ck_tile::stream_config&) { return -1; }
}
""",
    "new_bwd": """#include "mha_bwd.h"
namespace aiter {
float mha_bwd(mha_bwd_args a, const ck_tile::stream_config& s)
{
    if(a.v3_api_check) return 1;
    void* ws = a.workspace_alloc ? a.workspace_alloc(16, true) : nullptr;
    return float(a.hdim_q * 3 + s.log_level_ + (ws != nullptr ? 1000 : 0));
}
}
""",
    "future": """#include "mha_fwd.h"
namespace aiter { inline namespace v4 {
mha_fwd_result mha_fwd(const mha_fwd_args& args, const ck_tile::stream_config& s, fwd_mode mode,
                       std::function<void*(size_t, bool)> alloc, const std::map<std::string, std::vector<int>>* tuning,
                       int (*on_kernel)(const char*), int&& token) noexcept
{
    int k = on_kernel ? on_kernel("fwd") : 0;
    int t = tuning ? int(tuning->size()) : 0;
    return {float(args.hdim_q * 2 + s.log_level_ + int(mode) + token), k + t + (alloc ? 10 : 0)};
}
} }
""",
}


def _entry(src: str, flags: list[str]) -> dict[str, Any]:
    return {
        "srcs": [f"f'{{AITER_CSRC_DIR}}/cpp_itfs/{src}'"],
        "flags_extra_cc": [],
        "flags_extra_hip": [f"'{f}'" for f in flags],
        "extra_ldflags": "None",
        "extra_include": ["f'{CK_DIR}/example/ck_tile/01_fmha'", "f'{AITER_CSRC_DIR}/include/ck_lite'"],
        "verbose": "False",
        "is_python_module": "False",
        "is_standalone": "False",
        "torch_exclude": "True",
        "blob_gen_cmd": "''",
    }


def write_tree(root: Path, shape: str) -> Path:
    """The fixture tree of ``shape`` ("old", "new", "future") at ``root``."""
    files = dict(HEADERS[shape])
    files["csrc/include/ck_lite/ck_tile/host/stream_config.hpp"] = STREAM
    files["csrc/cpp_itfs/mha_fwd.cu"] = SOURCES[shape]
    table = {"libmha_fwd": _entry("mha_fwd.cu", [])}
    if shape == "new":
        files["csrc/cpp_itfs/mha_bwd.cu"] = SOURCES["new_bwd"]
        table["libmha_bwd"] = _entry("mha_bwd.cu", ["-DFIXTURE_CK=1"])
    files["aiter/jit/optCompilerConfig.json"] = json.dumps(table, indent=2)
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def include_dirs(root: Path) -> list[Path]:
    """What a consumer adds for the tree's own headers (the module's include dirs)."""
    return [
        root / "csrc" / "include",
        root / "csrc" / "include" / "ck_lite",
        root / "3rdparty" / "composable_kernel" / "example" / "ck_tile" / "01_fmha",
    ]


def consumer_argv(tree: Path, out: Path, src: Path, exe: Path, arch: str, *flags: str, ns: str = "te") -> list[str]:
    """The compile-and-link line of a consumer of OUT's ``<ns>_*.so`` libraries: OUT/include and the
    tree's headers, every library by file name, ``--no-undefined``, OUT/lib as its rpath (``flags``
    before the source: its switches)."""
    cxx = ["hipcc", "-x", "hip", f"--offload-arch={arch}"] if arch.startswith("gfx") else ["g++"]
    libs = sorted(p.name for p in (out / "lib").glob(f"{ns}_*.so"))
    inc = [f"-I{out / 'include'}", *(f"-I{d}" for d in include_dirs(tree))]
    link = [f"-L{out / 'lib'}", *(f"-l:{lib}" for lib in libs), "-Wl,--no-undefined", f"-Wl,-rpath,{out / 'lib'}"]
    return [*cxx, "-std=c++17", *inc, "-DFIXTURE_CK=1", *flags, str(src), "-o", str(exe), *link]


def manifest(path: Path, shape: str, arch: str, ns: str = "te") -> Path:
    mods = ["libmha_fwd"] + (["libmha_bwd"] if shape == "new" else [])
    path.write_text(
        f'[qola]\nnamespace = "{ns}"\n[build]\narchitectures = ["{arch}"]\nmode = "cpp_itfs"\n'
        + "".join(f'[[modules]]\nname = "{m}"\n' for m in mods)
    )
    return path


# A consumer in the shape of TE's ck_fused_attn_fwd.cpp / _bwd.cpp: populate the args struct, the
# v3 dry-run probe, the call through QOLA_NS, the workspace size where the API has it.
CONSUMER = {
    "new": r"""#include <cstdio>
#include "qola_mha_fwd.h"
#include "qola_mha_bwd.h"
static char pool[64];
int main() {
    aiter::mha_fwd_args fmha_args{};
    fmha_args.hdim_q = 64;
    fmha_args.data_type = "bf16";
    fmha_args.drop_seed_offset = std::pair<const void*, const void*>{nullptr, nullptr};
    fmha_args.v3_api_check = true;
    ck_tile::stream_config probe{nullptr, false, false};
    const bool uses_v3 = QOLA_NS(mha_fwd)(fmha_args, probe) == 1;
    fmha_args.v3_api_check = false;
    ck_tile::stream_config stream_config{nullptr, false, 1};
    const float fwd = QOLA_NS(mha_fwd)(fmha_args, stream_config);
    aiter::mha_bwd_args bwd_args{};
    bwd_args.hdim_q = 64;
    bwd_args.workspace_alloc = [](size_t, bool) -> void* { return pool; };
    const float bwd = QOLA_NS(mha_bwd)(bwd_args, stream_config);
    const size_t ws = QOLA_NS(mha_bwd_workspace_size)(fmha_bwd_traits{128, 64, true});
    std::printf("%d %g %g %zu %s %d\n", uses_v3, fwd, bwd, ws, QOLA_NAMESPACE_STR, te_qola_version()[0] != 0);
    return 0;
}
""",
    "old": r"""#include <cstdio>
#include "qola_mha_fwd.h"
int main() {
    aiter::mha_fwd_args fmha_args{};
    fmha_args.hdim_q = 64;
    ck_tile::stream_config stream_config{nullptr, false, 1};
    const bool uses_v3 = QOLA_NS(mha_fwd)(fmha_args, stream_config, "bf16", false, mask_enum::no_mask,
                                          bias_enum::no_bias, true, true, 1, nullptr, nullptr, true) == 1;
    const float fwd = QOLA_NS(mha_fwd)(fmha_args, stream_config, "bf16", false, mask_enum::no_mask,
                                       bias_enum::no_bias, true, true);
    std::printf("%d %g %s %d\n", uses_v3, fwd, QOLA_NAMESPACE_STR, te_qola_version()[0] != 0);
    return 0;
}
""",
    "future": r"""#include <cstdio>
#include "qola_mha_fwd.h"
static int seen(const char*) { return 5; }
int main() {
    aiter::mha_fwd_args fmha_args{};
    fmha_args.hdim_q = 64;
    ck_tile::stream_config stream_config{nullptr, false, 1};
    const auto a = QOLA_NS(mha_fwd)(fmha_args, stream_config);  // every default: mode fast (3)
    std::map<std::string, std::vector<int>> tuning{{"x", {1}}};
    const auto b = QOLA_NS(mha_fwd)(fmha_args, stream_config, aiter::fwd_mode::plain,
                                    [](size_t, bool) -> void* { return nullptr; }, &tuning, &seen, 7);
    std::printf("%g %d %g %d %s %d\n", a.ms, a.kernels, b.ms, b.kernels, QOLA_NAMESPACE_STR, te_qola_version()[0] != 0);
    return 0;
}
""",
}
# what each consumer prints (the values the fixture's functions compute)
EXPECTED = {
    "new": ["1", "129", "1193", str(128 * 64 * 8), "te", "1"],  # fwd: 64*2+1; bwd: 64*3+1+1000 (workspace given)
    "old": ["1", "229", "te", "1"],  # 64*2 + 1 + 100*how_v3_bf16_cvt (its default, 1)
    "future": ["132", "0", "136", "16", "te", "1"],  # 128+1+3; 128+1+0+7 and 5+1+10
}


# -- a GEMM module whose torch-free entry point is defined in its source by a macro (the shape of
# AITER's ctypes entry points), with the project's own tensor descriptor and macro
GEMM = {
    "csrc/include/aiter_tensor.h": """#pragma once
#include <cstdint>
struct aiter_tensor_t { void* ptr; int64_t sizes[2]; int64_t strides[2]; int dtype; };
typedef void* hipStream_t_fixture;
""",
    "csrc/include/entry_macros.h": """#pragma once
#define AITER_C_ITFS extern "C" __attribute__((visibility("default")))
#define AITER_CTYPES_ERROR_DEF static thread_local const char* g_last_error = nullptr;
#define AITER_CTYPES_DEFINE_ENTRYPOINT_VOID(func, DECL_ARGS, CALL_ARGS) \\
    static void func##_impl DECL_ARGS;                                  \\
    AITER_C_ITFS int func DECL_ARGS { func##_impl CALL_ARGS; return g_last_error ? -1 : 0; } \\
    static void func##_impl DECL_ARGS
""",
    "csrc/py_itfs_cu/asm_gemm_a4w4.cu": """#include "aiter_tensor.h"
#include "entry_macros.h"
AITER_CTYPES_ERROR_DEF

AITER_CTYPES_DEFINE_ENTRYPOINT_VOID(
    gemm_a4w4_asm,
    (aiter_tensor_t* A,       // A:[M, K/2]
     aiter_tensor_t* B,
     aiter_tensor_t* out,
     const char* kernelName,
     float alpha,
     int log2_k_split,
     hipStream_t_fixture stream),
    (A, B, out, kernelName, alpha, log2_k_split, stream))
{
    out->sizes[0] = A->sizes[0];
    out->sizes[1] = B->sizes[0];
    out->dtype = int(alpha) + log2_k_split + (kernelName && kernelName[0] ? 100 : 0);
}
""",
    "csrc/pybind/gemm_a4w4_asm_pybind.cu": "#error the pybind source of a cpp_itfs module is dropped\n",
}

GEMM_CONSUMER = r"""#include <cstdio>
#include "qola_gemm_a4w4_asm.h"
int main() {
    aiter_tensor_t a{}, b{}, out{};
    a.sizes[0] = 256; b.sizes[0] = 512;
    const int rc = QOLA_NS(gemm_a4w4_asm)(&a, &b, &out, "k", 2.0f, 1, nullptr);
    std::printf("%d %lld %lld %d\n", rc, (long long)out.sizes[0], (long long)out.sizes[1], out.dtype);
    return 0;
}
"""
GEMM_EXPECTED = ["0", "256", "512", "103"]


def write_gemm_tree(root: Path, arch: str) -> Path:
    table = {
        "module_gemm_a4w4_asm": {
            "srcs": [
                "f'{AITER_CSRC_DIR}/pybind/gemm_a4w4_asm_pybind.cu'",
                "f'{AITER_CSRC_DIR}/py_itfs_cu/asm_gemm_a4w4.cu'",
            ],
            "flags_extra_cc": [],
            "flags_extra_hip": [],
            "extra_ldflags": "None",
            "extra_include": [],
            "verbose": "False",
            "blob_gen_cmd": "''",
        }
    }
    files = {**GEMM, "aiter/jit/optCompilerConfig.json": json.dumps(table, indent=2)}
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    co = root / "hsa" / arch / "f4gemm" / "f4gemm_bf16_fixture.co"
    co.parent.mkdir(parents=True, exist_ok=True)
    co.write_bytes(b"\x7fELF fixture code object")
    return root
