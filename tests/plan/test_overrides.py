"""Module overrides as QoLA and TE write them: plain values or expression strings (qola.plan.tree.overrides).

The fixture tree is written here, shaped like AITER 0403bcdf's ``libmha_fwd`` / ``libmha_bwd`` table
entries (no AITER code). The manifest is TE's gfx1250 manifest in form (namespace te_v3). The
expected plans are written out by hand from what QoLA's ``config.py`` gives for it: overrides
replace the table's values and are evaluated; ``drop_directions`` filters the resulting command
list; the registry's additions (QoLA: ``add_flags_extra_hip``, ``add_blob_gen_cmd``; qola: the
switches and generators its registry names where the sources ask, qola.plan.needs) come afterwards.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.common import run_qola

from qola.core.errors import QolaError
from qola.plan import registry
from qola.plan.itfs import Api
from qola.plan.manifest import parse
from qola.plan.model import ModulePlan, Plan
from qola.plan.planner import PlanInputs, make_plan
from qola.plan.tree import overrides
from qola.plan.tree.aiter import AiterTree, open_tree

CK_GEN = "f'{CK_DIR}/example/ck_tile/01_fmha/generate.py -d %s --receipt 600 --output_dir {{}}'"
TABLE = {
    "libmha_fwd": {
        "srcs": [
            "f'{AITER_CSRC_DIR}/cpp_itfs/mha_fwd.cu'",
            "f'{AITER_CSRC_DIR}/cpp_itfs/mha_fwd_split.cu'",
            "f'{AITER_CSRC_DIR}/cpp_itfs/mha_fwd_batch_prefill.cu'",
        ],
        "flags_extra_cc": [],
        "flags_extra_hip": [
            "'-DCK_TILE_FMHA_FWD_FAST_EXP2=1'",
            "f'-DCK_TILE_FLOAT_TO_BFLOAT16_DEFAULT={os.environ.get(\"CK_TILE_FLOAT_TO_BFLOAT16_DEFAULT\", 2)}'",
            "'-DCK_TILE_FMHA_FWD_SPLITKV_API=1'",
        ],
        "extra_ldflags": "None",
        "extra_include": ["f'{CK_DIR}/example/ck_tile/01_fmha'"],
        "verbose": "False",
        "is_python_module": "False",
        "is_standalone": "False",
        "torch_exclude": "True",
        "blob_gen_cmd": [CK_GEN % "fwd", CK_GEN % "fwd_splitkv", CK_GEN % "batch_prefill"],
    },
    "libmha_bwd": {
        "srcs": ["f'{AITER_CSRC_DIR}/cpp_itfs/mha_bwd.cu'"],
        "flags_extra_cc": [],
        "flags_extra_hip": [
            "f'-DCK_TILE_FLOAT_TO_BFLOAT16_DEFAULT={os.environ.get(\"CK_TILE_FLOAT_TO_BFLOAT16_DEFAULT\", 0)}'"
        ],
        "extra_ldflags": "None",
        "extra_include": ["f'{CK_DIR}/example/ck_tile/01_fmha'"],
        "verbose": "False",
        "is_python_module": "False",
        "is_standalone": "False",
        "torch_exclude": "True",
        "blob_gen_cmd": [CK_GEN % "bwd"],
    },
}

TE_GFX1250 = """
[qola]
aiter_commit = "0403bcdfd0b507e0459012b82e00785a818f774a"
namespace = "te_v3"
rocm_versions = ["7.2"]

[build]
architectures = ["gfx1250"]

[[modules]]
name = "libmha_fwd"
mode = "cpp_itfs"
drop_directions = ["fwd", "fwd_splitkv", "batch_prefill"]
flags_extra_cc = ["'-DFAV3_ON=1'", "'-DENABLE_CK=0'", "'-DFAV1250_ON=1'"]
hsa_subdirs = ["fmha_fwd_bf16"]
srcs = [
    "f'{AITER_CSRC_DIR}/cpp_itfs/mha_fwd.cu'",
    "f'{AITER_CSRC_DIR}/cpp_itfs/mha_fwd_split.cu'",
    "f'{AITER_CSRC_DIR}/cpp_itfs/mha_fwd_batch_prefill.cu'",
    "f'{AITER_CSRC_DIR}/py_itfs_cu/asm_fmha_fwd_with_sink.cu'",
]
blob_gen_cmd = [
    "f'{AITER_META_DIR}/hsa/codegen.py -m fmha_fwd_bf16 --output_dir {{}}'",
]

[[modules]]
name = "libmha_bwd"
mode = "cpp_itfs"
drop_directions = ["bwd"]
flags_extra_cc = ["'-DONLY_FAV3=1'", "'-DENABLE_CK=0'"]
"""


# the preprocessor lines of AITER 0403bcdf's sources that decide what qola's registry adds (qola.plan.needs):
# the switches they test and the generated headers they include
SOURCES = {
    "csrc/cpp_itfs/mha_fwd.cu": '#if FAV3_ON\n#include "asm_fmha_v3_fwd_configs.hpp"\n#endif\n#if FAV2_ON\n#endif\n'
    "#if FAV1250_ON\n#endif\n",
    "csrc/cpp_itfs/mha_fwd_split.cu": "#if ENABLE_CK\n#endif\n",
    "csrc/cpp_itfs/mha_fwd_batch_prefill.cu": "#if ENABLE_CK\n#endif\n",
    "csrc/cpp_itfs/mha_bwd.cu": '#include "asm_fmha_v3_bwd_configs.hpp"\n#if ONLY_FAV3\n#endif\n',
    "csrc/py_itfs_cu/asm_fmha_fwd_with_sink.cu": '#include "asm_fmha_fwd_bf16_configs.hpp"\n#ifdef FAV1250_ON\n#endif\n',
}


def write_tree(root: Path) -> Path:
    """A develop-layout tree with the two modules' files (stub sources, stub generators)."""
    (root / "aiter/jit").mkdir(parents=True)
    (root / "aiter/jit/optCompilerConfig.json").write_text(json.dumps(TABLE, indent=1))
    files = {
        **SOURCES,
        "hsa/codegen.py": "# fixture\n",
        "3rdparty/composable_kernel/example/ck_tile/01_fmha/generate.py": "# fixture\n",
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    (root / "csrc/include").mkdir()
    for api, args in (("mha_fwd", "mha_fwd_args"), ("mha_bwd", "mha_bwd_args")):  # the API qola wraps (qola.plan.itfs)
        (root / f"csrc/include/{api}.h").write_text(
            f"namespace aiter {{ struct {args}; float {api}({args} args, const int& s); }}\n"
        )
    (root / "3rdparty/composable_kernel/example/ck_tile/01_fmha/codegen/ops").mkdir(parents=True)  # CK's flavour
    (root / "hsa/gfx1250/fmha_fwd_bf16").mkdir(parents=True)
    return root


@pytest.fixture()
def tree(tmp_path: Path) -> AiterTree:
    return open_tree(write_tree(tmp_path / "aiter"))


def plan_of(text: str, tree: AiterTree, env: dict[str, str] | None = None) -> Plan:
    return make_plan(parse(text, "te.toml"), tree, PlanInputs(archs=("gfx1250",), env=env or {}, hip_version="7.2.0"))


def expected(meta: str) -> dict[str, dict[str, list[str]]]:
    """The plan of TE_GFX1250 over the fixture tree, by hand (as QoLA's evaluation gives it)."""
    return {
        "libmha_fwd": {
            "sources": [
                f"{meta}/csrc/cpp_itfs/mha_fwd.cu",
                f"{meta}/csrc/cpp_itfs/mha_fwd_split.cu",
                f"{meta}/csrc/cpp_itfs/mha_fwd_batch_prefill.cu",
                f"{meta}/csrc/py_itfs_cu/asm_fmha_fwd_with_sink.cu",
            ],  # + the wrapper made from the API
            "flags_extra_cc": ["-DFAV3_ON=1", "-DENABLE_CK=0", "-DFAV1250_ON=1"],
            # QoLA's registry appends -DFAV3_ON=1 -DFAV2_ON=1; qola's adds the switches mha_fwd.cu tests
            # that the flags leave undefined (FAV3_ON is in the override): the same defines reach hipcc
            "flags_extra_hip": [
                "-DCK_TILE_FMHA_FWD_FAST_EXP2=1",
                "-DCK_TILE_FLOAT_TO_BFLOAT16_DEFAULT=2",
                "-DCK_TILE_FMHA_FWD_SPLITKV_API=1",
                "-DFAV2_ON=1",
            ],
            # the override replaces the three CK commands; the registry's codegen is appended after it
            "generators": [
                f"{meta}/hsa/codegen.py -m fmha_fwd_bf16 --output_dir {{}}",
                f"{meta}/hsa/codegen.py -m fmha_v3_fwd --output_dir {{}}",
            ],
            "embed": ["fmha_fwd_bf16"],  # hsa_subdirs replaces the registry's fmha_v3_fwd
        },
        "libmha_bwd": {
            "sources": [f"{meta}/csrc/cpp_itfs/mha_bwd.cu"],
            "flags_extra_cc": ["-DONLY_FAV3=1", "-DENABLE_CK=0"],
            "flags_extra_hip": ["-DCK_TILE_FLOAT_TO_BFLOAT16_DEFAULT=0"],
            # CK's -d bwd is dropped entirely (the module is CK-free); the hsa codegen has no -d
            "generators": [f"{meta}/hsa/codegen.py -m fmha_v3_bwd --output_dir {{}}"],
            "embed": ["fmha_v3_bwd"],
        },
    }


def test_te_gfx1250_manifest_plans_as_qola_evaluates_it(tree: AiterTree) -> None:
    plan = plan_of(TE_GFX1250, tree)
    assert [m.md_name for m in plan.modules] == ["te_v3_libmha_fwd", "te_v3_libmha_bwd"]
    got = {
        m.name: {
            "sources": list(m.sources),
            "flags_extra_cc": list(m.flags_extra_cc),
            "flags_extra_hip": list(m.flags_extra_hip),
            "generators": [g.command for g in m.generators],
            "embed": list(m.embed),
        }
        for m in plan.modules
    }
    assert got == expected(str(tree.meta_dir))
    # the C++ API the wrappers forward to, read from the tree's headers (qola::te_v3::mha_fwd(args, s))
    assert [(d.name, [p.type for p in d.params]) for m in plan.modules for d in api_of(m).decls] == [
        ("mha_fwd", ["mha_fwd_args", "const int&"]),
        ("mha_bwd", ["mha_bwd_args", "const int&"]),
    ]
    assert any(
        "drop_directions: ['fwd', 'fwd_splitkv', 'batch_prefill']: the manifest's blob_gen_cmd already replaced" in w
        for w in plan.warnings
    )


def test_dropped_ck_direction_keeps_its_dispatch_unless_ck_free(tree: AiterTree) -> None:
    """Without ENABLE_CK=0 the API still calls CK's dispatch: the dropped direction writes it alone."""
    text = '[qola]\nnamespace = "te"\n[[modules]]\nname = "libmha_bwd"\nmode = "cpp_itfs"\ndrop_directions = ["bwd"]\n'
    ck = plan_of(text, tree).modules[0].generators
    assert [(g.direction, g.dispatch_only) for g in ck] == [("bwd", True), (None, False)]
    assert [g.direction for g in plan_of(text, tree, env={"ENABLE_CK": "0"}).modules[0].generators] == [None]


def test_plain_and_expression_overrides_agree(tree: AiterTree) -> None:
    expr = TE_GFX1250
    plain = (
        TE_GFX1250.replace("\"'-D", '"-D')
        .replace("=1'\"", '=1"')
        .replace("=0'\"", '=0"')
        .replace("\"f'{AITER_CSRC_DIR}/", '"csrc/')
        .replace(".cu'\"", '.cu"')
        .replace(
            "\"f'{AITER_META_DIR}/hsa/codegen.py -m fmha_fwd_bf16 --output_dir {{}}'\"",
            '"hsa/codegen.py -m fmha_fwd_bf16 --output_dir {}"',
        )
    )
    assert "'" not in plain.split("[[modules]]", 1)[1]
    assert plan_of(plain, tree).to_json()["modules"] == plan_of(expr, tree).to_json()["modules"]


def test_qola_plan_json_shows_evaluated_overrides(tree: AiterTree, tmp_path: Path) -> None:
    m = tmp_path / "te.toml"
    m.write_text(TE_GFX1250)
    proc = run_qola("plan", "--manifest", str(m), "--aiter-root", str(tree.root), "--json")
    assert proc.returncode == 0, proc.stderr
    got = {
        mod["name"]: {
            "sources": mod["sources"],
            "flags_extra_cc": mod["flags_extra_cc"],
            "flags_extra_hip": mod["flags_extra_hip"],
            "generators": [g["command"] for g in mod["generators"]],
            "embed": mod["embed"],
        }
        for mod in json.loads(proc.stdout)["modules"]
    }
    assert got == expected(str(tree.meta_dir))
    assert "blob_gen_cmd already replaced" in proc.stderr


def _module(body: str) -> str:
    return (
        '[qola]\nnamespace = "te"\n[build]\narchitectures = ["gfx942"]\n'
        f'[[modules]]\nname = "libmha_bwd"\n[[modules]]\nname = "libmha_fwd"\nmode = "cpp_itfs"\n{body}\n'
    )


BAD = [  # (module body, key named, words of the message)
    (
        "flags_extra_cc = [\"-DFAV3_ON='1'\"]",
        "modules[1].flags_extra_cc[0]",
        "neither a plain flag (it holds quotes, which the build's shell-style split",
    ),
    ('flags_extra_cc = ["\'-DFAV3_ON=1"]', "modules[1].flags_extra_cc[0]", "cannot parse expression"),
    ('srcs = ["f\'{AITER_CSRC_DIR}/cpp_itfs/mha_fwd.cu"]', "modules[1].srcs[0]", "cannot parse expression"),
    (
        "srcs = [\"f'{AITER_SRC_DIR}/cpp_itfs/mha_fwd.cu'\"]",
        "modules[1].srcs[0]",
        "unknown name 'AITER_SRC_DIR' (did you mean AITER_CSRC_DIR?)",
    ),
    ('srcs = ["get_arch()"]', "modules[1].srcs[0]", "not a name in scope"),
    ("srcs = [\"__import__('os').system('true')\"]", "modules[1].srcs[0]", "neither a plain path"),
    ("srcs = [\"os.system('true')\"]", "modules[1].srcs[0]", "os has no attribute 'system'"),
    ('srcs = ["CK_DIR/include/x.cu"]', "modules[1].srcs[0]", "write an f-string: \"f'{CK_DIR}/include/x.cu'\""),
    ('srcs = ["None"]', "modules[1].srcs[0]", "evaluates to None, not a string"),
    ("srcs = [\"f'{AITER_CSRC_DIR}/../../../etc/x.cu'\"]", "modules[1].srcs[0]", "climbs out of"),
    ('add_srcs = ["../outside.cu"]', "modules[1].add_srcs[0]", "climbs out of"),
    ('extra_include = ["{CK_DIR}/include"]', "modules[1].extra_include[0]", "braces"),
    (
        'blob_gen_cmd = ["{AITER_META_DIR}/hsa/codegen.py -m fmha_v3_fwd --output_dir {}"]',
        "modules[1].blob_gen_cmd[0]",
        "braces other than {}",
    ),
    ('blob_gen_cmd = ["hsa/codegen.py -m \'fmha --output_dir {}"]', "modules[1].blob_gen_cmd[0]", "do not balance"),
    ('flags_extra_hip = ["DFAV3_ON=1"]', "modules[1].flags_extra_hip[0]", "does not start with '-'"),
    (
        'flags_extra_hip_per_source = {"*.cu" = ["\'-DX=1\'"]}',
        "modules[1].flags_extra_hip_per_source.*.cu[0]",
        "not a plain flag",
    ),
    ('embed = ["a"]\nhsa_subdirs = ["b"]', "modules[1]", "embed and hsa_subdirs are the same key"),
]


@pytest.mark.parametrize("body,key,words", BAD, ids=[b[1] + ":" + b[2][:20] for b in BAD])
def test_bad_override_exits_2_naming_the_key(tree: AiterTree, tmp_path: Path, body: str, key: str, words: str) -> None:
    m = tmp_path / "m.toml"
    m.write_text(_module(body))
    proc = run_qola("plan", "--manifest", str(m), "--aiter-root", str(tree.root))
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    assert f"{m.resolve()}: {key}: " in proc.stderr or f"{m}: {key}: " in proc.stderr, proc.stderr
    assert words in proc.stderr, proc.stderr
    assert "hint:" in proc.stderr


def test_hsa_subdirs_empty_embeds_nothing(tree: AiterTree) -> None:
    mod = plan_of(_module("hsa_subdirs = []"), tree).modules[1]
    assert mod.embed == ()
    assert plan_of(_module(""), tree).modules[1].embed == tuple(registry.load()["libmha_fwd"].embed)


def test_non_source_listed_is_a_note(tree: AiterTree) -> None:
    (tree.csrc / "cpp_itfs/mha_fwd.h").write_text("// fixture\n")
    plan = plan_of(_module('srcs = ["csrc/cpp_itfs/mha_fwd.cu", "csrc/cpp_itfs/mha_fwd.h"]'), tree)
    assert any("are not .cu or .cpp files" in w and "mha_fwd.h" in w for w in plan.warnings)


# ---------------------------------------------------------------------------- the classifier

NAMES = {"AITER_CSRC_DIR": "/t/csrc", "AITER_META_DIR": "/t", "CK_DIR": "/t/ck", "os": object(), "get_gfx": object()}
SCOPE = overrides.Scope(
    {"AITER_CSRC_DIR": "/t/csrc", "AITER_META_DIR": "/t", "CK_DIR": "/ck"}, Path("/t"), ("/t", "/ck")
)
_text = st.text(st.characters(exclude_categories=["Cs"]), max_size=40)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(["", "f", "r", "F", "rf", "u", "b"]), st.sampled_from(["'", '"']), _text)
def test_a_string_literal_is_always_an_expression(prefix: str, quote: str, rest: str) -> None:
    assert overrides.classify(f"{prefix}{quote}{rest}", NAMES) == overrides.EXPRESSION
    assert overrides.classify(f"  {prefix}{quote}{rest}", NAMES) == overrides.EXPRESSION


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(sorted(NAMES)), st.sampled_from(["", ".x", "()", "[0]", " + 'a'", "/a"]))
def test_a_value_starting_with_a_name_in_scope_is_an_expression(name: str, tail: str) -> None:
    assert overrides.classify(name + tail, NAMES) == overrides.EXPRESSION


_plain_path = st.from_regex(r"[A-Za-z0-9_.+-]{1,8}(/[A-Za-z0-9_.+-]{1,8}){0,3}", fullmatch=True)


@settings(max_examples=300, deadline=None)
@given(_plain_path)
def test_plain_paths_stay_literal_or_fail_loudly(path: str) -> None:
    """A plain relative path is either taken as itself (under the meta dir) or refused: never
    something else (it may start with a name in scope: then it is an expression, and evaluating
    it either gives a string or fails by name)."""
    if overrides.classify(path, SCOPE.names) == overrides.PLAIN:
        try:
            got = overrides.resolve(path, overrides.PATH, SCOPE, "k")
        except QolaError as exc:
            assert "climbs out" in exc.message and ".." in path
        else:
            assert got == str(Path("/t") / path)
    else:
        with pytest.raises(QolaError, match=r"^k: "):
            overrides.resolve(path, overrides.PATH, SCOPE, "k")


@settings(max_examples=300, deadline=None)
@given(_text, st.sampled_from(list(overrides.KINDS.values())))
def test_any_value_is_resolved_or_refused_by_key(value: str, kind: Any) -> None:
    """Every string gives a string or a QolaError naming the key; a refused plain value is never
    returned; a returned plain value carries no quote or brace (commands: balanced quotes, {} only)."""
    try:
        got = overrides.resolve(value, kind, SCOPE, "modules[0].x[0]")
    except QolaError as exc:
        assert exc.message.startswith("modules[0].x[0]: ")
        return
    assert isinstance(got, str)
    if overrides.classify(value, SCOPE.names) == overrides.PLAIN:
        assert overrides.plain_problem(value, kind) is None
        if kind != overrides.COMMAND:
            assert not re.search(r"['\"{}]", value)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["..", "a", "b", "."]), min_size=1, max_size=8))
def test_expression_paths_under_the_tree_stay_under_it(parts: list[str]) -> None:
    rel = "/".join(parts)
    expr = f"f'{{AITER_CSRC_DIR}}/{rel}'"
    try:
        got = overrides.resolve(expr, overrides.PATH, SCOPE, "k")
    except QolaError as exc:
        assert "climbs out of /t" in exc.message
        return
    assert got is not None
    assert os.path.normpath(got) == "/t" or os.path.normpath(got).startswith("/t/")


def test_cc_flags_reach_the_compile_before_the_hip_flags(tree: AiterTree) -> None:
    """AITER compiles .cu files with its cflags (flags_extra_cc among them) ahead of the HIP flags:
    TE's -DENABLE_CK=0 / -DFAV3_ON=1 must reach the compiler, after the HIP flags split as AITER does."""
    from qola.compile.steps import module_flags
    from qola.toolchain import hip as hip_mod
    from qola.toolchain.base import Toolchain

    fwd = plan_of(TE_GFX1250, tree).modules[0]
    tc = Toolchain("hip", "/x/hipcc", "7.2", "", "ab" * 32, ("gfx1250",), "c++", {}, unit_flags=hip_mod.UNIT_FLAGS)
    flags = module_flags(fwd, tc, Path("/b/blob"), Path("/b/include"))
    cc = [flags.index(f) for f in ("-DFAV3_ON=1", "-DENABLE_CK=0", "-DFAV1250_ON=1")]
    assert cc == sorted(cc) and max(cc) < flags.index("-DCK_TILE_FMHA_FWD_FAST_EXP2=1")
    assert not any("'" in f for f in flags)


def api_of(module: ModulePlan) -> Api:
    """The module's resolved API (every module asked for here has one)."""
    assert module.api is not None, module.name
    return module.api
