"""A kernel tree in AITER's layout whose backward and code-object loader have the shape of AITER at
Transformer Engine's pin (7a24cd87) where qola's fixes (qola/plan/fixes.py) change it: the same
statements the fixes look for, around the project's own small bodies (no AITER code). Host code
only, so it builds for sm_90 with nvcc and runs on any machine.

What the library does is written to ``$FIXTURE_LOG``, one event per line, so a test reads what a
call did: ``load <kernel> <first 16 bytes of its code object>``, ``launch <kernel>``, ``ck-run``
(the CK backward ran: it also writes 7.0 into dq), ``alloc <bytes> zero=<0|1>`` (the workspace
asked for). ``$FIXTURE_ARCH`` is the GPU the loader reports (default ``sm_90``, whose code object is
embedded); on gfx1250 the kernel table has bottom-right causal kernels only, as AITER's does.
"""

from __future__ import annotations

import json
from pathlib import Path

from support import itfs_fixture as fx
from support.gitrepo import git

COMMON = r"""#pragma once
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#ifdef AITER_EMBEDDED_HSA_HEADER
#include AITER_EMBEDDED_HSA_HEADER
#endif

inline void fixture_event(const std::string& what)
{
    const char* path = std::getenv("FIXTURE_LOG");
    if(FILE* f = path ? std::fopen(path, "a") : nullptr)
    {
        std::fprintf(f, "%s\n", what.c_str());
        std::fclose(f);
    }
}

inline std::string get_gpu_arch()
{
    const char* arch = std::getenv("FIXTURE_ARCH");
    return arch ? arch : "sm_90";
}

class AiterAsmKernel
{
    private:
    std::unique_ptr<char[]> hsaco_data;
    std::string name_;

    const void* load_hsaco_file(const char* kernel_name, const char* hsaco_path)
    {
        const char* AITER_ASM_DIR = std::getenv("AITER_ASM_DIR");
        std::string arch_name     = get_gpu_arch();
        if(AITER_ASM_DIR != nullptr)
        {
            std::string full_path = std::string(AITER_ASM_DIR) + "/" + arch_name + "/" + hsaco_path;
            std::ifstream file(full_path, std::ios::binary);
            hsaco_data.reset(new char[17]());
            file.read(hsaco_data.get(), 16);
            return file.gcount() == 16 ? hsaco_data.get() : nullptr;
        }
        else
        {
#if defined(AITER_EMBEDDED_HSA_HEADER) && defined(AITER_EMBEDDED_HSA_MAP)
            std::string fname = "hsa/" + arch_name + "/" + hsaco_path;
            auto hit          = AITER_EMBEDDED_HSA_MAP.find(fname);
            return hit == AITER_EMBEDDED_HSA_MAP.end() ? nullptr : hit->second.data();
#else
            return nullptr;
#endif
        }
    }

    public:
    AiterAsmKernel(const char* name, const char* hsaco) : name_(name)
    {
        const char* blob = static_cast<const char*>(load_hsaco_file(name, hsaco));
        fixture_event("load " + name_ + " " + (blob ? std::string(blob, 16) : std::string("(none)")));
    }
    void launch_kernel() { fixture_event("launch " + name_); }
};
"""

HEADER = r"""#pragma once
#include <functional>
#include <string>
#include "ck_tile/host/stream_config.hpp"
#include "fmha_bwd.hpp"
namespace aiter {
struct mha_bwd_args {
    bool use_asm_v3; bool v3_api_check; bool v3_atomic_fp32; bool is_group_mode; bool is_deterministic;
    int mask_type; int seqlen_q; int seqlen_k; int hdim_q;
    float* dq_ptr = nullptr;
    std::function<void*(size_t bytes, bool zero_init)> workspace_alloc{};
};
__attribute__((visibility("default"))) float mha_bwd(mha_bwd_args, const ck_tile::stream_config&);
float fmha_v3_bwd(mha_bwd_args, const ck_tile::stream_config&);
} // namespace aiter
"""

CK = r"""#pragma once
#include <cstddef>
#include <string>
void fixture_ck_event(const std::string& what);
struct fmha_bwd_traits { int seqlen_q; int hdim_q; bool is_deterministic; };
struct fmha_bwd_launcher {
    size_t workspace_size = 0;
    explicit fmha_bwd_launcher(const fmha_bwd_traits& t) : workspace_size(size_t(t.seqlen_q) * t.hdim_q * 4) {}
    float run(void* ws, float* dq) const { fixture_ck_event("ck-run"); if(dq) *dq = 7.0f; return ws ? 2.0f : 3.0f; }
};
"""

SOURCE = r"""#include "mha_bwd.h"
#include "aiter_hip_common.h"

void fixture_ck_event(const std::string& what) { fixture_event(what); }

namespace aiter {

float mha_bwd(mha_bwd_args a, const ck_tile::stream_config& s)
{
    float asm_ret = fmha_v3_bwd(a, s);
#if ONLY_FAV3
    return asm_ret;
#else
    if(asm_ret != -1)
        return asm_ret;

    if(a.is_group_mode && a.seqlen_q <= 0)
    {
        return -1;
    }

    const fmha_bwd_traits traits{a.seqlen_q, a.hdim_q, a.is_deterministic};
    fmha_bwd_launcher launcher(traits);
    void* workspace_ptr = a.workspace_alloc(launcher.workspace_size, /*zero_init=*/false);
    return launcher.run(workspace_ptr, a.dq_ptr);
#endif
}

float fmha_v3_bwd(mha_bwd_args a, const ck_tile::stream_config& s)
{
    std::string arch_id = get_gpu_arch();
    if((!a.use_asm_v3) || (a.hdim_q % 8 != 0) || (a.is_deterministic) ||
       ((arch_id != "sm_90") && (arch_id != "gfx1250")))
    {
        return -1;
    }
    int mt = a.mask_type; // 0: none, 1: top-left causal, 2: bottom-right causal
    if(arch_id == "gfx942" && !a.v3_atomic_fp32 && mt == 2 && a.seqlen_q == a.seqlen_k)
    {
        mt = 1; // the tree's own remap for gfx942
    }

    // the kernel table: gfx1250 has bottom-right causal kernels only
    std::string kernel = (arch_id == "gfx1250" && mt == 1) ? std::string() : "dqdkdv_m" + std::to_string(mt);
    if(kernel.empty())
    {
        return -1;
    }

    AiterAsmKernel* impl_ptr_dqdkdv = new AiterAsmKernel(kernel.c_str(), "fmha_v3_bwd/bwd_dqdkdv.co");

    if(a.v3_api_check)
        return 1;

    impl_ptr_dqdkdv->launch_kernel();
    return 0.5f + float(s.log_level_);
}

} // namespace aiter
"""

EMBEDDED = b"EMBEDDED-BLOB-01"  # the code object built into the library
ELSEWHERE = b"ELSEWHERE-BLOB01"  # another AITER's, under $AITER_ASM_DIR

DRIVER = r"""#include <cstdio>
#include <cstdlib>
#include <cstring>
#include "qola_mha_bwd.h"
// argv[1]: run | probe-yes (the assembly path can run it) | probe-no (it cannot: hdim 12) | det-group |
// gfx1250-causal; prints "ret=<r> dq=<dq>"
int main(int argc, char** argv)
{
    const char* what = argc > 1 ? argv[1] : "run";
    float dq = 0.0f;
    aiter::mha_bwd_args a{};
    a.use_asm_v3 = true; a.seqlen_q = 4; a.seqlen_k = 4; a.hdim_q = 8; a.dq_ptr = &dq;
    a.workspace_alloc = [](size_t n, bool zero) -> void* {
        char line[64]; std::snprintf(line, sizeof line, "alloc %zu zero=%d", n, zero ? 1 : 0);
        FILE* f = std::fopen(std::getenv("FIXTURE_LOG"), "a"); std::fprintf(f, "%s\n", line); std::fclose(f);
        static char buf[4096]; return buf;
    };
    if(!std::strncmp(what, "probe", 5)) a.v3_api_check = true;
    if(!std::strcmp(what, "probe-no")) a.hdim_q = 12;
    if(!std::strcmp(what, "det-group")) { a.is_deterministic = true; a.is_group_mode = true; }
    if(!std::strcmp(what, "gfx1250-causal")) { a.mask_type = 1; setenv("FIXTURE_ARCH", "gfx1250", 1); }
    ck_tile::stream_config s{};
    float r = QOLA_NS(mha_bwd)(a, s);
    std::printf("ret=%g dq=%g\n", r, dq);
    return 0;
}
"""


def write_tree(root: Path) -> Path:
    """The tree at ``root``: libmha_bwd (cpp_itfs) with the loader, the backward and one embedded
    code object for sm_90."""
    files = {
        "csrc/include/aiter_hip_common.h": COMMON,
        "csrc/include/mha_bwd.h": HEADER,
        "csrc/include/ck_lite/ck_tile/host/stream_config.hpp": fx.STREAM,
        "3rdparty/composable_kernel/example/ck_tile/01_fmha/fmha_bwd.hpp": CK,
        "csrc/cpp_itfs/mha_bwd.cu": SOURCE,
        "aiter/jit/optCompilerConfig.json": json.dumps({"libmha_bwd": fx._entry("mha_bwd.cu", [])}, indent=2),
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    blob = root / "hsa" / "sm_90" / "fmha_v3_bwd" / "bwd_dqdkdv.co"
    blob.parent.mkdir(parents=True)
    blob.write_bytes(EMBEDDED)
    return root


def other_asm_dir(root: Path) -> Path:
    """An ``$AITER_ASM_DIR`` of another AITER: the same code object's path, other bytes."""
    for arch in ("sm_90", "gfx1250"):
        p = root / arch / "fmha_v3_bwd" / "bwd_dqdkdv.co"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(ELSEWHERE)
    return root


def manifest(path: Path, fixes: str | None = None) -> Path:
    line = f"fixes = {fixes}\n" if fixes is not None else ""
    path.write_text(
        f'[qola]\nnamespace = "te"\n{line}[build]\narchitectures = ["sm_90"]\nmode = "cpp_itfs"\n'
        '[[modules]]\nname = "libmha_bwd"\n'
    )
    return path


def fixes_names() -> tuple[str, ...]:
    """Every fix qola declares, in its order (each one finds its code in this tree)."""
    from qola.plan.fixes import NAMES  # the project's own list: the tree is written to match every one

    return NAMES


def mirror(tmp: Path, archs: tuple[str, ...] = ()) -> tuple[Path, str, str]:
    """(a bare git mirror of the tree, commit 1: the main pin, commit 2: another pin, as TE's CK-free
    tier's manifest may have). ``archs``: code objects for these archs too."""
    work = write_tree(tmp / "work")
    for arch in archs:
        blob = work / "hsa" / arch / "fmha_v3_bwd" / "bwd_dqdkdv.co"
        blob.parent.mkdir(parents=True)
        blob.write_bytes(EMBEDDED)
    git(work, "init", "-q")
    git(work, "add", "-A")
    git(work, "commit", "-qm", "pin")
    first = git(work, "rev-parse", "HEAD")
    (work / "csrc/include/mha_bwd.h").write_text(HEADER + "// another pin\n")
    git(work, "commit", "-qam", "another pin")
    second = git(work, "rev-parse", "HEAD")
    git(tmp, "clone", "-q", "--bare", str(work), "aiter.git")
    return tmp / "aiter.git", first, second


def pinned_manifest(path: Path, commit: str, url: Path, ns: str = "te") -> Path:
    """:func:`manifest` pinning ``commit``, cloned from ``url``, in namespace ``ns``."""
    manifest(path)
    text = path.read_text().replace('namespace = "te"', f'namespace = "{ns}"')
    path.write_text(text.replace("[qola]\n", f'[qola]\naiter_commit = "{commit}"\naiter_url = "{url}"\n', 1))
    return path


def qola_patched(tree: Path) -> None:
    """What QoLA's checkout leaves in a tree: its patch applied in place (0007's shape)."""
    src = tree / "csrc/cpp_itfs/mha_bwd.cu"
    src.write_text(
        src.read_text().replace("return asm_ret;\n", "return asm_ret;\n    if(a.v3_api_check) return -1;\n", 1)
    )
