"""The declaration reader (qola.plan.cdecl) and the API qola generates from it (qola.plan.itfs): host-side,
no compiler. The compiled outcome is tests/plan/test_itfs_api.py's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qola.core.errors import QolaError
from qola.plan import cdecl, itfs, registry
from qola.plan.cdecl import Decl, DeclError, Param
from qola.plan.registry import RegistryEntry

OLD = """#pragma once
#include "fmha_fwd.hpp"
namespace aiter {
struct mha_fwd_args { int hdim_q; float mha_fwd_in_struct(int); };
__attribute__((visibility("default"))) float mha_fwd(mha_fwd_args args,
                                                     const ck_tile::stream_config& stream_config,
                                                     std::string q_dtype_str,  // a comment, (with parens
                                                     bool is_group_mode,
                                                     mask_enum mask_type,
                                                     bias_enum bias_type,
                                                     bool has_lse,
                                                     bool use_ext_asm,
                                                     int how_v3_bf16_cvt                = 1,
                                                     const void* seqstart_q_padding_ptr = nullptr,
                                                     const void* seqstart_k_padding_ptr = nullptr,
                                                     bool is_v3_api_check = false);
}
"""

NEW = """#pragma once
#include "aiter_hip_common.h"
#if ENABLE_CK
#include "fmha_bwd.hpp"
#endif
namespace aiter {
struct mha_bwd_args { std::function<void*(size_t bytes, bool zero_init)> workspace_alloc{}; };
/* float mha_bwd(int); -- a comment is not a declaration */
__attribute__((visibility("default"))) float mha_bwd(mha_bwd_args, const ck_tile::stream_config&);
float fmha_v3_bwd(mha_bwd_args, const ck_tile::stream_config&);
} // namespace aiter
"""


def one(text: str, name: str) -> Decl:
    (d,) = cdecl.read_header(text, [name])[name]
    return d


def test_old_generation_twelve_parameters_with_defaults() -> None:
    d = one(OLD, "mha_fwd")
    assert (d.scope, d.returns, d.linkage, d.conditions) == (("aiter",), "float", "C++", ())
    assert len(d.params) == 12
    assert d.params[0] == Param("mha_fwd_args", "args")
    assert d.params[1] == Param("const ck_tile::stream_config&", "stream_config")
    assert d.params[8] == Param("int", "how_v3_bf16_cvt", "1")
    assert d.params[9] == Param("const void*", "seqstart_q_padding_ptr", "nullptr")
    assert d.params[11] == Param("bool", "is_v3_api_check", "false")
    assert d.qualified == "::aiter::mha_fwd"


def test_new_generation_unnamed_parameters_and_include_conditions() -> None:
    h = cdecl.parse(NEW)
    (d,) = h.named("mha_bwd")
    assert d.params == (Param("mha_bwd_args"), Param("const ck_tile::stream_config&"))
    assert [(i.target, i.conditions) for i in h.includes] == [
        ("aiter_hip_common.h", ()),
        ("fmha_bwd.hpp", ("ENABLE_CK",)),
    ]
    assert [x.name for x in h.decls] == ["mha_bwd", "fmha_v3_bwd"]  # not the struct member, not the comment


def test_conditions_else_elif_ifdef_guard_and_if0() -> None:
    text = """#ifndef GUARD_H
#define GUARD_H
#if 0
int f(int gone);
#endif
#ifdef HAVE_A
int f(int a);
#elif B > 1
int f(long b);
#else
int f(short c);
#endif
#if !X
extern "C" int g(void);
#endif
#endif
"""
    h = cdecl.parse(text)
    assert [(tuple(p.type for p in d.params), d.conditions) for d in h.named("f")] == [
        (("int",), ("defined(HAVE_A)",)),
        (("long",), ("!(defined(HAVE_A)) && (B > 1)",)),
        (("short",), ("!(defined(HAVE_A)) && !(B > 1)",)),
    ]
    (g,) = h.named("g")
    assert (g.linkage, g.params, g.conditions) == ("C", (), ("!X",))


def test_shapes_the_reader_understands() -> None:
    text = """#define AITER_API __attribute__((visibility("default")))
namespace a::b { inline namespace v4 {
enum class mode { plain, fast };
[[nodiscard]] AITER_API std::pair<int, int> f(const std::map<std::string, std::vector<int>>& m,
    std::function<void*(size_t, bool)> alloc = {}, int (*cb)(const char* name) = nullptr,
    float (&arr)[4], char name_buf[16], int&& token = 0, mode md = mode::fast,
    unsigned n = sizeof(int) * 2, const volatile unsigned long long* p = NULL) noexcept;
auto h(int x) -> std::vector<int>;
static int hidden(int);
inline int defined_here(int v) { return v * 2; }
template <typename T> T tmpl(T);
int var = 3;
} }
extern "C" {
int c_entry(void* p, struct desc* d);
}
"""
    h = cdecl.parse(text)
    (f,) = h.named("f")
    assert (f.scope, f.inline_ns, f.returns) == (("a", "b", "v4"), ("v4",), "std::pair<int, int>")
    assert [(p.type, p.name, p.default) for p in f.params] == [
        ("const std::map<std::string, std::vector<int>>&", "m", None),
        ("std::function<void*(size_t, bool)>", "alloc", "{}"),
        ("int(*)(const char* name)", "cb", "nullptr"),
        ("float(&)[4]", "arr", None),
        ("char[16]", "name_buf", None),
        ("int&&", "token", "0"),
        ("mode", "md", "mode::fast"),
        ("unsigned", "n", "sizeof(int)*2"),
        ("const volatile unsigned long long*", "p", "NULL"),
    ]
    assert "int(*cb)(const char* name) = nullptr" in f.signature()
    assert one(text, "h").returns == "std::vector<int>"
    assert one(text, "defined_here").params == (Param("int", "v"),)
    (c,) = h.named("c_entry")
    assert (c.scope, c.linkage, [p.type for p in c.params]) == ((), "C", ["void*", "struct desc*"])
    assert not h.named("hidden") and not h.named("var")  # internal linkage; a variable
    with pytest.raises(DeclError, match=r"tmpl.*function template"):
        cdecl.read_header(text, ["tmpl"])


def test_what_cannot_be_read_is_an_error_naming_the_function() -> None:
    with pytest.raises(DeclError, match="variadic"):
        cdecl.read_header("namespace aiter { int logf(const char* fmt, ...); }", ["logf"])
    with pytest.raises(DeclError, match="no declaration of a function 'mha_fwd'"):
        cdecl.read_header(NEW, ["mha_fwd"])


def test_struct_members_found_for_requires() -> None:
    text = """struct fmha_bwd_launcher {
    std::function<float(fmha_bwd_args, const ck_tile::stream_config&)> run{[](fmha_bwd_args, const ck_tile::stream_config&) { return -1.0f; }};
    size_t workspace_size = 0;
    fmha_bwd_launcher(const fmha_bwd_traits&);
  private:
    size_t host_ws_size = 0;
};
struct older_launcher { ck_tile::index_t dq_acc_splits{0}; };
"""
    m = cdecl.parse(text).members
    assert {"run", "workspace_size", "host_ws_size"} <= m["fmha_bwd_launcher"]
    assert "workspace_size" not in m["older_launcher"]


def test_decl_json_round_trip() -> None:
    d = one(OLD, "mha_fwd")
    assert Decl.from_json(json.loads(json.dumps(d.to_json()))) == d


# -- qola.plan.itfs ----------------------------------------------------------------------------------


def tree(tmp: Path, mha_bwd_h: str, fmha_bwd_hpp: str | None) -> Path:
    meta = tmp / "meta"
    (meta / "csrc" / "include").mkdir(parents=True)
    (meta / "csrc" / "include" / "mha_bwd.h").write_text(mha_bwd_h)
    if fmha_bwd_hpp is not None:
        ck = meta / "ck"
        ck.mkdir()
        (ck / "fmha_bwd.hpp").write_text(fmha_bwd_hpp)
    return meta


def entry(module: str) -> RegistryEntry:
    """The registry's entry of ``module`` (every module asked for here has one)."""
    found = registry.entry(module)
    assert found is not None, module
    return found


def resolve_bwd(meta: Path, notes: list[str]) -> itfs.Api:
    r = entry("libmha_bwd")
    assert r.api_header is not None and r.public_header is not None
    spec = itfs.ApiSpec("libmha_bwd", r.api_header, r.exports, r.public_header, r.provides, r.api_includes)
    return itfs.resolve(spec, meta, [str(meta / "csrc" / "include"), str(meta / "ck")], notes)


def test_registry_names_the_api_by_tree_header() -> None:
    for name, header in (("libmha_fwd", "csrc/include/mha_fwd.h"), ("libmha_bwd", "csrc/include/mha_bwd.h")):
        r = entry(name)
        assert r.api_header == header and r.exports == (name[3:],) and not r.add_srcs
    assert [p.name for p in entry("libmha_bwd").provides] == ["mha_bwd_workspace_size"]


def test_workspace_size_provided_where_ck_has_it(tmp_path: Path) -> None:
    launcher = "struct fmha_bwd_launcher { size_t workspace_size = 0; fmha_bwd_launcher(const fmha_bwd_traits&); };\n"
    notes: list[str] = []
    api = resolve_bwd(tree(tmp_path / "a", NEW, launcher), notes)
    assert [d.name for d in api.decls] == ["mha_bwd"] and not notes
    (ws,) = api.provided
    assert ws.conditions == ("ENABLE_CK",)  # as mha_bwd.h includes fmha_bwd.hpp
    header = itfs.render_header(api, "te", "libmha_bwd", api.header)
    assert (
        "#if ENABLE_CK\nQOLA_NS_BEGIN\nQOLA_VISIBLE size_t mha_bwd_workspace_size(const ::fmha_bwd_traits& traits);"
        in header
    )
    wrapper = itfs.render_wrapper(api, "te", "libmha_bwd")
    assert "return ::fmha_bwd_launcher(traits).workspace_size;" in wrapper
    assert "return ::aiter::mha_bwd(" in wrapper
    # a CK whose launcher has no workspace_size: not provided, and the plan says why
    api = resolve_bwd(tree(tmp_path / "b", NEW, "struct fmha_bwd_launcher { int dq_acc_splits{0}; };\n"), notes)
    assert not api.provided and "declares no fmha_bwd_launcher::workspace_size" in notes[-1]


def test_unreadable_api_is_an_error_naming_header_and_function(tmp_path: Path) -> None:
    meta = tree(tmp_path / "a", "namespace aiter { float mha_bwd(mha_bwd_args, ...); }\n", None)
    with pytest.raises(QolaError, match=r"mha_bwd\.h: mha_bwd: .*variadic"):
        resolve_bwd(meta, [])
    meta = tree(tmp_path / "b", "namespace aiter { float mha_bwd_v2(int); }\n", None)
    with pytest.raises(QolaError, match=r"mha_bwd\.h: no declaration of a function 'mha_bwd'"):
        resolve_bwd(meta, [])
    (meta / "csrc" / "include" / "mha_bwd.h").unlink()
    with pytest.raises(
        QolaError, match=r"cannot read .*mha_bwd\.h, the header that declares its C\+\+ API \(mha_bwd\)"
    ):
        resolve_bwd(meta, [])


def test_generated_names_keep_the_tree_lookup_scope() -> None:
    api = itfs.Api("csrc/include/x.h", "x.h", "qola_x.h", (one(OLD, "mha_fwd"),))
    header = itfs.render_header(api, "te", "libx", api.header)
    assert "namespace aiter { namespace qola_api_te {" in header
    assert "using mha_fwd_0_p1 = const ck_tile::stream_config&;" in header
    assert "::aiter::qola_api_te::mha_fwd_0_p11 is_v3_api_check = false);" in header
    assert itfs.Api.from_json(json.loads(json.dumps(api.to_json()))) == api


def test_a_class_by_value_is_exported_by_const_reference() -> None:
    """QoLA's entry points take structs by const reference (issue 31): a parameter that may be a class
    by value gets an alias that the compiler makes ``const T&`` for a class; builtin scalars,
    pointers, references and function pointers keep the tree's own alias."""
    assert [itfs.by_value(t) for t in ("mha_fwd_args", "const std::string", "std::function<void*(size_t, bool)>")] == [
        True
    ] * 3
    assert not any(
        itfs.by_value(t)
        for t in ("bool", "unsigned long", "const void*", "int&&", "const ck_tile::stream_config&", "int (*)(int)")
    )
    api = itfs.Api("csrc/include/x.h", "x.h", "qola_x.h", (one(OLD, "mha_fwd"),))
    header = itfs.render_header(api, "te", "libx", api.header)
    assert "#include <type_traits>\n" in header
    assert (
        "using mha_fwd_0_c0 = ::std::conditional<::std::is_class<mha_fwd_0_p0>::value, "
        "const mha_fwd_0_p0&, mha_fwd_0_p0>::type;" in header
    )
    assert "mha_fwd(\n    ::aiter::qola_api_te::mha_fwd_0_c0 args,\n    ::aiter::qola_api_te::mha_fwd_0_p1 " in header
    assert "mha_fwd_0_c3" not in header and "::aiter::qola_api_te::mha_fwd_0_p3 is_group_mode," in header
    wrapper = itfs.render_wrapper(api, "te", "libx")
    assert "static_cast<::aiter::qola_api_te::mha_fwd_0_c0&&>(a0)" in wrapper


def test_entry_point_defined_by_a_macro() -> None:
    text = """#include "aiter_tensor.h"
AITER_CTYPES_ERROR_DEF

namespace { int helper(int x) { return x; } }
AITER_CTYPES_DEFINE_ENTRYPOINT_VOID(
    gemm_x,
    (aiter_tensor_t* A, // A: [M, K]
     const char* kernelName, float alpha, hipStream_t stream),
    (A, kernelName, alpha, stream))
{
    helper(1);
}
"""
    macros = {"AITER_CTYPES_DEFINE_ENTRYPOINT_VOID": "int"}
    (d,) = cdecl.read_header(text, ["gemm_x"], macros)["gemm_x"]
    assert (d.returns, d.linkage, d.scope) == ("int", "C", ())
    assert [p.type for p in d.params] == ["aiter_tensor_t*", "const char*", "float", "hipStream_t"]
    with pytest.raises(DeclError):  # without the macro it is not a declaration qola can read
        cdecl.read_header(text, ["gemm_x"])


def test_torch_api_is_refused_naming_the_declaration(tmp_path: Path) -> None:
    meta = tmp_path / "meta"
    (meta / "inc").mkdir(parents=True)
    (meta / "inc" / "g.h").write_text("torch::Tensor gemm(torch::Tensor& A, int splitK);\n")
    with pytest.raises(
        QolaError,
        match=r"g\.h:1: torch::Tensor gemm\(torch::Tensor& A, int splitK\) takes or "
        "returns PyTorch types",
    ):
        itfs.resolve(itfs.ApiSpec("m", "inc/g.h", ["gemm"], "qola_g.h"), meta, [])


def test_registry_gemm_entries() -> None:
    asm = entry("module_gemm_a4w4_asm")
    assert asm.api_header == "csrc/py_itfs_cu/asm_gemm_a4w4.cu" and asm.exports == ("gemm_a4w4_asm",)
    assert dict(asm.entry_macros)["AITER_CTYPES_DEFINE_ENTRYPOINT_VOID"] == "int"
    assert entry("module_gemm_a4w4_blockscale").exports == ("gemm_a4w4_blockscale",)
