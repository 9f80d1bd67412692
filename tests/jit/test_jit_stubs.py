"""Stubbers: the reader, the example tree's attn_fwd instances and CK's fMHA instances.

A stub must define exactly the specialisation the dispatch code calls (same name,
template arguments, return type and parameter types), checked by parsing the
generated dispatch file and the instance files.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from qola.jit import cxx, stubs

REPO = Path(__file__).resolve().parents[2]
ATTN_GEN = REPO / "examples/kernels/csrc/attn/generate.py"


# ----------------------------------------------------------------------------- the reader
def test_reader_finds_specialisations_with_their_signature() -> None:
    text = """
    // template <> float nope<int>(int) { }   (a comment)
    #include "x.h"
    namespace outer { namespace inner {
    template <typename T> float f_(const T& a, int);
    template <>
    inline float f_<A<(3 > 2), B::C>>(const A<(3 > 2), B::C>& a, int /*unnamed*/, unsigned long n = 4) noexcept
    {
        const char* s = "template <> int g<int>() { }";
        return a.x + n;
    }
    } }
    template <> struct S<int> { };
    template <> void g_<int>();
    template <> std::string name_<T0, ck_tile::gfx9_t>() { return "}"; }
    """
    specs = cxx.find_specializations(text)
    assert [s.name for s in specs] == ["f_", "name_"]
    f, g = specs
    assert f.namespace == ("outer", "inner")
    assert f.ret == "float" and f.targs == "A<(3>2), B::C>" and f.trailer == "noexcept"
    assert f.param_types == ("const A<(3>2), B::C>&", "int", "unsigned long")
    assert [p.name for p in f.params] == ["a", None, "n"]
    assert g.ret == "std::string" and g.params == () and g.targs == "T0, ck_tile::gfx9_t"
    assert text[g.end - 1] == "}" and "return" in text[g.body_start : g.end]


@pytest.mark.parametrize(
    "decl, names",
    [
        ("const ck_tile::stream_config& s, fmha_fwd_args a", ["s", "a"]),
        ("const attn_fwd_args&, qkStream_t", [None, None]),
        ("fmha_fwd_args, const int", [None, None]),
        ("unsigned int, std::vector<int>&& v, T* const p", [None, "v", "p"]),
    ],
)
def test_parameter_names(decl: str, names: list[str | None]) -> None:
    spec = cxx.find_specializations(f"template <> void f<1>({decl}) {{}}")[0]
    assert [p.name for p in spec.params] == names


def test_unsupported_parameters_are_refused() -> None:
    with pytest.raises(cxx.CxxError):
        cxx.find_specializations("template <> void f<1>(void (*cb)(int)) {}")


# ----------------------------------------------------------------------------- signature check
def declarations(text: str) -> dict[str, tuple[str, tuple[str, ...]]]:
    """name -> (return type, parameter types) of the function templates declared (not defined)."""
    out = {}
    for m in re.finditer(r"template\s*<[^;{}]*?>\s*([\w:<>]+)\s+(\w+)\s*\(([^;{}]*?)\)\s*;", text):
        spec = cxx.find_specializations(f"template <> {m.group(1)} {m.group(2)}<0>({m.group(3)}) {{}}")[0]
        out[m.group(2)] = (spec.ret, spec.param_types)
    return out


def canonical(expr: str, aliases: dict[str, str]) -> str:
    """Aliases of the instance file expanded, `(N > 0)` folded, whitespace normalised."""
    for _ in range(8):
        new = cxx.qualify(expr, set(aliases), "\0")
        for name, value in aliases.items():
            new = new.replace("\0" + name, value)
        if new == expr:
            break
        expr = new
    expr = re.sub(r"\(\s*(\d+)\s*>\s*(\d+)\s*\)", lambda m: str(int(m.group(1)) > int(m.group(2))).lower(), expr)
    return re.sub(r"\s+", "", expr)


def aliases_of(text: str) -> dict[str, str]:
    return {m.group(1): m.group(2) for m in re.finditer(r"^using\s+(\w+)\s*=\s*([^;]*);", text, re.M)}


def check_stub(
    unit: str, text: str, style: stubs.StubStyle, decls: Any, called: set[tuple[str, str]]
) -> set[tuple[str, str]]:
    """Stub one instance file, check every specialisation against the declarations and
    return the (name, template args) keys it defines."""
    st = stubs.stub_unit(text, module="m", unit=unit, style=style)
    defined = set()
    aliases = aliases_of(text)
    stub_specs = cxx.find_specializations(st.stub_text)
    assert [(s.name, s.targs, s.ret, s.param_types) for s in stub_specs] == [
        (s.name, s.targs, s.ret, s.param_types) for s in st.specs
    ], unit
    for s in stub_specs:
        assert s.name in decls, f"{unit}: {s.name} is not declared"
        assert (s.ret, s.param_types) == decls[s.name], f"{unit}: {s.specialised_name()} differs from its declaration"
        defined.add((s.name, canonical(s.targs, aliases)))
    assert len(st.specs) >= 1
    for i in range(len(st.specs)):
        assert f"{st.entry_symbol}_{i}()" in st.jit_text
    return defined


# ----------------------------------------------------------------------------- example tree
@pytest.fixture(scope="module")
def attn_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not ATTN_GEN.is_file():
        pytest.skip("examples/kernels/csrc/attn/generate.py not present")
    out = tmp_path_factory.mktemp("attn")
    subprocess.run([sys.executable, str(ATTN_GEN), "--receipt", "0", "-o", str(out)], check=True)
    return out


def test_example_attn_stubs_match_the_dispatch(attn_tree: Path) -> None:
    api = (attn_tree / "attn_fwd_api.cu").read_text()
    decls = declarations((ATTN_GEN.parent / "attn_fwd_kernel.h").read_text())
    called = {("attn_fwd_", canonical(t, {})) for t in re.findall(r"return attn_fwd_<(.*)>\(a, s\);", api)}
    declared = {
        (s.name, canonical(s.targs, {})): (s.ret, s.param_types)
        for s in cxx.find_specializations(re.sub(r"\);", ") {}", api))
        if s.name == "attn_fwd_"
    }
    units = sorted(p for p in attn_tree.glob("attn_fwd_d*.cu"))
    assert len(units) == 48
    defined = set()
    for p in units:
        defined |= check_stub(p.stem, p.read_text(), stubs.EXAMPLE_ATTN, decls, called)
    assert defined == called == set(declared)
    assert set(declared.values()) == {decls["attn_fwd_"]}


# ----------------------------------------------------------------------------- CK fMHA
FMHA = "aiter_meta/3rdparty/composable_kernel/example/ck_tile/01_fmha"


@pytest.fixture(scope="module")
def ck_fmha(aiter_root: Path, ck_fmha_600: Path) -> tuple[Path, Path]:
    """CK's fMHA sources and every fwd/bwd instance generated for receipt 600 (conftest, once a session)."""
    return aiter_root / FMHA, ck_fmha_600


@pytest.mark.aiter
@pytest.mark.slow
def test_ck_fmha_fwd_stubs_match_the_dispatch(ck_fmha: tuple[Path, Path]) -> None:
    src, out = ck_fmha
    decls = declarations((src / "fmha_fwd.hpp").read_text())
    api = (out / "fwd/fmha_fwd_api.cpp").read_text()
    called = {
        (fn, canonical(f"{trait}, {arch}", {}))
        for trait, fn, arch in re.findall(
            r"using trait_ = ([^;]*);\s*return (fmha_fwd_)<trait_, ([\w:]+)>\(s, a\);", api
        )
    }
    units = sorted((out / "fwd").glob("fmha_fwd_d*.cpp"))
    assert len(units) > 1000
    defined = set()
    for p in units:
        defined |= check_stub(p.stem, p.read_text(), stubs.CK_FMHA, decls, called)
    assert called and called <= defined  # every dispatched instance has its stub ...
    assert {d for d in defined if d[0] == "fmha_fwd_"} == called  # ... and no stub is left uncalled


@pytest.mark.aiter
@pytest.mark.slow
def test_ck_fmha_bwd_stubs_match_the_dispatch(ck_fmha: tuple[Path, Path]) -> None:
    src, out = ck_fmha
    decls = declarations((src / "fmha_bwd.hpp").read_text())
    api = (out / "bwd/fmha_bwd_api.cpp").read_text()
    called = set()
    pattern = (
        r"using dot_do_o_trait_ = ([^;]*);\s*using dq_dk_dv_trait_ = ([^;]*);\s*using convert_dq_trait_ = "
        r"([^;]*);\s*r = fmha_bwd_<dot_do_o_trait_, dq_dk_dv_trait_, std::conditional_t<(\w+), "
        r"convert_dq_trait_, void>, ([\w:]+)>\(s, a\);"
    )
    for dot, dq, conv, use_conv, arch in re.findall(pattern, api):
        kinds = [("dot_do_o", dot), ("dq_dk_dv", dq)] + ([("convert_dq", conv)] if use_conv == "true" else [])
        for kind, trait in kinds:
            for fn in ("oneshot_", "get_name_"):
                called.add((f"fmha_bwd_{kind}_{fn}", canonical(f"{trait}, {arch}", {})))
    assert len(called) > 1000
    units = sorted((out / "bwd").glob("fmha_bwd_[dc]*.cpp"))
    assert len(units) > 1000
    defined = set()
    for p in units:
        defined |= check_stub(p.stem, p.read_text(), stubs.CK_FMHA, decls, called)
    assert called <= defined


def test_batch_stub_qualifies_an_alias_with_a_comment_in_its_head() -> None:
    """A comment between ``using`` and ``=`` (the alias was found with comments blanked, its name
    was read from the raw text: an AttributeError before)."""
    text = (
        '#include "x.h"\n'
        "using /* the trait */ trait_0 = Traits<int, 64>;\n"
        "using trait_1 // second\n    = Traits<int, 128>;\n"
        "template <>\nfloat run_<trait_0>(const Args& a) { return impl<trait_0>(a); }\n"
        "template <>\nfloat run_<trait_1>(const Args& a) { return impl<trait_1>(a); }\n"
    )
    assert cxx.alias_names(text, cxx.top_level_items(text)) == ["trait_0", "trait_1"]
    out = stubs.stub_batch([("u0", text)], module="m")
    assert [s.targs for s in cxx.find_specializations(out)] == ["qola_jit_u0::trait_0", "qola_jit_u0::trait_1"]


@pytest.mark.aiter
def test_ck_fmha_batch_stub_qualifies_aliases(ck_fmha: tuple[Path, Path]) -> None:
    _, out = ck_fmha
    files = sorted((out / "fwd").glob("fmha_fwd_d*.cpp"))[:3]
    text = stubs.stub_batch([(p.stem, p.read_text()) for p in files], module="m", style=stubs.CK_FMHA)
    specs = cxx.find_specializations(text)
    assert len(specs) == 3
    for k, s in enumerate(specs):
        assert s.targs.startswith(f"qola_jit_u{k}::trait_0, ck_tile::gfx")
        assert f"namespace qola_jit_u{k} {{" in text


@pytest.mark.aiter
@pytest.mark.slow
@pytest.mark.parametrize("direction", ["fwd_splitkv", "batch_prefill"])
def test_ck_fmha_splitkv_and_batch_prefill_stubs_match_their_declarations(
    aiter_root: Path, tmp_path: Path, direction: str
) -> None:
    src = aiter_root / FMHA
    subprocess.run(
        [sys.executable, str(src / "generate.py"), "-d", direction, "--receipt", "600", "-o", str(tmp_path)],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    decls = declarations((src / "fmha_fwd.hpp").read_text())
    units = sorted(p for p in tmp_path.glob("*.cpp") if not p.stem.endswith("_api"))
    assert len(units) >= 50
    defined = set()
    for p in units:
        defined |= check_stub(p.stem, p.read_text(), stubs.CK_FMHA, decls, set())
    assert len({name for name, _ in defined}) >= 1
