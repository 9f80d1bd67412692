"""Which units a library compiles, and for which archs (issue 34): each generated CK file only for
the build archs it holds device code for (its ``…_gfx9`` / ``…_gfx950`` name), a dispatch or API
file for all; a direction the manifest drops brings no dispatch-only unit unless code that stays
calls it. Checked on the graph a dry run writes (a fake hipcc: no ROCm needed)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from support import itfs_fixture as fx
from support.ck_tree import ASM_GEN, CK_DIR, ck_tree, module
from support.fake_hipcc import fake_hipcc
from support.fake_nvcc import fake_nvcc
from support.fake_nvcc import pytestmark as needs_fake_nvcc  # g++ and CUDA's static runtime
from support.libdata import embedded_blobs

from qola.hooks import embed
from qola.pipeline import run as pipeline
from qola.pipeline.run import BuildSpec
from qola.plan import genrules


def dry_run(tmp: Path, archs: list[str], body: str, tree: Path | None = None) -> dict[str, dict[str, str]]:
    """``qola build --dry-run`` of ``body``'s modules on the CK-style tree; each compile edge of
    build.ninja: source file name -> its bindings (flags, archs, module)."""
    tree = tree or ck_tree(tmp / "tree")
    m = tmp / "q.toml"
    m.write_text(f'[qola]\nnamespace = "qk"\n[build]\narchitectures = {archs!r}\nmode = "cpp_itfs"\n'.replace("'", '"'))
    m.write_text(m.read_text() + body)
    return graph_of(tmp, m, tree)


def graph_of(tmp: Path, m: Path, tree: Path) -> dict[str, dict[str, str]]:
    """The compile edges of ``qola build --dry-run`` of manifest ``m`` on ``tree`` (a fake hipcc)."""
    hipcc = fake_hipcc(tmp / "bin" / "hipcc")
    spec = BuildSpec.make(
        manifest=str(m),
        aiter_root=str(tree),
        output_dir=str(tmp / "out"),
        jobs=1,
        dry_run=True,
        env={**os.environ, "HIPCC": str(hipcc)},
    )
    report = pipeline.build(spec)
    assert report.ok, [(r.name, r.error) for r in report.modules]
    return edges((tmp / "out.build" / "build.ninja").read_text())


def edges(text: str) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    current: dict[str, str] | None = None
    for line in text.splitlines():
        if line.startswith("build ") and (m := re.search(r": cc(?:_host)? ", line)):  # a compile, host-only or not
            src = line[m.end() :].split(" | ")[0]
            current = out[Path(src).name] = {}
        elif line.startswith("  ") and current is not None:
            key, _, value = line.strip().partition(" = ")
            current[key] = value
        else:
            current = None
    out["rule cc"] = {"command": text.split("rule cc\n  command = ", 1)[1].split("\n", 1)[0]}
    flags = [ln for ln in text.splitlines() if ln.startswith("flags_libmha_ck = ")]
    out["flags_libmha_ck"] = {"value": flags[0] if flags else ""}
    return out


def test_each_generated_file_compiles_for_its_archs(tmp_path: Path) -> None:
    """A two-arch build: a ``_gfx9`` kernel file gets no gfx950 pass, a ``_gfx950`` one no gfx942 pass;
    the dispatch and the API source name both (the dispatch for the host alone: it holds no kernel). The passes are the edge's own ``$archs`` (the module's
    flags name none), on the compile line within its flags, before ``-x hip -c $in -o $out``."""
    g = dry_run(tmp_path, ["gfx942", "gfx950"], module())
    both = "--offload-arch=gfx942 --offload-arch=gfx950"
    assert g["fmha_fwd_d64_fp16_gfx9.cpp"]["archs"] == "--offload-arch=gfx942"
    assert g["fmha_fwd_d128_fp16_gfx950.cpp"]["archs"] == "--offload-arch=gfx950"
    assert g["fmha_fwd_api.cpp"]["archs"] == f"{both} --cuda-host-only" and g["mha_api.cu"]["archs"] == both
    kernels = [name for name in g if name.endswith(("_gfx9.cpp", "_gfx950.cpp"))]
    assert len(kernels) == 12 and all("," not in g[k]["archs"] and " " not in g[k]["archs"] for k in kernels)
    assert "--offload-arch" not in g["flags_libmha_ck"]["value"] and g["flags_libmha_ck"]["value"]
    cmd = g["rule cc"]["command"]
    assert " $flags $archs " in cmd and cmd.index("$archs") < cmd.index("-x hip -c $in -o $out")


def test_a_files_archs_are_judged_among_its_own_generators_files(tmp_path: Path) -> None:
    """Another generator's ``_gfx942`` file beside CK's ``_gfx9`` ones (AITER's libmha_fwd): CK's files'
    archs come from CK's own listing, so its ``_gfx9`` file still serves gfx942 (judged over the
    module's whole listing, ``gfx942`` would be the more specific family and ``_gfx9`` would serve no
    arch: every pass); the other generator is not CK, so its file's name decides nothing: every arch
    (issue 41)."""
    g = dry_run(tmp_path, ["gfx942", "gfx950"], module(asm=True))
    assert g["asm_fmha_fwd_v3_gfx942.cpp"]["archs"] == "--offload-arch=gfx942 --offload-arch=gfx950"
    assert g["fmha_fwd_d64_fp16_gfx9.cpp"]["archs"] == "--offload-arch=gfx942"
    assert g["fmha_fwd_d64_fp16_gfx950.cpp"]["archs"] == "--offload-arch=gfx950"
    stamp = json.loads((tmp_path / "out.build" / "gen" / "libmha_ck" / "stamp.json").read_text())
    assert [len(group) for group in stamp["groups"]] == [5, 5, 5, 1]
    # generators skipped (same stamp): the groups come from the stamp
    again = dry_run(tmp_path, ["gfx942", "gfx950"], module(asm=True), tree=tmp_path / "tree")
    assert again == g


def test_qolas_wrapper_compiles_without_device_passes(tmp_path: Path) -> None:
    """The cpp_itfs wrapper qola writes (``qola_<module>_itfs.cu``) only forwards host calls: its edge
    runs no device pass (``--cuda-host-only``: the same object, a third of the CPU with CK's headers,
    docs/benchmarks.md) yet still names the archs (ck-jit reads them from compile lines), while the
    module's own sources keep every arch's pass."""
    tree = fx.write_tree(tmp_path / "new", "new")
    m = fx.manifest(tmp_path / "q.toml", "new", "gfx942")
    m.write_text(m.read_text().replace('["gfx942"]', '["gfx942", "gfx950"]'))
    g = graph_of(tmp_path, m, tree)
    wrappers = {k: v for k, v in g.items() if k.endswith("_itfs.cu")}
    assert sorted(wrappers) == ["qola_libmha_bwd_itfs.cu", "qola_libmha_fwd_itfs.cu"]
    assert {v["archs"] for v in wrappers.values()} == {"--offload-arch=gfx942 --offload-arch=gfx950 --cuda-host-only"}
    own = {k: v for k, v in g.items() if "archs" in v and k not in wrappers}
    assert own and {v["archs"] for v in own.values()} == {"--offload-arch=gfx942 --offload-arch=gfx950"}


def test_a_single_arch_build_compiles_every_file_for_it(tmp_path: Path) -> None:
    """gfx942 alone: the generator is told ``--targets=gfx942`` (it writes no ``_gfx950`` twin) and
    every edge has the one pass (the dispatch files for the host alone)."""
    g = dry_run(tmp_path, ["gfx942"], module())
    units = {k: v for k, v in g.items() if "archs" in v}
    assert units and not [k for k in units if k.endswith("_gfx950.cpp")]
    assert {v["archs"] for k, v in units.items() if not k.endswith("_api.cpp")} == {"--offload-arch=gfx942"}
    assert {v["archs"] for k, v in units.items() if k.endswith("_api.cpp")} == {
        "--offload-arch=gfx942 --cuda-host-only"
    }


def test_source_archs_keeps_feature_suffixes_and_every_arch_for_a_file_serving_none() -> None:
    srcs = ["/g/fmha_fwd_d64_gfx9.cpp", "/g/fmha_fwd_d64_gfx950.cpp", "/g/fmha_fwd_api.cpp"]
    assert genrules.source_archs(srcs, ("gfx942:xnack-", "gfx950")) == {
        "/g/fmha_fwd_d64_gfx9.cpp": ("gfx942:xnack-",),
        "/g/fmha_fwd_d64_gfx950.cpp": ("gfx950",),
        "/g/fmha_fwd_api.cpp": ("gfx942:xnack-", "gfx950"),
    }
    # a gfx950 twin in a gfx90a build holds no code for it, but its host code links: compiled as before
    assert genrules.source_archs(srcs[1:2], ("gfx90a",)) == {"/g/fmha_fwd_d64_gfx950.cpp": ("gfx90a",)}


def test_a_dropped_direction_brings_no_dispatch_unit_unless_code_that_stays_calls_it(tmp_path: Path) -> None:
    """``drop_directions``: CK writes a dropped direction's dispatch alone (no kernel); it is compiled
    only when a source that stays calls it (here the API calls batch_prefill, not fwd_splitkv), and
    then for the host alone."""
    drop = ("fwd_splitkv", "batch_prefill")
    tree = ck_tree(tmp_path / "tree", calls=("fwd", "batch_prefill"))
    g = dry_run(tmp_path, ["gfx942"], module(drop), tree=tree)
    units = {k for k, v in g.items() if "archs" in v}
    assert "fmha_fwd_splitkv_api.cpp" not in units and "fmha_batch_prefill_api.cpp" in units
    assert {"fmha_fwd_api.cpp", "mha_api.cu", "fmha_fwd_d64_fp16_gfx9.cpp"} <= units
    assert not [u for u in units if u.startswith(("fmha_fwd_splitkv_d", "fmha_batch_prefill_d"))]  # no kernel
    # the kept one dispatches to no kernel: host code only, no device pass (the same object, a third
    # of the CPU: docs/benchmarks.md); so does the kept direction's (its kernels are in their own files)
    assert g["fmha_batch_prefill_api.cpp"]["archs"] == "--offload-arch=gfx942 --cuda-host-only"
    assert g["fmha_fwd_api.cpp"]["archs"] == "--offload-arch=gfx942 --cuda-host-only"
    tree2 = ck_tree(tmp_path / "t2" / "tree", calls=("fwd",))
    g2 = dry_run(tmp_path / "t2", ["gfx942"], module(drop), tree=tree2)
    assert not {"fmha_fwd_splitkv_api.cpp", "fmha_batch_prefill_api.cpp"} & set(g2)
    assert "fmha_fwd_api.cpp" in g2


@needs_fake_nvcc
def test_the_library_links_without_them_and_drops_dead_code(tmp_path: Path) -> None:
    """A real link (the fake nvcc: g++ objects, the host linker): the library links with
    ``--no-undefined`` though the dropped directions' dispatch was never compiled, and ``--gc-sections``
    drops what no export reaches (a source of dead code: its bytes are not in the library)."""
    tree = ck_tree(tmp_path / "tree", calls=("fwd",))
    (tree / "csrc" / "api" / "dead.cu").write_text(
        'static const char marker[] = "QOLA-DEAD-CODE-MARKER";\nconst char* qola_dead() { return marker; }\n'
    )
    co = tree / "hsa" / "sm_90" / "fmha_v3_fwd" / "fwd_d128.co"  # embedded; no code of the library looks it up
    co.parent.mkdir(parents=True)
    co.write_bytes(b"\x7fELF-QOLA-EMBEDDED-CODE-OBJECT" * 64)
    m = tmp_path / "q.toml"
    body = module(("fwd_splitkv", "batch_prefill"), srcs=("csrc/api/mha_api.cu", "csrc/api/dead.cu"))
    body += 'embed = ["fmha_v3_fwd"]\n'
    m.write_text('[qola]\nnamespace = "qk"\n[build]\narchitectures = ["sm_90"]\nmode = "cpp_itfs"\n' + body)
    env = {**os.environ, "CUDACXX": str(fake_nvcc(tmp_path / "nvcc"))}
    spec = BuildSpec.make(manifest=str(m), aiter_root=str(tree), output_dir=str(tmp_path / "out"), jobs=2, env=env)
    report = pipeline.build(spec)
    assert report.ok, [(r.name, r.detail) for r in report.modules]
    objs = {p.name.rsplit("-", 1)[0] for p in (tmp_path / "out.build" / "obj" / "libmha_ck").glob("*.o")}
    assert "dead" in objs and "fmha_fwd_api" in objs and not objs & {"fmha_fwd_splitkv_api", "fmha_batch_prefill_api"}
    lib = (tmp_path / "out" / "lib" / "qk_libmha_ck.so").read_bytes()
    assert b"qk_mha_api" in lib and b"QOLA-DEAD-CODE-MARKER" not in lib
    # what embed = [...] put in stays, though nothing calls its lookup (AITER before AITER_EMBEDDED_HSA_MAP)
    found, _ = embedded_blobs(
        tmp_path / "out" / "lib" / "qk_libmha_ck.so", embed.symbol_prefix("qk", "libmha_ck"), embed.ALIGN
    )
    assert found == {"hsa/sm_90/fmha_v3_fwd/fwd_d128.co": co.read_bytes()}


# a generator that is not CK's: names ending in arch tokens that mean nothing to qola
PLAIN_GEN = r"""
import argparse, pathlib
p = argparse.ArgumentParser()
p.add_argument("--output_dir")
out = pathlib.Path(p.parse_args().output_dir)
out.mkdir(parents=True, exist_ok=True)
(out / "k_gfx9.cpp").write_text("float k_gfx9(int x) { return (float)x; }\n")
(out / "kern_gfx90a_gfx942.cpp").write_text("float kern_gfx90a_gfx942(int x) { return (float)x; }\n")
"""
# AITER's C++ API generator (csrc/cpp_itfs/mha_fwd_generate.py): one file calling CK's dispatch
ITFS_GEN = r"""
import argparse, pathlib
p = argparse.ArgumentParser()
p.add_argument("--output_dir")
p.add_argument("--receipt")
out = pathlib.Path(p.parse_args().output_dir)
out.mkdir(parents=True, exist_ok=True)
(out / "mha_fwd.cpp").write_text("float fmha_fwd(int);\nfloat mha_fwd(int x) { return fmha_fwd(x); }\n")
(out / "mha_fwd_kernels.cpp").write_text("float mha_fwd_kernel(int x) { return (float)x; }\n")  # not its API
"""


def _writers_tree(root: Path) -> Path:
    """The CK-style tree with a plain generator, AITER's per-arch asm generator under ``hsa/gfx942/``
    (none under ``hsa/gfx950/``) and its C++ API generator under ``csrc/cpp_itfs/``."""
    tree = ck_tree(root)
    (tree / "csrc" / "plain_gen.py").write_text(PLAIN_GEN)
    asm = tree / "hsa" / "gfx942" / "fmha_v3_fwd" / "codegen.py"
    asm.parent.mkdir(parents=True)
    asm.write_text(ASM_GEN)
    (tree / "csrc" / "cpp_itfs").mkdir()
    (tree / "csrc" / "cpp_itfs" / "mha_fwd_generate.py").write_text(ITFS_GEN)
    return tree


def _writers_module(*cmds: str) -> str:
    """``libmha_ck`` with CK's fwd generator then ``cmds``."""
    listed = ", ".join(json.dumps(c) for c in (f"{CK_DIR}/generate.py -d fwd --output_dir {{}}", *cmds))
    return module(directions=()).replace("blob_gen_cmd = []", f"blob_gen_cmd = [{listed}]")


def test_the_ck_naming_rule_reads_only_ck_files(tmp_path: Path) -> None:
    """Issue 41: CK's ``_gfx9``/``_gfx950`` rule applies to the files CK's generator wrote, never to a
    plain generator's: its ``k_gfx9.cpp`` keeps every arch's pass in a three-arch build (it got
    gfx90a and gfx950 only), ``kern_gfx90a_gfx942.cpp`` keeps gfx90a and gfx950 (it got gfx942
    alone); CK's own files beside them still get their family's archs."""
    tree = _writers_tree(tmp_path / "tree")
    body = _writers_module("csrc/plain_gen.py --output_dir {}")
    g = dry_run(tmp_path, ["gfx90a", "gfx942", "gfx950"], body, tree=tree)
    every = "--offload-arch=gfx90a --offload-arch=gfx942 --offload-arch=gfx950"
    assert g["k_gfx9.cpp"]["archs"] == every
    assert g["kern_gfx90a_gfx942.cpp"]["archs"] == every
    assert g["fmha_fwd_d64_fp16_gfx9.cpp"]["archs"] == "--offload-arch=gfx90a --offload-arch=gfx942"
    assert g["fmha_fwd_d64_fp16_gfx950.cpp"]["archs"] == "--offload-arch=gfx950"


def test_a_name_naming_several_archs_keeps_all_of_them() -> None:
    """A CK file whose name ends in several arch tokens serves each (it got the last one alone), and
    does not make the others' families more specific."""
    srcs = ["/g/fmha_fwd_d64_gfx90a_gfx942.cpp", "/g/fmha_fwd_d128_gfx9.cpp"]
    assert genrules.source_archs(srcs, ("gfx90a", "gfx942")) == {
        "/g/fmha_fwd_d64_gfx90a_gfx942.cpp": ("gfx90a", "gfx942"),
        "/g/fmha_fwd_d128_gfx9.cpp": ("gfx90a", "gfx942"),
    }


def test_ck_files_keep_their_archs_when_an_absent_asm_generator_was_skipped(tmp_path: Path) -> None:
    """AITER's asm command runs once per build arch (``hsa/<gfx>/…/codegen.py``); the gfx950 one is
    absent and skipped (no files, no group): CK's files are still told apart from the others'."""
    tree = _writers_tree(tmp_path / "tree")
    body = _writers_module("hsa/gfx942/fmha_v3_fwd/codegen.py --output_dir {}", "csrc/plain_gen.py --output_dir {}")
    g = dry_run(tmp_path, ["gfx942", "gfx950"], body, tree=tree)
    assert g["fmha_fwd_d64_fp16_gfx9.cpp"]["archs"] == "--offload-arch=gfx942"
    assert g["fmha_fwd_d64_fp16_gfx950.cpp"]["archs"] == "--offload-arch=gfx950"
    assert g["k_gfx9.cpp"]["archs"] == "--offload-arch=gfx942 --offload-arch=gfx950"


def test_units_whose_generator_writes_no_kernel_compile_for_the_host_alone(tmp_path: Path) -> None:
    """Issue 42: CK's dispatch of a kept direction, the per-arch asm generator's launcher (it loads code
    objects at run time) and AITER's C++ API (``csrc/cpp_itfs/mha_fwd_generate.py``'s ``mha_fwd.cpp``)
    compile with ``--cuda-host-only`` (still naming the archs); CK's kernel files, another file of the
    API generator, a plain generator's files and the module's own sources keep their device passes."""
    tree = _writers_tree(tmp_path / "tree")
    cmds = (
        "hsa/gfx942/fmha_v3_fwd/codegen.py --output_dir {}",
        "csrc/cpp_itfs/mha_fwd_generate.py --receipt 3 --output_dir {}",
    )
    g = dry_run(tmp_path, ["gfx942", "gfx950"], _writers_module(*cmds, "csrc/plain_gen.py --output_dir {}"), tree=tree)
    host = {k for k, v in g.items() if v.get("archs", "").endswith(" --cuda-host-only")}
    assert host == {"fmha_fwd_api.cpp", "asm_fmha_fwd_v3_gfx942.cpp", "mha_fwd.cpp"}
    assert g["mha_fwd.cpp"]["archs"] == "--offload-arch=gfx942 --offload-arch=gfx950 --cuda-host-only"
    assert g["fmha_fwd_d64_fp16_gfx9.cpp"]["archs"] == "--offload-arch=gfx942"
    both = "--offload-arch=gfx942 --offload-arch=gfx950"
    assert g["k_gfx9.cpp"]["archs"] == g["mha_api.cu"]["archs"] == g["mha_fwd_kernels.cpp"]["archs"] == both
