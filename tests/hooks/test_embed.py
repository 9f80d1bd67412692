"""Embedding code objects: .incbin assembly, index, C lookup, AITER map, symbol hiding, CLI."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from subprocess import CompletedProcess
from typing import Any, cast

import pytest
from support.common import run_qola

from qola.core.errors import QolaError
from qola.hooks import embed
from qola.hooks.embed import EmbedFiles, EmbedSources

pytestmark = pytest.mark.skipif(not (shutil.which("cc") and shutil.which("g++")), reason="needs cc and g++")

# Looks every key of a list file ("key<TAB>path" lines) up through the C lookup and through
# AITER_EMBEDDED_HSA_MAP exactly as aiter_hip_common.h does, and compares with the file's bytes.
CHECK_CPP = r"""
#include AITER_EMBEDDED_HSA_HEADER
#include <cstdio>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#define FIND QOLA_CAT(NS_MOD, _embedded_find)
#define COUNT QOLA_CAT(NS_MOD, _embedded_count)
#define QOLA_CAT(a, b) QOLA_CAT2(a, b)
#define QOLA_CAT2(a, b) a##b

int main(int argc, char** argv)
{
    std::ifstream list(argv[1]);
    unsigned long align = std::stoul(argv[2]);
    std::string line;
    size_t n = 0, bad = 0;
    while(std::getline(list, line))
    {
        std::string key = line.substr(0, line.find('\t')), path = line.substr(line.find('\t') + 1);
        std::ifstream f(path, std::ios::binary);
        std::string want((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
        size_t size = 12345;
        const unsigned char* p = FIND(key.c_str(), &size);
        auto it = AITER_EMBEDDED_HSA_MAP.find(key);  // the AITER way
        bool ok = p && size == want.size() && std::string((const char*)p, size) == want &&
                  ((uintptr_t)p % align) == 0 && it != AITER_EMBEDDED_HSA_MAP.end() &&
                  it->second.data() == (const char*)p && it->second == want;
        if(!ok) { std::printf("MISMATCH %s\n", key.c_str()); ++bad; }
        ++n;
    }
    size_t size = 7;
    if(FIND("hsa/none/none.co", &size) != nullptr || size != 0) { std::printf("FOUND MISSING\n"); ++bad; }
    if(AITER_EMBEDDED_HSA_MAP.size() != n || COUNT() != n) { std::printf("COUNT %zu\n", n); ++bad; }
    std::printf("checked %zu bad %zu\n", n, bad);
    return bad != 0;
}
"""


def _run(cmd: Sequence[object], **kw: Any) -> CompletedProcess[Any]:
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    assert proc.returncode == 0, f"{cmd}\n{proc.stdout}\n{proc.stderr}"
    return proc


def _build(
    tmp: Path,
    hsa: Path,
    archs: list[str],
    subdirs: list[str] | None,
    ns: str = "te",
    module: str = "mod",
    align: int = embed.ALIGN,
) -> tuple[EmbedSources, EmbedFiles, Path]:
    """collect + render + write + assemble; returns (sources, files, object)."""
    sources = embed.render(embed.collect(hsa, archs, subdirs), ns, module, align)
    files = embed.write(sources, tmp / "out")
    obj = tmp / "out" / f"{sources.basename}.o"
    _run(embed.assemble_command(files.asm, obj, depfile=tmp / "out" / "embed.d"))
    return sources, files, obj


def _round_trip(tmp: Path, sources: EmbedSources, files: EmbedFiles, obj: Path, align: int = embed.ALIGN) -> str:
    (tmp / "check.cpp").write_text(CHECK_CPP)
    (tmp / "keys.tsv").write_text("".join(f"{e['key']}\t{e['source']}\n" for e in sources.index["entries"]))
    exe = tmp / "check"
    ns_mod = f"{sources.namespace}_{sources.module}"
    _run(
        [
            "g++",
            "-std=c++17",
            "-O1",
            "-Wall",
            "-Werror",
            f"-I{files.header.parent}",
            embed.aiter_define(sources.module),
            f"-DNS_MOD={ns_mod}",
            tmp / "check.cpp",
            obj,
            "-o",
            exe,
        ]
    )
    out = _run([exe, tmp / "keys.tsv", str(align)]).stdout
    assert f"checked {len(sources.index['entries'])} bad 0" in out, out
    return cast("str", out)


def _plant(root: Path, rel: str, data: bytes) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


@pytest.fixture()
def small_hsa(tmp_path: Path) -> Path:
    """A tree root with aiter_meta/hsa: odd sizes, planted duplicates across types and archs."""
    hsa = tmp_path / "tree" / "aiter_meta" / "hsa"
    a, b, c = b"\x7fELF" + bytes(range(256)) * 3 + b"a", b"B" * 4097, b"\x00" * 13
    _plant(hsa, "gfx942/fmha_v3_fwd/a.co", a)
    _plant(hsa, "gfx942/fmha_v3_fwd/MI300/a_copy.co", a)  # duplicate in a subdirectory
    _plant(hsa, "gfx942/fmha_v3_fwd/b.co", b)
    _plant(hsa, "gfx942/fmha_v3_fwd/notes.csv", b"not a code object")
    _plant(hsa, "gfx942/pa/c.co", c)
    _plant(hsa, "gfx950/fmha_v3_fwd/a.co", a)  # duplicate on another arch
    _plant(hsa, "gfx950/fmha_v3_fwd/empty.co", b"")
    _plant(hsa, "gfx950/pa/c.co", c + b"x")
    return tmp_path / "tree"


def test_collect_keys_sorted_and_filtered(small_hsa: Path) -> None:
    blobs = embed.collect(small_hsa, ["gfx950", "gfx942"], ["fmha_v3_fwd"])
    assert [b.key for b in blobs] == [
        "hsa/gfx942/fmha_v3_fwd/MI300/a_copy.co",
        "hsa/gfx942/fmha_v3_fwd/a.co",
        "hsa/gfx942/fmha_v3_fwd/b.co",
        "hsa/gfx950/fmha_v3_fwd/a.co",
        "hsa/gfx950/fmha_v3_fwd/empty.co",
    ]
    assert all(b.path.is_absolute() and b.path.stat().st_size == b.size for b in blobs)
    # tree root, aiter_meta root and the hsa dir itself all resolve to the same blobs
    assert embed.collect(small_hsa / "aiter_meta" / "hsa", ["gfx950", "gfx942"], ["fmha_v3_fwd"]) == blobs
    assert len(embed.collect(small_hsa, ["gfx942"], None)) == 4


@pytest.mark.parametrize("align", [256, 4096])
def test_dedupe_alignment_and_round_trip(tmp_path: Path, small_hsa: Path, align: int) -> None:
    from elftools.elf.elffile import ELFFile
    from elftools.elf.sections import SymbolTableSection

    sources, files, obj = _build(tmp_path, small_hsa, ["gfx942", "gfx950"], ["fmha_v3_fwd", "pa"], align=align)
    entries = {e["key"]: e for e in sources.index["entries"]}
    a_keys = ["hsa/gfx942/fmha_v3_fwd/a.co", "hsa/gfx942/fmha_v3_fwd/MI300/a_copy.co", "hsa/gfx950/fmha_v3_fwd/a.co"]
    assert len({entries[k]["offset"] for k in a_keys}) == 1  # stored once
    assert sources.index["keys"] == 7 and sources.index["unique"] == 5
    assert all(e["offset"] % align == 0 for e in entries.values())
    sizes = sorted({(e["sha256"], e["size"]) for e in entries.values()}, key=lambda t: t[1])
    with open(obj, "rb") as f:
        elf = ELFFile(f)
        sec = elf.get_section_by_name(".rodata.qola_embed")
        assert sec is not None
        assert sec["sh_addralign"] == align and not sec["sh_flags"] & 0x1  # aligned, not writable
        # five unique blobs laid out with padding, nothing stored twice
        unique_sizes = [s for _, s in sizes]
        assert sec["sh_size"] == max(e["offset"] + e["size"] for e in entries.values())
        assert sec["sh_size"] < sum(unique_sizes) + align * len(unique_sizes)
        data = sec.data()
        for e in entries.values():
            assert data[e["offset"] : e["offset"] + e["size"]] == Path(e["source"]).read_bytes()
        symtab = elf.get_section_by_name(".symtab")
        assert isinstance(symtab, SymbolTableSection)
        syms = {s.name: s for s in symtab.iter_symbols() if s.name.startswith("qola_embed")}
        assert set(syms) == {f"qola_embed_te_mod_{k}" for k in ("blobs", "index", "keys", "count")}
        assert all(s["st_other"]["visibility"] == "STV_HIDDEN" for s in syms.values())
    _round_trip(tmp_path, sources, files, obj, align)
    # the assembler's depfile names the .incbin'd files (for ninja)
    dep = (tmp_path / "out" / "embed.d").read_text()
    incbins = [line.split('"')[1] for line in sources.asm.splitlines() if ".incbin" in line]
    assert len(incbins) == 5 and all(p in dep for p in incbins)
    assert set(incbins) < set(sources.inputs)  # inputs: every file the generated text depends on


def test_write_is_atomic_and_idempotent(tmp_path: Path, small_hsa: Path) -> None:
    sources = embed.render(embed.collect(small_hsa, ["gfx942"], ["pa"]), "te", "mod")
    files = embed.write(sources, tmp_path / "gen")
    mtimes = [p.stat().st_mtime_ns for p in (files.asm, files.header, files.index)]
    assert embed.write(sources, tmp_path / "gen") == files
    assert [p.stat().st_mtime_ns for p in (files.asm, files.header, files.index)] == mtimes
    assert sorted(p.name for p in (tmp_path / "gen").iterdir()) == sorted(
        p.name for p in (files.asm, files.header, files.index)
    )  # no temp files left
    assert json.loads(files.index.read_text()) == sources.index


def test_header_compiles_as_c(tmp_path: Path, small_hsa: Path) -> None:
    _sources, files, obj = _build(tmp_path, small_hsa, ["gfx942"], ["pa"])
    src = tmp_path / "use.c"
    src.write_text(
        '#include "qola_embedded_mod.h"\n#include <stdio.h>\nint main(void){size_t n;'
        'const unsigned char* p = te_mod_embedded_find("hsa/gfx942/pa/c.co", &n);'
        'printf("%zu %s %d\\n", n, te_mod_embedded_key(0), p[0]); return !(p && n == 13);}\n'
    )
    _run(
        ["cc", "-std=c99", "-Wall", "-Wextra", "-Werror", f"-I{files.header.parent}", src, obj, "-o", tmp_path / "use"]
    )
    assert _run([tmp_path / "use"]).stdout == "13 hsa/gfx942/pa/c.co 0\n"


def test_shared_library_exports_no_embed_symbol(tmp_path: Path, small_hsa: Path) -> None:
    from elftools.elf.elffile import ELFFile
    from elftools.elf.sections import SymbolTableSection

    _sources, files, obj = _build(tmp_path, small_hsa, ["gfx942", "gfx950"], ["fmha_v3_fwd"])
    lib_src = tmp_path / "lib.cpp"
    lib_src.write_text(
        "#include AITER_EMBEDDED_HSA_HEADER\n"
        'extern "C" const void* te_lookup(const char* k) {\n'
        "  auto it = AITER_EMBEDDED_HSA_MAP.find(k);\n"
        "  return it == AITER_EMBEDDED_HSA_MAP.end() ? (const void*)te_mod_embedded_find(k, nullptr)\n"
        "                                    : (const void*)it->second.data(); }\n"
    )
    vers = tmp_path / "exports.map"
    vers.write_text('{\n  global:\n    te_*;\n    extern "C++" {\n      qola::te::*;\n    };\n  local: *;\n};\n')
    for name, extra in (("libversioned.so", [f"-Wl,--version-script={vers}"]), ("libplain.so", [])):
        lib = tmp_path / name
        _run(
            [
                "g++",
                "-std=c++17",
                "-O2",
                "-shared",
                "-fPIC",
                f"-I{files.header.parent}",
                embed.aiter_define("mod"),
                lib_src,
                obj,
                "-o",
                lib,
                *extra,
            ]
        )
        with open(lib, "rb") as f:
            dynsym = ELFFile(f).get_section_by_name(".dynsym")
            assert isinstance(dynsym, SymbolTableSection)
            defined = {s.name for s in dynsym.iter_symbols() if s.name and s["st_shndx"] != "SHN_UNDEF"}
        assert not {s for s in defined if "embed" in s or "hsa_map" in s}, (name, defined)
        if name == "libversioned.so":
            assert defined == {"te_lookup"}, defined


def test_empty_render_assembles(tmp_path: Path) -> None:
    sources = embed.render([], "te", "none")
    files = embed.write(sources, tmp_path)
    _run(embed.assemble_command(files.asm, tmp_path / "none.o"))
    assert sources.index["keys"] == 0


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda root: embed.collect(root / "missing", ["gfx942"], ["pa"]), "hsa directory not found"),
        (lambda root: embed.collect(root, ["gfx90a"], ["pa"]), "no code objects for architecture gfx90a"),
        (lambda root: embed.collect(root, ["gfx942"], ["fmoe"]), "no .co files for gfx942/fmoe"),
        (lambda root: embed.collect(root, ["gfx942"], ["../gfx950"]), "bad kernel type"),
        (lambda root: embed.collect(root, ["gfx9/42"], ["pa"]), "architecture 'gfx9/42' is not a GPU architecture"),
        (lambda root: embed.collect(root, [], ["pa"]), "no architecture"),
        (lambda root: embed.render([], "te", "my-module"), "module name 'my-module' is not a C identifier"),
        (lambda root: embed.render([], "te ns", "m"), "namespace 'te ns' contains a space"),
        (lambda root: embed.render([], "te", "m", align=100), "bad alignment"),
    ],
)
def test_api_errors(small_hsa: Path, call: Callable[[Path], object], message: str) -> None:
    with pytest.raises(QolaError, match=message):
        call(small_hsa)


def test_bad_code_object_name(small_hsa: Path) -> None:
    _plant(small_hsa / "aiter_meta" / "hsa", 'gfx942/pa/we"ird.co', b"x")
    with pytest.raises(QolaError, match="bad code object name"):
        embed.collect(small_hsa, ["gfx942"], ["pa"])


def test_a_code_object_linked_out_of_the_tree_is_never_embedded(tmp_path: Path, small_hsa: Path) -> None:
    """A .co that is a link to a file outside the hsa dir (a root-only secret) would be published in a
    library anyone can read: refused, naming both (issue 23). A link inside the hsa dir is fine."""
    secret = tmp_path / "secret"
    secret.write_bytes(b"root:$6$hash")
    (small_hsa / "aiter_meta" / "hsa" / "gfx942" / "pa" / "leak.co").symlink_to(secret)
    with pytest.raises(QolaError, match=r"leak\.co is a link to .*secret, outside the tree's hsa dir"):
        embed.collect(small_hsa, ["gfx942"], ["pa"])
    (small_hsa / "aiter_meta" / "hsa" / "gfx942" / "pa" / "leak.co").unlink()
    (small_hsa / "aiter_meta" / "hsa" / "gfx942" / "pa" / "same.co").symlink_to("c.co")
    assert [b.size for b in embed.collect(small_hsa, ["gfx942"], ["pa"])] == [13, 13]


def test_a_huge_sparse_code_object_is_refused_before_it_is_read(
    small_hsa: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    big = small_hsa / "aiter_meta" / "hsa" / "gfx942" / "pa" / "huge.co"
    with open(big, "wb") as fh:
        fh.truncate(64 << 30)  # 64 GiB of holes: reading it would take minutes
    with pytest.raises(QolaError, match=r"huge\.co is too large to embed .*68,719,476,736 bytes"):
        embed.collect(small_hsa, ["gfx942"], ["pa"])
    big.unlink()
    monkeypatch.setattr(embed, "MAX_CODE_OBJECT", 12)
    with pytest.raises(QolaError, match=r"c\.co is too large to embed"):
        embed.collect(small_hsa, ["gfx942"], ["pa"])


def test_cli_writes_files(tmp_path: Path, small_hsa: Path) -> None:
    out = tmp_path / "gen"
    proc = run_qola(
        "embed",
        "--hsa-dir",
        str(small_hsa),
        "--arch",
        "gfx942",
        "--arch",
        "gfx950",
        "--subdirs",
        "fmha_v3_fwd",
        "pa",
        "--output-dir",
        str(out),
        "--namespace",
        "te",
        "--module",
        "module_asm",
        check=True,
    )
    assert "7 code objects (5 unique" in proc.stdout
    assert sorted(p.name for p in out.iterdir()) == [f"qola_embedded_module_asm.{s}" for s in ("S", "h", "json")]
    assert "te_module_asm_embedded_find" in (out / "qola_embedded_module_asm.h").read_text()
    proc = run_qola(
        "embed", "--hsa-dir", str(small_hsa), "--arch", "gfx950", "--all-types", "--output-dir", str(out), check=True
    )
    assert (out / "qola_embedded_asm.json").exists()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--hsa-dir", "{root}/nope", "--arch", "gfx942", "--subdirs", "pa"], "hsa directory not found"),
        (["--hsa-dir", "{root}", "--arch", "gfx1100", "--subdirs", "pa"], "architectures in"),
        (["--hsa-dir", "{root}", "--arch", "gfx942", "--subdirs", "nope"], "kernel types for gfx942: fmha_v3_fwd, pa"),
        (
            ["--hsa-dir", "{root}", "--arch", "gfx942", "--subdirs", "pa", "--module", "a.b"],
            "module name 'a.b' is not a C identifier",
        ),
        (["--hsa-dir", "{root}", "--arch", "gfx942", "--subdirs", "pa", "--align", "3"], "bad alignment"),
    ],
)
def test_cli_errors_exit_2(tmp_path: Path, small_hsa: Path, args: list[str], message: str) -> None:
    proc = run_qola("embed", *[a.format(root=small_hsa) for a in args], "--output-dir", str(tmp_path / "o"))
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and "hint:" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "o").exists()


@pytest.mark.aiter
@pytest.mark.slow
def test_real_aiter_round_trip(tmp_path: Path, aiter_root: Path) -> None:
    """Every code object AITER ships for gfx942 and gfx950, byte-exact through both lookups."""
    sources, files, obj = _build(tmp_path, aiter_root, ["gfx942", "gfx950"], None, module="aiter_all")
    on_disk = sorted((aiter_root / "aiter_meta" / "hsa").glob("gfx9[45][20]/**/*.co"))
    assert sources.index["keys"] == len(on_disk) > 2000
    assert all(e["offset"] % embed.ALIGN == 0 for e in sources.index["entries"])
    _round_trip(tmp_path, sources, files, obj)
    os.unlink(obj)  # ~100 MB


# module_asm (examples/kernels/csrc/asm) end to end on a GPU: vec_add comes from the embedded
# set, vec_scale only from a directory passed explicitly.
ASM_MAIN = r"""
#include "asm_launch.h"
#include <cstdio>
#include <cstring>
#include <vector>
int main(int argc, char** argv)
{
    const int64_t n = 1000003;
    std::vector<float> ha(n), hb(n), ho(n);
    for(int64_t i = 0; i < n; ++i) { ha[i] = 0.5f * i; hb[i] = 3.0f - i; }
    float *a, *b, *o;
    cudaMalloc(&a, n * 4); cudaMalloc(&b, n * 4); cudaMalloc(&o, n * 4);
    cudaMemcpy(a, ha.data(), n * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(b, hb.data(), n * 4, cudaMemcpyHostToDevice);
    int bad = 0;
    if(asm_vec_add(o, a, b, n, "fp32", 0, nullptr) != ASM_OK) { std::printf("add: %s\n", asm_last_error()); return 1; }
    cudaMemcpy(ho.data(), o, n * 4, cudaMemcpyDeviceToHost);
    for(int64_t i = 0; i < n; ++i) bad += ho[i] != ha[i] + hb[i];
    std::printf("arch %s embedded %zu first %s add_bad %d\n", asm_device_arch(), asm_embedded_count(),
                asm_embedded_key(0), bad);
    asm_status st = asm_vec_scale(o, a, 2.0f, n, 0, nullptr);
    std::printf("scale_without_dir %d %s\n", (int)st, asm_last_error());
    if(asm_vec_scale(o, a, 2.0f, n, 0, argv[1]) != ASM_OK) { std::printf("scale: %s\n", asm_last_error()); return 1; }
    cudaMemcpy(ho.data(), o, n * 4, cudaMemcpyDeviceToHost);
    for(int64_t i = 0; i < n; ++i) bad += ho[i] != 2.0f * ha[i];
    std::printf("scale_bad %d\n", bad);
    return bad != 0;
}
"""


@pytest.mark.gpu
def test_module_asm_on_gpu(tmp_path: Path, kernels_root: Path) -> None:
    csrc = kernels_root / "csrc"
    arch = "sm_" + _run(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"]).stdout.split()[0].replace(
        ".", ""
    )
    hsa = tmp_path / "hsa"  # the example tree's code objects, built as the tree builds them
    _run([sys.executable, kernels_root / "scripts" / "build_hsa.py", "--arch", arch, "--output", hsa])
    _sources, files, obj = _build(tmp_path, hsa, [arch], ["vec_add"], ns="qk", module="module_asm")
    (tmp_path / "main.cu").write_text(ASM_MAIN)
    exe = tmp_path / "asm_main"
    _run(
        [
            "nvcc",
            "-std=c++17",
            f"-I{csrc / 'include'}",
            f"-I{csrc / 'asm'}",
            f"-I{files.header.parent}",
            embed.aiter_define("module_asm"),
            csrc / "asm" / "asm_launch.cu",
            tmp_path / "main.cu",
            obj,
            "-o",
            exe,
        ]
    )
    out = _run([exe, hsa]).stdout  # hsa/ doubles as the explicit fallback dir for vec_scale
    assert f"arch {arch} embedded 3 first hsa/{arch}/vec_add/vec_add_bf16.co add_bad 0" in out, out
    assert "scale_without_dir 1 code object" in out and "is not embedded (no asm_dir given)" in out, out
    assert "scale_bad 0" in out, out
