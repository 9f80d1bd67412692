"""Real AITER (the amd-aiter sdist) compiled with a ROCm 7 compiler for gfx942 and gfx950.

Runs in the project's ROCm 7 environment (``scripts/rocm7.sh run python -m pytest -m rocm``):
Debian's hipcc 7.0.2 with HIP 6.4 and clang 21. Nothing runs on an AMD GPU; what a build can
prove is checked: exported symbols, device code objects per arch in the fat binary, complete
dispatch files, byte-exact embedded code objects, consumers that link and load the libraries.

The compile set is Transformer Engine's manifest shape narrowed by variants to a slice that fits
CI: one fMHA forward kernel and one backward kernel (+ its dot_do_o/convert_dq kernels).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NamedTuple, cast

import pytest
from support.common import cmake_build, run_qola
from support.libdata import bundles, embedded_blobs, fatbin_section, kernels_by_arch
from support.rocm_aiter import ARCHS, DROP, FWD, HIP_VERSION, NS, build, manifest

from qola.hooks import embed
from qola.output import kernels

pytestmark = [pytest.mark.rocm, pytest.mark.aiter, pytest.mark.slow]
ck = pytest.mark.ck  # compiles CK fMHA instances: minutes each with clang 21 (docs/benchmarks.md)


def record(out: Path) -> dict[str, Any]:
    return cast("dict[str, Any]", json.loads((out / "manifest.json").read_text()))


@ck
def test_te_libraries_built_from_ck_instances(te: Any) -> None:
    data = record(te)
    assert data["toolchain"]["version"].startswith(HIP_VERSION)
    assert data["toolchain"]["removed_flags"] == list(DROP)
    assert "-amdgpu-early-inline-all=true" not in data["toolchain"]["flags"]
    assert "-amdgpu-function-calls=false" in data["toolchain"]["flags"]  # the rest of AITER's set
    mods = {m["name"]: m for m in data["modules"]}
    assert set(mods) == {"libmha_fwd", "libmha_bwd"}
    for name, m in mods.items():
        assert m["status"] == "built", m
        assert m["artifact"] == f"lib/{NS}_{name}.so"
        names = m["instances"]["names"]
        kernels = [n for n in names if n.startswith("fmha_") and n.endswith(("_gfx9", "_gfx950"))]
        assert kernels, names
        # the declared slice, nothing else: every CK kernel is d32 bf16, batch mode
        assert all("_d32_bf16_" in n and "_batch_" in n for n in kernels), kernels
    fwd = mods["libmha_fwd"]["instances"]["names"]
    assert {n.rsplit("_", 1)[-1] for n in fwd if n.startswith("fmha_fwd_d")} == {"gfx9", "gfx950"}  # both arch files
    # both archs' v3 asm APIs: AITER's table names one (get_asm_dir()), qola runs the generator per arch
    assert {f"asm_fmha_fwd_v3_{a}" for a in ARCHS} <= set(fwd), fwd


@ck
def test_audit_clean(te: Any) -> None:
    proc = run_qola("audit", str(te))
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _defined_dynamic(lib: Path) -> list[str]:
    from elftools.elf.elffile import ELFFile
    from elftools.elf.sections import SymbolTableSection

    with open(lib, "rb") as f:
        dyn = ELFFile(f).get_section_by_name(".dynsym")
        assert isinstance(dyn, SymbolTableSection)
        return [
            s.name
            for s in dyn.iter_symbols()
            if s.name and s["st_shndx"] != "SHN_UNDEF" and s["st_info"]["bind"] in ("STB_GLOBAL", "STB_WEAK")
        ]


@ck
def test_only_namespace_symbols_exported(te: Any) -> None:
    for name, entry in (("libmha_fwd", "mha_fwd"), ("libmha_bwd", "mha_bwd")):
        lib = te / "lib" / f"{NS}_{name}.so"
        syms = _defined_dynamic(lib)
        assert syms and all(s.startswith((f"_ZN4qola{len(NS)}{NS}", f"{NS}_")) for s in syms), syms
        assert any(s.startswith(f"_ZN4qola2te{len(entry)}{entry}") for s in syms), syms  # qola::te::mha_fwd
        assert f"{NS}_qola_version" in syms
        # nothing of AITER's or CK's own namespaces (ck_tile types do appear as parameter types)
        assert not any(s.startswith(("_ZN5aiter", "_ZN7ck_tile", "_ZNK7ck_tile", "aiter", "ck_")) for s in syms)


@ck
@pytest.mark.parametrize("name,kernel", [("libmha_fwd", "FmhaFwdKernel"), ("libmha_bwd", "FmhaBwd")])
def test_device_code_for_both_archs(te: Any, name: str, kernel: str, tmp_path: Path) -> None:
    lib = te / "lib" / f"{NS}_{name}.so"
    found = kernels_by_arch(lib)
    assert set(ARCHS) <= set(found), sorted(found)
    for arch in ARCHS:
        assert any(kernel in k for k in found[arch]), (arch, sorted(found[arch])[:10])
    # cross-check the bundle reader against the compiler's own tools, on one instance object: its
    # .hip_fatbin section (llvm-objcopy) listed by clang-offload-bundler
    obj = next((Path(f"{te}.build") / "obj" / name).glob("fmha_*_d[0-9]*_gfx9-*.o"))
    fatbin = tmp_path / "fatbin.bin"
    dump = subprocess.run(
        ["llvm-objcopy", f"--dump-section=.hip_fatbin={fatbin}", str(obj), str(tmp_path / "x.o")],
        capture_output=True,
        text=True,
        env=_llvm_env(),
    )
    assert dump.returncode == 0, dump.stderr
    listed = subprocess.run(
        ["clang-offload-bundler", "--list", "--type=o", f"--input={fatbin}"],
        capture_output=True,
        text=True,
        env=_llvm_env(),
    )
    assert listed.returncode == 0, listed.stderr
    mine = {t for b in bundles(fatbin_section(obj)) for t, _ in b}
    assert set(listed.stdout.split()) == mine and any(t.endswith("gfx942") for t in mine), (listed.stdout, mine)


class Gfx942(NamedTuple):
    out: Path
    stderr: str  # what the build printed: the ROCm pin's warning (test_rocm7_pin_is_explained)


@pytest.fixture(scope="module")
def gfx942_only(aiter_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Gfx942:
    """One gfx942 build of the narrowed manifest, pinned to "ROCm 7" (HIP 7) where this compiler is
    HIP 6.4: the pin's warning is checked on the same build (a build of its own cost 82 s in CI)."""
    tmp = tmp_path_factory.mktemp("gfx942")
    proc, out = build(tmp, aiter_root, manifest(tmp / "one.toml", NS, ("gfx942",), rocm="7"))
    assert proc.returncode == 0, proc.stdout + proc.stderr[-6000:]
    return Gfx942(out, proc.stderr)


@ck
def test_a_gfx942_build_compiles_no_gfx950_file(gfx942_only: Gfx942) -> None:
    """CK gets --targets=gfx942 from the plan: no _gfx950 twin is generated or compiled, and the
    library holds gfx942 code only (its code objects per arch listed from the fat binary)."""
    (mod,) = record(gfx942_only.out)["modules"]
    names = mod["instances"]["names"]
    assert [n for n in names if n.startswith("fmha_fwd_d")] and not [n for n in names if n.endswith("_gfx950")]
    objs = [p.name for p in (gfx942_only.out.parent / "out.build" / "obj" / "libmha_fwd").rglob("*.o")]
    assert objs and not [o for o in objs if "_gfx950" in o], objs
    found = kernels.device_code_objects(gfx942_only.out / "lib" / f"{NS}_libmha_fwd.so")
    assert list(found) == ["gfx942"] and any("FmhaFwdKernel" in k for k in found["gfx942"]), found


@ck
def test_same_kernels_per_arch_as_the_two_arch_build(te: Any, gfx942_only: Gfx942) -> None:
    """The gfx942 code objects of a gfx942-only build hold exactly the fMHA forward kernels the
    two-arch build holds for gfx942 (the _gfx950 twin only ever held gfx950 code)."""
    both = kernels.device_code_objects(te / "lib" / f"{NS}_libmha_fwd.so")
    one = kernels.device_code_objects(gfx942_only.out / "lib" / f"{NS}_libmha_fwd.so")
    assert sorted(both) == list(ARCHS) and list(one) == ["gfx942"]

    def fwd(ks: Iterable[str]) -> set[str]:
        return {k for k in ks if "FmhaFwdKernel" in k}

    assert fwd(one["gfx942"]) == fwd(both["gfx942"]) and fwd(both["gfx950"]), (both, one)


def _llvm_env() -> dict[str, str]:
    llvm = sorted(Path("/usr/lib").glob("llvm-*/bin"))
    return {**os.environ, "PATH": os.pathsep.join([*(str(p) for p in llvm[-1:]), os.environ.get("PATH", "")])}


@ck
@pytest.mark.parametrize("name,api", [("libmha_fwd", "fmha_fwd_api.cpp"), ("libmha_bwd", "fmha_bwd_api.cpp")])
def test_dispatch_file_calls_exactly_the_instances(te: Any, name: str, api: str) -> None:
    blob = Path(f"{te}.build") / "gen" / name / "blob"
    special = re.compile(r"template\s*<>\s*(?:float|void)\s+(fmha_\w+_)<\s*([^(]*?)\s*>\s*\(", re.S)
    defined = set()
    for f in blob.glob("fmha_*_d*.cpp"):
        text = f.read_text()
        aliases = dict(re.findall(r"using (\w+)\s*=\s*([^;]+);", text))  # trait_, fmha_mask_0, ...
        for fn, args in special.findall(text):
            first, _, rest = args.partition(",")
            trait = first.strip()
            for _ in range(4):  # the trait's aliases spelled out, as the dispatch file spells them
                trait = re.sub(r"\b\w+\b", lambda m: aliases.get(m.group(0), m.group(0)), trait)
            defined.add((fn, " ".join(trait.split()), " ".join(rest.split())))
    assert defined
    called = set()
    text = (blob / api).read_text()
    for trait, fn, arch in re.findall(r"using trait_\s*=\s*([^;]+);\s*return (fmha_\w+_)<trait_,\s*([^>]+)>", text):
        called.add((fn, " ".join(trait.split()), " ".join(arch.split())))
    norm = lambda s: re.sub(r"\s+", "", s)  # noqa: E731
    assert {tuple(map(norm, d)) for d in defined if d[0] in {c[0] for c in called}} == {
        tuple(map(norm, c)) for c in called
    }


@ck
@pytest.mark.parametrize("name,kind", [("libmha_fwd", "fmha_v3_fwd"), ("libmha_bwd", "fmha_v3_bwd")])
def test_embedded_code_objects_byte_exact(te: Any, aiter_root: Path, name: str, kind: str) -> None:
    lib = te / "lib" / f"{NS}_{name}.so"
    found, _ = embedded_blobs(lib, embed.symbol_prefix(NS, name), embed.ALIGN)
    hsa = aiter_root / "aiter_meta" / "hsa"
    want = {b.key: b.path for b in embed.collect(hsa, list(ARCHS), [kind])}
    assert want and set(found) == set(want)
    assert {k.split("/")[1] for k in want} == set(ARCHS)
    for key, path in want.items():
        assert found[key] == Path(path).read_bytes(), key


C_MAIN = r"""#include <stdio.h>
extern const char* te_qola_version(void);
int main(void) { printf("qola %s\n", te_qola_version()); return 0; }
"""


@ck
def test_c_and_cmake_consumers_link_and_load(te: Any, tmp_path: Path) -> None:
    src = tmp_path / "use.c"
    src.write_text(C_MAIN)
    lib = te / "lib"
    exe = tmp_path / "use"
    cc = subprocess.run(
        [
            "cc",
            str(src),
            "-o",
            str(exe),
            f"-L{lib}",
            f"-l:{NS}_libmha_fwd.so",
            f"-l:{NS}_libmha_bwd.so",
            f"-Wl,-rpath,{lib}",
        ],
        capture_output=True,
        text=True,
    )
    assert cc.returncode == 0, cc.stderr
    run = subprocess.run([str(exe)], capture_output=True, text=True)
    assert run.returncode == 0 and run.stdout.startswith("qola "), run.stdout + run.stderr
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "CMakeLists.txt").write_text(
        f"cmake_minimum_required(VERSION 3.16)\nproject(use C CXX)\nfind_package(qola-{NS} REQUIRED)\n"
        f"add_executable(use {src})\n"
        f"target_link_libraries(use PRIVATE qola::{NS}::libmha_fwd qola::{NS}::libmha_bwd)\n"
    )
    bld = tmp_path / "build"
    cmake_build(proj, bld, te)
    run = subprocess.run(
        [str(bld / "use")], capture_output=True, text=True, env={**os.environ, "LD_LIBRARY_PATH": str(lib)}
    )
    assert run.returncode == 0 and run.stdout.startswith("qola "), run.stdout + run.stderr


# A consumer in the shape of TE's ck_fused_attn_fwd.cpp / _bwd.cpp (one source each, as TE has: this
# CK's fmha_fwd.hpp and fmha_bwd.hpp cannot share a translation unit) for the AITER generation the sdist
# has (the twelve/fifteen-parameter API): populate the args, the v3 dry-run probe and the call through
# QOLA_NS. The calls run only when asked to (argv[1] == "call": no GPU here); linking with
# --no-undefined against both libraries is what proves every call resolves to them.
CXX_FWD = r"""#include "qola_mha_fwd.h"
float te_fwd(bool probe_only) {
    aiter::mha_fwd_args fmha_args{};
    fmha_args.hdim_q = 32;
    fmha_args.hdim_v = 32;
    fmha_args.batch = 1;
    ck_tile::stream_config stream_config{nullptr, false, 0};
    if(probe_only)
        return QOLA_NS(mha_fwd)(fmha_args, stream_config, "bf16", false, mask_enum::no_mask, bias_enum::no_bias,
                                true, true, 1, nullptr, nullptr, true);
    return QOLA_NS(mha_fwd)(fmha_args, stream_config, "bf16", false, mask_enum::no_mask, bias_enum::no_bias, true,
                            true);
}
bool te_fwd_resolves() { auto fn = &QOLA_NS(mha_fwd); return fn != nullptr; }
"""
CXX_BWD = r"""#include "qola_mha_bwd.h"
float te_bwd(bool probe_only) {
    aiter::mha_bwd_args bwd_args{};
    ck_tile::stream_config stream_config{nullptr, false, 0};
    return QOLA_NS(mha_bwd)(bwd_args, stream_config, "bf16", false, mask_enum::no_mask, bias_enum::no_bias, false,
                            false, false, true, true, 1, nullptr, nullptr, probe_only);
}
"""
CXX_MAIN = r"""#include <cstdio>
#include <cstring>
#include "qola_common.h"
float te_fwd(bool);
float te_bwd(bool);
bool te_fwd_resolves();
int main(int argc, char** argv) {
    if(argc > 1 && std::strcmp(argv[1], "call") == 0)
        std::printf("%g %g %g\n", te_fwd(true), te_fwd(false), te_bwd(false));
    std::printf("%s %d\n", te_qola_version(), te_fwd_resolves());
}
"""


@ck
def test_te_shaped_consumer_compiles_and_links_no_undefined(te: Any, aiter_root: Path, tmp_path: Path) -> None:
    srcs = []
    for name, text in (("fwd", CXX_FWD), ("bwd", CXX_BWD), ("main", CXX_MAIN)):
        srcs.append(tmp_path / f"{name}.cpp")
        srcs[-1].write_text(text)
    meta = aiter_root / "aiter_meta"
    # what a consumer adds for the tree's own headers (docs/integration.md): AITER's csrc/include,
    # CK's include and its 01_fmha example dir
    inc = [
        te / "include",
        meta / "csrc" / "include",
        meta / "3rdparty" / "composable_kernel" / "include",
        meta / "3rdparty" / "composable_kernel" / "example" / "ck_tile" / "01_fmha",
    ]
    header = (te / "include" / "qola_mha_fwd.h").read_text()
    assert "::aiter::qola_api_te::mha_fwd_0_p11 is_v3_api_check = false);" in header  # the tree's 12 parameters
    assert "mha_bwd_workspace_size" not in (te / "include" / "qola_mha_bwd.h").read_text()  # this CK predates it
    exe = tmp_path / "use"
    cc = subprocess.run(
        [
            "hipcc",
            "-std=c++20",
            *(f"-I{d}" for d in inc),
            *map(str, srcs),
            "-o",
            str(exe),
            f"-L{te / 'lib'}",
            f"-l:{NS}_libmha_fwd.so",
            f"-l:{NS}_libmha_bwd.so",
            "-Wl,--no-undefined",
            f"-Wl,-rpath,{te / 'lib'}",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "HIP_PLATFORM": "amd"},
    )
    assert cc.returncode == 0, cc.stderr[-4000:]
    run = subprocess.run([str(exe)], capture_output=True, text=True)
    assert run.returncode == 0 and run.stdout.split()[-1] == "1", run.stdout + run.stderr
    undefined = subprocess.run(["nm", "-D", "--undefined-only", str(exe)], capture_output=True, text=True).stdout
    for entry in ("mha_fwd", "mha_bwd"):  # what the consumer takes from each library: its qola::te:: entry point
        assert f"_ZN4qola2te7{entry}E" in undefined, undefined


@ck
def test_static_archives_of_two_namespaces_link_into_one_program(aiter_root: Path, tmp_path: Path) -> None:
    # the two builds run side by side (one job each): one CK instance each, minutes with clang 21
    procs = {}
    for ns in ("ta", "tb"):
        m = manifest(tmp_path / f"{ns}.toml", ns, ("gfx942",), link="static")
        procs[ns] = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "qola",
                "build",
                "--manifest",
                str(m),
                "--aiter-root",
                str(aiter_root),
                "-o",
                str(tmp_path / f"out_{ns}"),
                "-j",
                "1",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
    for ns, proc in procs.items():
        text, _ = proc.communicate()
        assert proc.returncode == 0, text[-6000:]
        assert (tmp_path / f"out_{ns}" / "lib" / f"{ns}_libmha_fwd.a").is_file()
    main = tmp_path / "main.c"
    main.write_text(
        "#include <stdio.h>\nextern const char* ta_qola_version(void);\n"
        "extern const char* tb_qola_version(void);\n"
        'int main(void) { printf("%s %s\\n", ta_qola_version(), tb_qola_version()); return 0; }\n'
    )
    exe, obj = tmp_path / "prog", tmp_path / "main.o"
    assert subprocess.run(["cc", "-c", str(main), "-o", str(obj)]).returncode == 0
    # hipcc as the linker (it adds the HIP runtime); main is an object: hipcc's `-x c` for a .c file
    # would also apply to the archives after it
    link = subprocess.run(
        [
            "hipcc",
            str(obj),
            str(tmp_path / "out_ta/lib/ta_libmha_fwd.a"),
            str(tmp_path / "out_tb/lib/tb_libmha_fwd.a"),
            "-o",
            str(exe),
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "HIP_PLATFORM": "amd"},
    )
    assert link.returncode == 0, link.stderr[-4000:]  # no duplicate symbols between the two copies
    run = subprocess.run([str(exe)], capture_output=True, text=True)
    assert run.returncode == 0 and len(run.stdout.split()) == 2, run.stdout + run.stderr


JIT = """
[jit]
modules = ["libmha_fwd"]

[[jit.aot.mha_fwd_variants]]
dtype = "bf16"
name = "*_d32_*_b128x64x16x32x32x32_*_psddv_*"
"""


@ck
def test_jit_build_and_prebuild_of_deferred_ck_instances(aiter_root: Path, tmp_path: Path) -> None:
    # three forward kernels for gfx942: one ahead of time, two deferred to the JIT
    three = FWD.replace("hdim = 32\n", "hdim = [32, 64]\n") + (
        'name = ["*_d32_*_b128x64x16x32x32x32_*_psddv_*", "*_d32_*_b128x64x16x32x32x32_*_psskddv_*", '
        '"*_d64_*_b128x64x32x64x32x64_*_psddv_*"]\n'
    )
    assert "hdim = [32, 64]" in three  # the replace took
    m = manifest(tmp_path / "jit.toml", NS, ("gfx942",), extra=JIT, fwd_variant=three)
    proc, out = build(tmp_path, aiter_root, m)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-6000:]
    (mod,) = record(out)["modules"]
    # a gfx942 build: qola passes CK --targets=gfx942, so each kernel is one _gfx9 file (no _gfx950 twin)

    def kernels(part: str) -> set[str]:
        return {n.rsplit("_", 1)[0] for n in mod["jit"][part]["names"] if n.startswith("fmha_fwd_d")}

    assert not [n for part in ("aot", "deferred") for n in mod["jit"][part]["names"] if n.endswith("_gfx950")]
    assert kernels("aot") == {n for n in kernels("aot") if "_d32_" in n and "_psddv_" in n} and len(kernels("aot")) == 1
    assert len(kernels("deferred")) == 2 and mod["jit"]["deferred"]["count"] == 2, mod["jit"]
    assert set(mod["jit"]["aot"]["names"]) - {n for n in mod["jit"]["aot"]["names"] if n.startswith("fmha_fwd_d")} <= {
        "mha_fwd",
        "asm_fmha_fwd_v3_gfx942",
    }  # AITER's API and v3 dispatch: no instances, never deferred
    cache = tmp_path / "cache"
    pre = run_qola("jit", "--cache-dir", str(cache), "prebuild", str(out), "-j", "2")
    assert pre.returncode == 0, pre.stdout + pre.stderr[-4000:]
    ls = run_qola("jit", "--cache-dir", str(cache), "ls", str(out))
    assert ls.returncode == 0 and "ready" in ls.stdout, ls.stdout + ls.stderr
    ver = run_qola("jit", "--cache-dir", str(cache), "verify")
    assert ver.returncode == 0, ver.stdout + ver.stderr
    entries = list(cache.rglob("*.so"))
    assert len(entries) == mod["jit"]["deferred"]["count"], entries
    for so in entries:
        assert "gfx942" in {t.rsplit("-", 1)[-1] for b in bundles(fatbin_section(so)) for t, _ in b}


def test_pybind_module_from_the_real_table(aiter_root: Path, tmp_path: Path) -> None:
    """AITER's aiter_enum_pybind.cu spells PYBIND11_MODULE(module_aiter_enum, m): the module still gets
    qola's namespaced name (PyInit_te_module_aiter_enum), which the audit requires."""
    m = tmp_path / "enum.toml"
    m.write_text(
        f'[qola]\nnamespace = "{NS}"\n[build]\narchitectures = ["gfx942"]\nmode = "pybind"\n\n'
        '[[modules]]\nname = "module_aiter_enum"\n'
    )
    proc, out = build(tmp_path, aiter_root, m)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-6000:]
    (mod,) = record(out)["modules"]
    assert mod["status"] == "built" and mod["exports"] == [f"PyInit_{NS}_module_aiter_enum"], mod
    so = out / mod["artifact"]
    # it imports (loading needs the HIP runtime library, not a GPU) and has AITER's enums
    probe = (
        "import importlib.util as u, sys; s = u.spec_from_file_location(sys.argv[2], sys.argv[1]); "
        "m = u.module_from_spec(s); s.loader.exec_module(m); print(int(m.QuantType.per_Token))"
    )
    run = subprocess.run(
        [sys.executable, "-c", probe, str(so), f"{NS}_module_aiter_enum"], capture_output=True, text=True
    )
    assert run.returncode == 0 and run.stdout.split() == ["2"], run.stdout + run.stderr


@ck
def test_rocm7_pin_is_explained(gfx942_only: Gfx942) -> None:
    """hipcc 7.0.2 over HIP 6.4: "ROCm 7" means HIP 7 (its ABI, libamdhip64.so.7). QoLA never reads
    rocm_versions and TE's manifests say "7.2" while TE builds with ROCm 7.0 and 7.1 (issue 21): the
    mismatch is a warning saying why, recorded in manifest.json's version_check, not a refusal."""
    err = gfx942_only.stderr
    assert "Traceback" not in err, err
    assert "HIP 6.4" in err and "libamdhip64.so.6" in err and "['7']" in err, err
    check = record(gfx942_only.out)["version_check"]
    assert check["status"] == "mismatch" and check["accepted"] == ["7"] and check["found"]["hip"].startswith("6.4")


def test_rocm_environment_is_what_the_tests_claim() -> None:
    assert shutil.which("hipcc") and shutil.which("clang-offload-bundler", path=_llvm_env()["PATH"])
