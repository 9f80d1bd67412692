"""Every entry point QoLA exports for a module, where the tree declares it (issue 40 item 2).

QoLA's newer ``libmha_fwd`` wrapper forwards, besides ``mha_fwd``, the two native split-KV functions
(``mha_fwd_calculate_num_splits``, ``mha_fwd_workspace_size``: AITER with QoLA's 0008) and
``mha_fwd_with_sink_supported`` (0010); its ``libmha_bwd`` defines ``mha_bwd_workspace_size``. qola's
registry names all of them: a tree whose ``mha_fwd.h`` declares them gets them exported (under the
tree's own conditions), a tree that lacks one gets a plan note naming it, and a consumer that
declares it by hand gets a link error naming it.

The fixture tree is tests/support/itfs_fixture.py's ``new`` shape with a ``mha_fwd.h`` of the
project's own that declares the newer functions the way AITER's header is laid out; the consumer is
written in the shape of TE's newer ck_fused_attn_fwd.cpp / _bwd.cpp (the calls through QOLA_NS).
CUDA sm_90 (nvcc, the host's CI) and HIP gfx90a (marker hip: Debian's hipcc on the host).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import support.itfs_fixture as fx
from support.common import run_qola

SPLITKV = ("mha_fwd_calculate_num_splits", "mha_fwd_workspace_size")
SINK = "mha_fwd_with_sink_supported"

FWD_H = """#pragma once
// the two-argument generation, with the native split-KV and sink queries
#include <cstddef>
#include <string>
#include <variant>
#include <cstdint>
#include "ck_tile/host/stream_config.hpp"
namespace aiter {
struct mha_fwd_args {
    bool use_asm_v3; bool v3_api_check; std::string data_type; ck_tile::index_t hdim_q;
    int batch; int nhead_q; int seqlen_q; int sink_size = 0;
    std::variant<std::pair<uint64_t, uint64_t>, std::pair<const void*, const void*>> drop_seed_offset;
    int num_splits = 0;
    void* splitkv_workspace_ptr = nullptr;
};
__attribute__((visibility("default"))) float mha_fwd(mha_fwd_args args, const ck_tile::stream_config& s);
#if FA_WITH_NATIVE_SPLITKV
__attribute__((visibility("default"))) int mha_fwd_calculate_num_splits(const mha_fwd_args& a);
__attribute__((visibility("default"))) size_t mha_fwd_workspace_size(const mha_fwd_args& a);
#endif
@SINK@
} // namespace aiter
"""
SINK_DECL = """#if FA_WITH_SINK
__attribute__((visibility("default"))) bool mha_fwd_with_sink_supported(const mha_fwd_args& a);
#endif"""

FWD_CU = """#include "mha_fwd.h"
namespace aiter {
float mha_fwd(mha_fwd_args a, const ck_tile::stream_config& s)
{
    if(a.v3_api_check) return 1;
    return float(a.hdim_q * 2 + s.log_level_ + (a.num_splits > 0 && a.splitkv_workspace_ptr ? 500 : 0));
}
#if FA_WITH_NATIVE_SPLITKV
int mha_fwd_calculate_num_splits(const mha_fwd_args& a) { return a.data_type == "bf16" ? a.seqlen_q / 4 : -1; }
size_t mha_fwd_workspace_size(const mha_fwd_args& a)
{
    return a.num_splits <= 0 ? 0 : size_t(a.num_splits) * a.batch * a.nhead_q * a.seqlen_q * (a.hdim_q + 1) * 4;
}
#endif
#if FA_WITH_SINK
bool mha_fwd_with_sink_supported(const mha_fwd_args& a) { return a.hdim_q <= 128 && a.sink_size >= 0; }
#endif
}
"""

# TE's newer sources: the split count and workspace asked for before the call, the sink query, the
# bwd workspace through qola (CK's launcher is local to the library)
CONSUMER = r"""#include <cstdio>
#include "qola_mha_fwd.h"
#include "qola_mha_bwd.h"
static char pool[1 << 16];
int main() {
    aiter::mha_fwd_args fmha_args{};
    fmha_args.hdim_q = 64;
    fmha_args.data_type = "bf16";
    fmha_args.batch = 2; fmha_args.nhead_q = 4; fmha_args.seqlen_q = 8;
    const int num_splits = QOLA_NS(mha_fwd_calculate_num_splits)(fmha_args);
    fmha_args.num_splits = num_splits;
    const size_t fwd_ws = QOLA_NS(mha_fwd_workspace_size)(fmha_args);
    fmha_args.splitkv_workspace_ptr = pool;
    const bool sink = QOLA_NS(mha_fwd_with_sink_supported)(fmha_args);
    ck_tile::stream_config stream_config{nullptr, false, 1};
    const float fwd = QOLA_NS(mha_fwd)(fmha_args, stream_config);
    const size_t bwd_ws = QOLA_NS(mha_bwd_workspace_size)(fmha_bwd_traits{128, 64, true});
    std::printf("%d %zu %d %g %zu\n", num_splits, fwd_ws, int(sink), fwd, bwd_ws);
    return 0;
}
"""
# 8/4 splits; 2*2*4*8*65*4 bytes; sink supported; 64*2+1+500; 128*64*8
EXPECTED = ["2", str(2 * 2 * 4 * 8 * 65 * 4), "1", "629", str(128 * 64 * 8)]

# a consumer that declares the sink query itself (as TE's gfx1250 code declares its entry points)
HAND_SINK = r"""#include <cstdio>
#include "mha_fwd.h"
namespace qola { namespace te { bool mha_fwd_with_sink_supported(const aiter::mha_fwd_args& a); } }
int main() {
    aiter::mha_fwd_args a{};
    std::printf("%d\n", int(qola::te::mha_fwd_with_sink_supported(a)));
    return 0;
}
"""

FLAGS = ["-DFA_WITH_NATIVE_SPLITKV=1", "-DFA_WITH_SINK=1"]
ARCHS = [
    pytest.param(
        "sm_90",
        id="cuda",
        marks=pytest.mark.skipif(
            not shutil.which("nvcc") and not os.path.exists("/usr/local/cuda/bin/nvcc"), reason="needs nvcc"
        ),
    ),
    pytest.param("gfx90a", id="hip", marks=pytest.mark.hip),
]


def write_tree(root: Path, sink: bool = True) -> Path:
    """The ``new`` fixture tree with the newer ``mha_fwd.h`` (``sink``: it declares the sink query)
    and a table that compiles libmha_fwd with both switches on."""
    fx.write_tree(root, "new")
    (root / "csrc/include/mha_fwd.h").write_text(FWD_H.replace("@SINK@", SINK_DECL if sink else ""))
    (root / "csrc/cpp_itfs/mha_fwd.cu").write_text(FWD_CU)
    table_path = root / "aiter/jit/optCompilerConfig.json"
    table = json.loads(table_path.read_text())
    table["libmha_fwd"]["flags_extra_hip"] = [f"'{f}'" for f in FLAGS]
    table_path.write_text(json.dumps(table, indent=2))
    return root


def _plan(tmp: Path, tree: Path) -> dict[str, Any]:
    m = fx.manifest(tmp / "plan.toml", "new", "sm_90")
    proc = run_qola("plan", "--manifest", str(m), "--aiter-root", str(tree), "--json")
    assert proc.returncode == 0, proc.stderr
    data: dict[str, Any] = json.loads(proc.stdout)
    return data


def _notes(data: dict[str, Any], name: str) -> list[str]:
    return [w for w in data["warnings"] if f" {name} " in w and "libmha_fwd" in w]


def test_a_tree_lacking_an_entry_point_gets_a_note_naming_it(tmp_path: Path) -> None:
    old = fx.write_tree(tmp_path / "old", "new")  # mha_fwd alone
    data = _plan(tmp_path, old)
    for name in (*SPLITKV, SINK):
        (note,) = _notes(data, name)
        assert "declares no" in note and "not exported" in note, note
    apis = {m["name"]: m["api"]["signatures"] for m in data["modules"]}
    assert apis["libmha_fwd"] == ["float aiter::mha_fwd(mha_fwd_args args, const ck_tile::stream_config& s)"]
    # the newer tree: every one read, under the tree's own conditions, and no note
    data = _plan(tmp_path, write_tree(tmp_path / "newer"))
    assert not any(_notes(data, n) for n in (*SPLITKV, SINK))
    (fwd,) = [m for m in data["modules"] if m["name"] == "libmha_fwd"]
    assert fwd["api"]["signatures"] == [
        "float aiter::mha_fwd(mha_fwd_args args, const ck_tile::stream_config& s)",
        "int aiter::mha_fwd_calculate_num_splits(const mha_fwd_args& a)",
        "size_t aiter::mha_fwd_workspace_size(const mha_fwd_args& a)",
        "bool aiter::mha_fwd_with_sink_supported(const mha_fwd_args& a)",
    ]
    # one lacking the sink query alone: a note for it, none for the others
    data = _plan(tmp_path, write_tree(tmp_path / "nosink", sink=False))
    assert len(_notes(data, SINK)) == 1 and not any(_notes(data, n) for n in SPLITKV)


def _env(arch: str) -> dict[str, str]:
    return {**os.environ, "HIP_PLATFORM": "amd"} if arch.startswith("gfx") else dict(os.environ)


def _build(tmp: Path, tree: Path, arch: str) -> Path:
    out = tmp / f"out_{tree.name}"
    m = fx.manifest(tmp / f"{tree.name}.toml", "new", arch)
    proc = run_qola("build", "--manifest", str(m), "--aiter-root", str(tree), "-o", str(out), "-j", "2")
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    return out


def _link(tmp: Path, tree: Path, out: Path, arch: str, text: str) -> subprocess.CompletedProcess[str]:
    src, exe = tmp / "use.cpp", tmp / "use"
    src.write_text(text)
    cmd = fx.consumer_argv(tree, out, src, exe, arch, *FLAGS)
    return subprocess.run(cmd, capture_output=True, text=True, env=_env(arch))


def _symbols(out: Path, module: str) -> set[str]:
    nm = subprocess.run(
        ["nm", "-D", "--defined-only", str(out / "lib" / f"te_{module}.so")], capture_output=True, text=True
    )
    assert nm.returncode == 0, nm.stderr
    return {line.split()[-1] for line in nm.stdout.splitlines() if "_ZN4qola" in line}


def _mangled(name: str) -> str:
    return f"_ZN4qola2te{len(name)}{name}ERKN5aiter12mha_fwd_argsE"


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS)
def test_a_consumer_like_tes_newer_sources_links_against_every_entry_point(tmp_path: Path, arch: str) -> None:
    tree = write_tree(tmp_path / "newer")
    out = _build(tmp_path, tree, arch)
    assert _symbols(out, "libmha_fwd") == {
        "_ZN4qola2te7mha_fwdERKN5aiter12mha_fwd_argsERKN7ck_tile13stream_configE",
        *(_mangled(n) for n in (*SPLITKV, SINK)),
    }
    assert "_ZN4qola2te22mha_bwd_workspace_sizeERK15fmha_bwd_traits" in _symbols(out, "libmha_bwd")
    header = (out / "include" / "qola_mha_fwd.h").read_text()
    assert "#if FA_WITH_SINK\n" in header and "#if FA_WITH_NATIVE_SPLITKV\n" in header
    cc = _link(tmp_path, tree, out, arch, CONSUMER)
    assert cc.returncode == 0, cc.stderr[-4000:]
    run = subprocess.run([str(tmp_path / "use")], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.split() == EXPECTED


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS)
def test_an_entry_point_the_tree_lacks_is_a_link_error_naming_it(tmp_path: Path, arch: str) -> None:
    tree = write_tree(tmp_path / "nosink", sink=False)
    out = _build(tmp_path, tree, arch)
    assert _mangled(SINK) not in _symbols(out, "libmha_fwd")
    assert {_mangled(n) for n in SPLITKV} <= _symbols(out, "libmha_fwd")
    cc = _link(tmp_path, tree, out, arch, HAND_SINK)
    assert cc.returncode != 0
    assert "mha_fwd_with_sink_supported" in cc.stderr and "undefined" in cc.stderr, cc.stderr[-4000:]
