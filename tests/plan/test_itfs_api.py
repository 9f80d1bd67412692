"""The cpp_itfs API follows the tree (issue 22): fixture trees that declare AITER's old API, the
two-argument API of every TE pin since 2025-12-30, and an invented next shape are built by
`qola build`; the generated header and wrapper follow each, the libraries export only
``qola::<ns>::`` (and ``<ns>_``) symbols, and a consumer written in the shape of TE's
ck_fused_attn_fwd.cpp/_bwd.cpp compiles against OUT/include (plus the tree's own include dirs),
links with ``--no-undefined`` and computes through the libraries.

CUDA sm_90 (nvcc, the host's CI) and HIP gfx942 with hipcc 7 (marker rocm: the ROCm 7 env).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from support import itfs_fixture as fx
from support.common import run_qola

pytestmark = pytest.mark.slow

ARCHS = [pytest.param("sm_90", id="cuda"), pytest.param("gfx942", id="hip", marks=pytest.mark.rocm)]


def _env(arch: str) -> dict[str, str]:
    return {**os.environ, "HIP_PLATFORM": "amd"} if arch.startswith("gfx") else dict(os.environ)


def build(tmp: Path, shape: str, arch: str, ns: str = "te") -> tuple[Path, Path]:
    tree = fx.write_tree(tmp / shape, shape)
    out = tmp / f"out_{shape}"
    proc = run_qola(
        "build",
        "--manifest",
        str(fx.manifest(tmp / f"{shape}.toml", shape, arch, ns)),
        "--aiter-root",
        str(tree),
        "-o",
        str(out),
        "-j",
        "2",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    return tree, out


def consumer(
    tmp: Path, shape: str, tree: Path, out: Path, arch: str, text: str | None = None, ns: str = "te"
) -> list[str]:
    """Compile a consumer (TE's shape of it for ``shape``, or ``text``) against OUT/include and the
    tree's headers, link the ``<ns>_*.so`` libraries with --no-undefined, run it: its output words."""
    src = tmp / f"use_{shape}.cpp"
    src.write_text(fx.CONSUMER[shape] if text is None else text)
    exe = tmp / f"use_{shape}"
    cc = subprocess.run(
        fx.consumer_argv(tree, out, src, exe, "gfx942" if arch.startswith("gfx") else arch, ns=ns),
        capture_output=True,
        text=True,
        env=_env(arch),
    )
    assert cc.returncode == 0, cc.stderr[-4000:]
    run = subprocess.run([str(exe)], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    return run.stdout.split()


def exports(out: Path) -> dict[str, list[str]]:
    return {m["name"]: m["exports"] for m in json.loads((out / "manifest.json").read_text())["modules"]}


@pytest.mark.parametrize("arch", ARCHS)
def test_new_two_argument_api_with_workspace_size(tmp_path: Path, arch: str) -> None:
    tree, out = build(tmp_path, "new", arch)
    header = (out / "include" / "qola_mha_fwd.h").read_text()
    assert (
        "mha_fwd(\n    ::aiter::qola_api_te::mha_fwd_0_c0 args,\n    ::aiter::qola_api_te::mha_fwd_0_p1 s);" in header
    )
    assert "using mha_fwd_0_p1 = const ck_tile::stream_config&;" in header
    bwd = (out / "include" / "qola_mha_bwd.h").read_text()
    assert "#if FIXTURE_CK\nQOLA_NS_BEGIN\nQOLA_VISIBLE size_t mha_bwd_workspace_size(" in bwd
    ex = exports(out)
    assert ex["libmha_fwd"] == [
        "_ZN4qola2te7mha_fwdERKN5aiter12mha_fwd_argsERKN7ck_tile13stream_configE",
        "te_qola_version",
    ]
    assert set(ex["libmha_bwd"]) == {
        "_ZN4qola2te7mha_bwdERKN5aiter12mha_bwd_argsERKN7ck_tile13stream_configE",
        "_ZN4qola2te22mha_bwd_workspace_sizeERK15fmha_bwd_traits",
        "te_qola_version",
    }
    assert consumer(tmp_path, "new", tree, out, arch) == fx.EXPECTED["new"]
    plan = json.loads(
        run_qola("plan", "--manifest", str(tmp_path / "new.toml"), "--aiter-root", str(tree), "--json").stdout
    )
    apis = {m["name"]: m["api"]["signatures"] for m in plan["modules"]}
    assert apis == {
        "libmha_fwd": ["float aiter::mha_fwd(mha_fwd_args args, const ck_tile::stream_config& s)"],
        "libmha_bwd": [
            "float aiter::mha_bwd(mha_bwd_args, const ck_tile::stream_config&)",
            "size_t mha_bwd_workspace_size(const ::fmha_bwd_traits& traits)",
        ],
    }
    text = run_qola("plan", "--manifest", str(tmp_path / "new.toml"), "--aiter-root", str(tree)).stdout
    assert "  api         qola_mha_bwd.h, from the tree's csrc/include/mha_bwd.h" in text
    assert "size_t mha_bwd_workspace_size(const ::fmha_bwd_traits& traits)  (qola's)  [#if FIXTURE_CK]" in text


def qola_symbols(ns: str) -> dict[str, set[str]]:
    """What QoLA's own cpp_itfs libraries export for namespace ``ns`` (structs by const reference)."""
    q = f"_ZN4qola{len(ns)}{ns}"
    return {
        "libmha_fwd": {f"{q}7mha_fwdERKN5aiter12mha_fwd_argsERKN7ck_tile13stream_configE"},
        "libmha_bwd": {
            f"{q}7mha_bwdERKN5aiter12mha_bwd_argsERKN7ck_tile13stream_configE",
            f"{q}22mha_bwd_workspace_sizeERK15fmha_bwd_traits",
        },
    }


# TE's hand-written declarations of QoLA's entry points (its gfx1250 code declares them itself
# instead of including QoLA's headers): structs by const reference; the namespace is filled in
HAND_WRITTEN = r"""#include <cstdio>
#include "mha_fwd.h"
#include "mha_bwd.h"
namespace qola { namespace NS {
float mha_fwd(const aiter::mha_fwd_args& args, const ck_tile::stream_config& stream_config);
float mha_bwd(const aiter::mha_bwd_args& args, const ck_tile::stream_config& stream_config);
size_t mha_bwd_workspace_size(const fmha_bwd_traits& traits);
} }
int main() {
    aiter::mha_fwd_args f{};
    f.hdim_q = 32;
    aiter::mha_bwd_args b{};
    b.hdim_q = 32;
    ck_tile::stream_config s{nullptr, false, 2};
    std::printf("%g %g %zu\n", qola::NS::mha_fwd(f, s), qola::NS::mha_bwd(b, s),
                qola::NS::mha_bwd_workspace_size(fmha_bwd_traits{4, 8, false}));
    return 0;
}
"""


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("ns", ["te", "te_v3"])
def test_exports_are_qolas_symbols_and_hand_written_prototypes_link(tmp_path: Path, arch: str, ns: str) -> None:
    """Issue 31: the libraries export QoLA's symbols (a struct the tree takes by value is taken by
    const reference), and a consumer that declares them by hand, as TE's gfx1250 code does for
    ``te_v3``, links with --no-undefined and computes through them."""
    tree, out = build(tmp_path, "new", arch, ns)
    for module, want in qola_symbols(ns).items():
        nm = subprocess.run(
            ["nm", "-D", "--defined-only", str(out / "lib" / f"{ns}_{module}.so")], capture_output=True, text=True
        )
        assert nm.returncode == 0, nm.stderr
        assert {line.split()[-1] for line in nm.stdout.splitlines() if "_ZN4qola" in line} == want, nm.stdout
    # fwd 32*2+2, bwd 32*3+2 (no workspace_alloc), workspace 4*8*4
    assert consumer(tmp_path, "hand", tree, out, arch, HAND_WRITTEN.replace("NS", ns), ns) == ["66", "98", "128"]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("shape", ["old", "future"])
def test_old_and_an_invented_api_follow_the_tree(tmp_path: Path, arch: str, shape: str) -> None:
    tree, out = build(tmp_path, shape, arch)
    (name,) = [n for n in exports(out)["libmha_fwd"] if n.startswith("_ZN")]
    assert name.startswith("_ZN4qola2te7mha_fwdE")
    assert all(n.startswith(("_ZN4qola2te", "te_")) for n in exports(out)["libmha_fwd"])
    assert consumer(tmp_path, shape, tree, out, arch) == fx.EXPECTED[shape]
    if shape == "future":  # the tree's inline namespace reopened inline, its enum default looked up there
        header = (out / "include" / "qola_mha_fwd.h").read_text()
        assert "namespace aiter { inline namespace v4 { namespace qola_api_te {" in header
        assert "inline auto mha_fwd_0_d2() { return fwd_mode::fast; }" in header


@pytest.mark.skipif(not shutil.which("nvcc") and not os.path.exists("/usr/local/cuda/bin/nvcc"), reason="needs nvcc")
def test_module_whose_api_cannot_be_read_fails_naming_header_and_function(tmp_path: Path) -> None:
    tree = fx.write_tree(tmp_path / "t", "new")
    m = fx.manifest(tmp_path / "m.toml", "new", "sm_90")
    (tree / "csrc" / "include" / "mha_bwd.h").write_text("namespace aiter { float mha_bwd(int, ...); }\n")
    proc = run_qola("plan", "--manifest", str(m), "--aiter-root", str(tree))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "mha_bwd.h: mha_bwd:" in proc.stderr and "variadic" in proc.stderr, proc.stderr
    (tree / "csrc" / "include" / "mha_bwd.h").unlink()
    proc = run_qola("build", "--manifest", str(m), "--aiter-root", str(tree), "-o", str(tmp_path / "out"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "mha_bwd.h, the header that declares its C++ API (mha_bwd)" in proc.stderr, proc.stderr
    assert not (tmp_path / "out" / "lib").exists()


GEMM_ARCHS = [pytest.param("sm_90", id="cuda"), pytest.param("gfx950", id="hip", marks=pytest.mark.rocm)]


@pytest.mark.parametrize("arch", GEMM_ARCHS)
def test_gemm_entry_point_defined_by_a_macro_in_the_source(tmp_path: Path, arch: str) -> None:
    """module_gemm_a4w4_asm's torch-free entry point is a ctypes one AITER defines in its .cu with a
    macro: qola reads it there, the wrapper declares it, the public header needs aiter_tensor.h only."""
    tree = fx.write_gemm_tree(tmp_path / "t", arch)
    m = tmp_path / "g.toml"
    m.write_text(
        f'[qola]\nnamespace = "te"\n[build]\narchitectures = ["{arch}"]\nmode = "cpp_itfs"\n'
        '[[modules]]\nname = "module_gemm_a4w4_asm"\nmd_name = "libgemm_a4w4_asm"\n'
    )
    out = tmp_path / "out"
    proc = run_qola("build", "--manifest", str(m), "--aiter-root", str(tree), "-o", str(out), "-j", "2")
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    header = (out / "include" / "qola_gemm_a4w4_asm.h").read_text()
    assert '#include "aiter_tensor.h"' in header and "asm_gemm_a4w4.cu" not in header.split("*/", 1)[1]
    (mod,) = json.loads((out / "manifest.json").read_text())["modules"]
    assert mod["artifact"] == "lib/te_libgemm_a4w4_asm.so"
    assert mod["exports"] == ["_ZN4qola2te13gemm_a4w4_asmEP14aiter_tensor_tS2_S2_PKcfiPv", "te_qola_version"]
    src = tmp_path / "use.cpp"
    src.write_text(fx.GEMM_CONSUMER)
    exe = tmp_path / "use"
    cxx = ["hipcc", "-x", "hip", "--offload-arch=gfx950"] if arch.startswith("gfx") else ["g++"]
    cc = subprocess.run(
        [
            *cxx,
            "-std=c++17",
            f"-I{out / 'include'}",
            f"-I{tree / 'csrc' / 'include'}",
            str(src),
            "-o",
            str(exe),
            f"-L{out / 'lib'}",
            "-l:te_libgemm_a4w4_asm.so",
            "-Wl,--no-undefined",
            f"-Wl,-rpath,{out / 'lib'}",
        ],
        capture_output=True,
        text=True,
        env=_env(arch),
    )
    assert cc.returncode == 0, cc.stderr[-4000:]
    run = subprocess.run([str(exe)], capture_output=True, text=True)
    assert run.returncode == 0 and run.stdout.split() == fx.GEMM_EXPECTED, run.stdout + run.stderr


@pytest.mark.aiter
@pytest.mark.parametrize(
    "name,header",
    [("module_gemm_a4w4_asm", "asm_gemm_a4w4.cu"), ("module_gemm_a4w4_blockscale", "gemm_a4w4_blockscale.h")],
)
def test_sdist_gemm_modules_are_not_torch_free_and_say_so(
    aiter_root: Path, tmp_path: Path, name: str, header: str
) -> None:
    """The amd-aiter 0.1.7 sdist has both GEMM modules, but their entry points take torch::Tensor:
    a cpp_itfs plan refuses them naming the declaration, instead of a build failing in torch headers."""
    m = tmp_path / "g.toml"
    m.write_text(
        f'[qola]\nnamespace = "te"\n[build]\narchitectures = ["gfx950"]\nmode = "cpp_itfs"\n'
        f'[[modules]]\nname = "{name}"\n'
    )
    proc = run_qola("plan", "--manifest", str(m), "--aiter-root", str(aiter_root))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert header in proc.stderr and "torch::Tensor" in proc.stderr and "not torch-free" in proc.stderr, proc.stderr


@pytest.mark.skipif(not shutil.which("nvcc") and not os.path.exists("/usr/local/cuda/bin/nvcc"), reason="needs nvcc")
def test_a_changed_tree_header_changes_the_api_on_rebuild(tmp_path: Path) -> None:
    tree, out = build(tmp_path, "new", "sm_90")
    header = tree / "csrc" / "include" / "mha_fwd.h"
    header.write_text(
        header.read_text().replace(
            "const ck_tile::stream_config& s);", "const ck_tile::stream_config& s, int extra = 7);"
        )
    )
    src = tree / "csrc" / "cpp_itfs" / "mha_fwd.cu"
    src.write_text(
        src.read_text().replace("const ck_tile::stream_config& s)\n", "const ck_tile::stream_config& s, int)\n")
    )
    proc = run_qola(
        "build", "--manifest", str(tmp_path / "new.toml"), "--aiter-root", str(tree), "-o", str(out), "-j", "2"
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    assert "mha_fwd_0_p2 extra = 7);" in (out / "include" / "qola_mha_fwd.h").read_text()
    assert exports(out)["libmha_fwd"][0] == "_ZN4qola2te7mha_fwdERKN5aiter12mha_fwd_argsERKN7ck_tile13stream_configEi"
