"""Manifest validation: every bad manifest gives one exact, helpful message."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qola.core.errors import QolaError
from qola.plan.manifest import load, parse

GOOD = """
[qola]
aiter_commit = "33f2e6a"
namespace = "te"
rocm_versions = ["7.2"]

[build]
architectures = ["gfx950"]
mode = "cpp_itfs"
link = "static"

[[modules]]
name = "libmha_fwd"
receipt = 700
drop_srcs = ["mha_fwd_split.cu"]
drop_directions = ["fwd_splitkv", "batch_prefill"]
embed = ["fmha_v3_fwd"]

[[mha_fwd_variants]]
dtype = ["bf16", "fp16"]
has_lse = true
"""

# (manifest text, exact message after "error: m.toml: ")
BAD = [
    ("[qolla]\n", "qolla: unknown key; did you mean 'qola'?"),
    ("[qola]\nnamespce = 'te'\n", "qola.namespce: unknown key; did you mean 'namespace'?"),
    (
        "[qola]\nnamespace = '1te'\n",
        "qola.namespace: got '1te'; expected a valid C identifier that is not a keyword (letters, digits, _; e.g. \"te\")",
    ),
    (
        "[qola]\nnamespace = 'int'\n",
        "qola.namespace: got 'int'; expected a valid C identifier that is not a keyword (letters, digits, _; e.g. \"te\")",
    ),
    (
        "[qola]\nnamespace = 'a-b'\n",
        "qola.namespace: got 'a-b'; expected a valid C identifier that is not a keyword (letters, digits, _; e.g. \"te\")",
    ),
    ("[qola]\nnamespace = 3\n", "qola.namespace: got 3; expected a string"),
    ("[qola]\naiter_commit = 'zzz'\n", "qola.aiter_commit: got 'zzz'; expected a git commit sha (4 to 40 hex digits)"),
    ("[qola]\nrocm_versions = '7.2'\n", "qola.rocm_versions: got '7.2'; expected a list"),
    (
        "[qola]\nrocm_versions = ['seven']\n",
        'qola.rocm_versions: expected versions like "7.2" or "13.0", got \'seven\'',
    ),
    ("[qola]\ncuda_versions = [13]\n", "qola.cuda_versions[0]: got 13; expected a string"),
    (
        "[build]\narchitectures = ['gfx942', 'sm_90']\n",
        "build.architectures: architectures mix HIP and CUDA targets (gfx942, sm_90); build one vendor per manifest",
    ),
    (
        "[build]\narchitectures = ['gfx']\n",
        "build.architectures: unknown architecture 'gfx': expected gfx… (HIP, e.g. gfx942) or sm_… (CUDA, e.g. sm_90)",
    ),
    (
        "[build]\narchitectures = ['sm90']\n",
        "build.architectures: unknown architecture 'sm90': expected gfx… (HIP, e.g. gfx942) or sm_… (CUDA, e.g. sm_90)",
    ),
    (
        "[build]\narchitectures = ['gfx942', 'gfx942']\n",
        "build.architectures: architectures repeat an entry: ['gfx942', 'gfx942']",
    ),
    ("[build]\narchitectures = 'gfx942'\n", "build.architectures: got 'gfx942'; expected a list"),
    ("[build]\nmode = 'cpp'\n", "build.mode: got 'cpp'; expected one of 'pybind' or 'cpp_itfs'"),
    ("[build]\nlink = 'dynamic'\n", "build.link: got 'dynamic'; expected one of 'shared' or 'static'"),
    ("[build]\njobs = 0\n", "build.jobs: must be between 1 and 4096, got 0"),  # as -j 0 and MAX_JOBS=0 say it
    ("[build]\narchitecture = ['gfx942']\n", "build.architecture: unknown key; did you mean 'architectures'?"),
    ("build = 3\n", "build: got 3; expected a table"),
    ("[[modules]]\nreceipt = 1\n", "modules[0].name: missing required key"),
    ("[[modules]]\nname = 'a'\ndrop_srcs = 'x.cu'\n", "modules[0].drop_srcs: got 'x.cu'; expected a list"),
    (
        "[[modules]]\nname = 'a'\n[[modules]]\nname = 'b'\ndrop_src = ['x']\n",
        "modules[1].drop_src: unknown key; did you mean 'drop_srcs'?",
    ),
    ("[[modules]]\nname = 'a'\nreceipt = '600'\n", "modules[0].receipt: got '600'; expected an integer"),
    ("[[modules]]\nname = 'a'\nreceipt = -1\n", "modules[0].receipt: got -1; expected a number >= 0"),
    (
        "[[modules]]\nname = 'a'\nmode = 'torch'\n",
        "modules[0].mode: got 'torch'; expected one of 'pybind' or 'cpp_itfs'",
    ),
    ("[[modules]]\nname = 'a b'\n", "modules[0].name: got 'a b'; expected a module name made of letters, digits and _"),
    ("[[modules]]\nname = 'a'\n[[modules]]\nname = 'a'\n", "modules[1].name: module 'a' is listed twice"),
    (
        "[[modules]]\nname = 'a'\nis_python_module = 'yes'\n",
        "modules[0].is_python_module: got 'yes'; expected true or false",
    ),
    ("[[modules]]\nname = 'a'\nembed = [1]\n", "modules[0].embed[0]: got 1; expected a string"),
    ("[[mha_fwd_variants]]\nhas_lsee = true\n", "mha_fwd_variants[0].has_lsee: unknown key; did you mean 'has_lse'?"),
    (
        "[[mha_bwd_variants]]\ndeterminstic = true\n",
        "mha_bwd_variants[0].determinstic: unknown key; did you mean 'deterministic'?",
    ),
    (
        "[[mha_fwd_variants]]\ndtype = {a = 1}\n",
        "mha_fwd_variants[0].dtype: expected a string, true/false, an integer or a list of those (got {'a': 1})",
    ),
    ("[[variants]]\nmodule = 'a'\n", "variants[0].pattern: missing required key"),
    ("[jit]\nenabled = 1\n", "jit.enabled: got 1; expected true or false"),
    ("[qola\n", "not valid TOML: Expected ']' at the end of a table declaration (at line 1, column 6)"),
]


@pytest.mark.cli
def test_good_manifest_parses() -> None:
    m = parse(GOOD, "m.toml")
    assert m.qola.namespace == "te"
    assert m.build.architectures == ["gfx950"]
    assert m.modules[0].drop_directions == ["fwd_splitkv", "batch_prefill"]
    assert m.mha_fwd_variants[0].dtype == ["bf16", "fp16"]
    assert m.build.link == "static"


@pytest.mark.cli
def test_at_least_thirty_bad_manifests() -> None:
    assert len(BAD) >= 30


@pytest.mark.cli
@pytest.mark.parametrize("text,message", BAD, ids=[f"bad{i}" for i in range(len(BAD))])
def test_bad_manifest_message(text: str, message: str) -> None:
    with pytest.raises(QolaError) as info:
        parse(text, "m.toml")
    first = info.value.render().splitlines()[0]
    assert first == f"error: m.toml: {message}"
    assert info.value.hint  # always says where to look


@pytest.mark.cli
def test_several_errors_are_all_listed() -> None:
    with pytest.raises(QolaError) as info:
        parse("[build]\nmode = 'x'\nlink = 'y'\n", "m.toml")
    text = info.value.render()
    assert "build.mode" in text and "build.link" in text


@pytest.mark.cli
def test_missing_file_and_not_utf8(tmp_path: Path) -> None:
    with pytest.raises(QolaError, match="not found"):
        load(tmp_path / "nope.toml")
    bad = tmp_path / "bin.toml"
    bad.write_bytes(b"\xff\xfe[qola]")
    with pytest.raises(QolaError, match="not UTF-8"):
        load(bad)


@pytest.mark.cli
def test_load_records_path_and_sha(tmp_path: Path) -> None:
    p = tmp_path / "q.toml"
    p.write_text(GOOD)
    m = load(p)
    import hashlib

    assert m.sha256 == hashlib.sha256(GOOD.encode()).hexdigest()
    assert m.path == str(p.resolve())


toml_scalars = st.one_of(st.text(max_size=8), st.booleans(), st.integers(-5, 5))
toml_values = st.recursive(
    toml_scalars, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c, max_size=3), max_leaves=6
)
keys = st.sampled_from(["qola", "build", "modules", "mha_fwd_variants", "jit", "variants", "namespace", "x"])


def _dump(data: Any) -> str:
    """Tiny TOML writer for the fuzz (inline tables only)."""

    def val(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, int):
            return str(v)
        if isinstance(v, str):
            return '"' + v.encode("unicode_escape").decode().replace('"', '\\"') + '"'
        if isinstance(v, list):
            return "[" + ", ".join(val(x) for x in v) + "]"
        return "{" + ", ".join(f"{val(k)} = {val(x)}" for k, x in v.items()) + "}"

    return "\n".join(f"{val(k)} = {val(v)}" for k, v in data.items()) + "\n"


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(keys, toml_values, max_size=4))
def test_fuzz_structured_only_qolaerror(data: dict[str, Any]) -> None:
    with contextlib.suppress(QolaError):
        parse(_dump(data), "fuzz.toml")


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200))
def test_fuzz_raw_text_only_qolaerror(text: str) -> None:
    with contextlib.suppress(QolaError):
        parse(text, "fuzz.toml")
