"""bench/vs_qola.py's pure parts: CK files per direction, header declarations, nm parsing, the table rows and
the layout rule, and the rewrites it makes to a scratch QoLA copy (on fixtures; no compiler, no chroot)."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import pytest
import support.bench as bench_support

from qola.core import tomlfile


def load(name: str) -> ModuleType:
    return bench_support.load(name)


def test_ck_files_are_grouped_by_direction_longest_prefix_first(tmp_path: Path) -> None:
    v = load("vs_qola")
    for name in ("fmha_fwd_api.cpp", "fmha_fwd_d32_x.cpp", "fmha_fwd_splitkv_api.cpp", "fmha_bwd_d32.cu",
                 "fmha_batch_prefill_api.cpp", "mha_fwd.cpp", "fmha_fwd_d32_x.hpp"):  # fmt: skip
        (tmp_path / name).write_text("")
    assert v.ck_files(tmp_path) == {
        "fwd": {"fmha_fwd_api", "fmha_fwd_d32_x"},
        "fwd_splitkv": {"fmha_fwd_splitkv_api"},
        "bwd": {"fmha_bwd_d32"},
        "batch_prefill": {"fmha_batch_prefill_api"},
    }
    assert v.ck_files(tmp_path / "missing") == {}


def test_header_declarations_ignore_comments_attributes_and_spacing() -> None:
    v = load("vs_qola")
    a = """// c
#pragma once
#define QOLA_NS(sym) qola::sym
/* float hidden(int); */
#if ENABLE_CK
__attribute__((visibility("default")))
float mha_fwd(const aiter::mha_fwd_args& args,
              const ck_tile::stream_config& stream_config);
#endif
inline int helper(int x) { return x; }
"""
    b = "#define QOLA_NS(sym) qola::sym\nfloat mha_fwd(const aiter::mha_fwd_args &args, const ck_tile::stream_config &stream_config);\n"
    assert v.header_decls(a) == v.header_decls(b)
    assert v.header_decls(a) == {
        "#define QOLA_NS",
        "float mha_fwd(const aiter::mha_fwd_args&args, const ck_tile::stream_config&stream_config)",
    }
    assert v.header_decls(b.replace("stream_config)", "stream_config, int n = 1)")) != v.header_decls(b)


def test_nm_output_splits_defined_from_undefined() -> None:
    v = load("vs_qola")
    text = (
        "0000000000001234 T qola::te::mha_fwd(fmha_fwd_args const&)\n"
        "                 U hipLaunchKernel\n"
        "                 w __gmon_start__\n"
        "0000000000005678 B te_qola_version\n"
    )
    assert v.nm_symbols(text) == (
        {"qola::te::mha_fwd(fmha_fwd_args const&)", "te_qola_version"},
        {"hipLaunchKernel", "__gmon_start__"},
    )


def test_rows_say_same_or_differs_and_name_a_known_difference_only_when_they_differ() -> None:
    v = load("vs_qola")
    same = v.row("kernels libmha_fwd gfx942", {"k1"}, {"k1"}, "variants")
    assert same["same"] and same["docs"] == "" and same["detail"] == ""
    diff = v.row("exported", {"a", "b", "c", "d", "e"}, {"z"}, "drop-directions")
    assert not diff["same"] and diff["docs"] == "drop-directions"
    assert diff["detail"] == "only qola 5: a, b, c …; only QoLA 1: z"
    lines = v.table([same, diff]).splitlines()
    assert lines[0].startswith("| aspect | qola | QoLA | same? |") and len(lines) == 4
    assert "| 5 | 1 | differs |" in lines[3]


def test_known_rules_for_layout_and_dispatch_only_directions() -> None:
    v = load("vs_qola")
    assert v.layout_known({"lib/a.so", "share/x"}, {"lib/a.so", "_jit_build/b.o"}) == "output-dir"
    assert v.layout_known({"lib/a.so", "lib/b.so"}, {"lib/a.so"}) == ""  # a library only one side has
    assert v.layout_known({"include/qola_mha_x.h"}, set()) == ""  # a public header is not layout
    seen_b = {".qola/switch.lock", "lib/pkgconfig/qola-te.pc", "include/qola_embedded_libmha_fwd.h", "logs/x.log"}
    assert v.layout_known(seen_b, {"configs/model_configs/README.md"}) == "output-dir"  # slice B's differences
    assert v.layout_known(set(), {"configs/other.csv"}) == ""
    assert v.ck_known("fwd_splitkv", {"fmha_fwd_splitkv_api"}, set()) == "drop-directions"
    assert v.ck_known("fwd", {"fmha_fwd_api", "fmha_fwd_d32"}, set()) == ""
    assert v.ck_known("fwd_splitkv", {"fmha_fwd_splitkv_api"}, {"fmha_fwd_splitkv_api"}) == ""
    assert v.layout(Path("/nonexistent")) == set()


DECL = {
    "name": "mha_fwd",
    "returns": "float",
    "params": [
        {"type": "mha_fwd_args", "name": "args", "default": None},
        {"type": "const ck_tile::stream_config&", "name": "stream_config", "default": None},
        {"type": "std::string", "name": "q_dtype_str", "default": None},
        {"type": "int", "name": "how_v3_bf16_cvt", "default": "1"},
    ],
}
WRAPPER_H = (
    "QOLA_NS_BEGIN\nfloat mha_fwd(const aiter::mha_fwd_args& args, const ck_tile::stream_config& stream_config);\n"
)
WRAPPER_CU = "float mha_fwd(const aiter::mha_fwd_args& args, const ck_tile::stream_config& stream_config)\n" \
    "{\n    return ::aiter::mha_fwd(args, stream_config);\n}\n"  # fmt: skip


def test_wrapper_port_keeps_qolas_parameters_and_forwards_the_trees_others() -> None:
    p = load("_qola_port")
    h, names = p.port_wrapper(WRAPPER_H, [DECL], header=True)
    assert names == ["mha_fwd"]
    assert ("float mha_fwd(const aiter::mha_fwd_args& args, const ck_tile::stream_config& stream_config, "
            "std::string q_dtype_str, int how_v3_bf16_cvt = 1);") in h  # fmt: skip
    cu, _ = p.port_wrapper(WRAPPER_CU, [DECL], header=False)
    assert "std::string q_dtype_str, int how_v3_bf16_cvt)\n" in cu
    assert "return ::aiter::mha_fwd(args, stream_config, q_dtype_str, how_v3_bf16_cvt);" in cu
    assert p.port_wrapper(WRAPPER_H, [{**DECL, "name": "mha_bwd"}], header=True) == (WRAPPER_H, [])


def test_registry_blob_commands_without_their_script_are_removed(tmp_path: Path) -> None:
    p = load("_qola_port")
    reg = (
        '[libmha_fwd]\nadd_srcs = ["a.cu"]\nadd_blob_gen_cmd = [\n    "{AITER_META_DIR}/hsa/codegen.py -m x --output_dir {{}}",\n]\n'
        '[libmha_bwd]\nadd_blob_gen_cmd = [\n    "{AITER_META_DIR}/csrc/gen.py --output_dir {{}}",\n]\n'
    )
    (tmp_path / "csrc").mkdir()
    (tmp_path / "csrc" / "gen.py").write_text("")
    text, gone = p.drop_absent_blob_cmds(reg, tmp_path)
    assert gone == ["hsa/codegen.py"]
    data = tomlfile.loads(text)
    assert "add_blob_gen_cmd" not in data["libmha_fwd"] and data["libmha_fwd"]["add_srcs"] == ["a.cu"]
    assert data["libmha_bwd"]["add_blob_gen_cmd"] == ["{AITER_META_DIR}/csrc/gen.py --output_dir {{}}"]


def test_qola_manifest_carries_the_resolved_generators_as_python_literals() -> None:
    p = load("_qola_port")
    ours = {
        "qola": {"namespace": "te", "rocm_versions": ["6.4"]},
        "build": {"architectures": ["gfx942"], "drop_hip_flags": ["-x"], "link": "shared"},
        "modules": [
            {"name": "libmha_fwd", "receipt": 700, "drop_directions": ["fwd_splitkv"], "embed": ["fmha_v3_fwd"]}
        ],
        "mha_fwd_variants": [{"dtype": "bf16", "hdim": 32, "has_lse": True}],
    }
    argv = [
        "/t/generate.py",
        "--targets=gfx942",
        "-d",
        "fwd",
        "--receipt",
        "700",
        "--output_dir",
        "{}",
        "--filter",
        "a|b",
    ]
    plan = {"modules": [{"name": "libmha_fwd", "generators": [{"run_argv": argv}]}]}
    data = tomlfile.loads(p.qola_manifest(ours, plan))
    mod = data["modules"][0]
    assert "receipt" not in mod and "embed" not in mod and mod["hsa_subdirs"] == ["fmha_v3_fwd"]
    assert mod["drop_directions"] == ["fwd_splitkv"] and mod["mode"] == "cpp_itfs"
    assert (
        eval(mod["blob_gen_cmd"][0])
        == "/t/generate.py --targets=gfx942 -d fwd --receipt 700 --output_dir '{}' --filter 'a|b'"
    )
    assert "drop_hip_flags" not in data["build"] and "link" not in data["build"]
    assert data["mha_fwd_variants"] == [{"dtype": "bf16", "hdim": 32, "has_lse": True}]


FWD_SIG = "qola::te::mha_fwd(fmha_fwd_args const&, ck_tile::stream_config const&, std::string{}, bool)"


def test_exports_differing_by_const_reference_and_the_version_symbol_are_keyed() -> None:
    v = load("vs_qola")
    ours = {FWD_SIG.format(" const&"), "te_qola_version"}
    assert v.exports_known(ours, {FWD_SIG.format("")}) == "const-ref, version-symbol"
    assert v.exports_known({FWD_SIG.format(""), "te_qola_version"}, {FWD_SIG.format("")}) == "version-symbol"
    assert v.exports_known(ours, {FWD_SIG.format(""), "qola::te::mha_fwd_workspace_size()"}) == ""  # one lacks it
    assert v.exports_known({FWD_SIG.format(" const&").replace("bool", "int")}, {FWD_SIG.format("")}) == ""


def test_header_declarations_spelled_through_aliases_or_of_nothing_defined_are_keyed() -> None:
    v = load("vs_qola")
    qola_h = {
        "#define QOLA_TE_QOLA_MHA_BWD_H",
        "QOLA_NS_BEGIN ::aiter::qola_api_te::r mha_bwd(::aiter::qola_api_te::c0 a)",
    }
    qola_side = {"float mha_bwd(const aiter::mha_bwd_args&a)", "size_t mha_bwd_workspace_size(const fmha_bwd_traits&t)"}
    exported = {"qola::te::mha_bwd(fmha_bwd_args const&)"}
    assert v.decls_known(qola_h, qola_side, exported) == "alias-spelling, bwd-workspace"
    assert (
        v.decls_known(qola_h, qola_side, exported | {"qola::te::mha_bwd_workspace_size(fmha_bwd_traits const&)"}) == ""
    )
    plain = {"float mha_bwd(const aiter::mha_bwd_args&a)"}  # qola spells it without aliases: a real difference
    assert v.decls_known({"float mha_bwd(aiter::mha_bwd_args a)"}, plain, exported) == ""
    assert v.decls_known({"#define QOLA_NS", "#define QOLA_C_NAME"}, {"#define QOLA_NS"}, set()) == "header-macros"
    assert v.decls_known({"#define QOLA_NS"}, {"#define QOLA_NS", "#define QOLA_X"}, set()) == ""


def test_report_only_redoes_the_table_of_a_work_dir_without_building(tmp_path: Path) -> None:
    v = load("vs_qola")
    for side, extra in (("qola", ["qola_embedded_libmha_fwd.h"]), ("QoLA", [])):
        inc = tmp_path / side / "out" / "include"
        inc.mkdir(parents=True)
        for name in ["qola_config.h", *extra]:
            (inc / name).write_text(
                "#define QOLA_NAMESPACE te\n" + ('#define QOLA_VERSION_STR "1"\n' * (side == "qola"))
            )
    (tmp_path / "QoLA" / "out" / "configs" / "model_configs").mkdir(parents=True)
    (tmp_path / "QoLA" / "out" / "configs" / "model_configs" / "README.md").write_text("")
    (tmp_path / "QoLA" / "out" / "_jit_build").mkdir()
    (tmp_path / "QoLA" / "out" / "_jit_build" / "x.o").write_text("")
    result = {"slice": "tiny", "qola_commit": "bbcf79e610c69b4d", "patches": {"applied": []},
              "qola": {"cpu": 82.0, "wall": 100.0, "rc": 0}, "QoLA": {"cpu": 100.0, "wall": 90.0, "rc": 0}, "rows": []}  # fmt: skip
    (tmp_path / "results.json").write_text(json.dumps(result))
    assert v.main(["--report-only", "--work-dir", str(tmp_path)]) == 0
    report = (tmp_path / "report.md").read_text()
    assert (
        "| public header files | 2 | 1 | differs | only qola 1: qola_embedded_libmha_fwd.h | embedded-headers |"
        in report
    )
    assert "| declarations qola_config.h | 2 | 1 | differs |" in report and "| header-macros |" in report
    assert "| output layout, the rest (files) |" in report and report.count("| output-dir |") == 2
    assert "qola 82.0 / 100.0 (rc 0); QoLA 100.0 / 90.0 (rc 0); CPU qola / QoLA 0.82x; QoLA bbcf79e610c6" in report
    with pytest.raises(SystemExit, match=r"results\.json not found"):
        v.main(["--report-only", "--work-dir", str(tmp_path / "none")])
