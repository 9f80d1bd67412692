"""The module-table evaluator: AITER's forms work, anything else is refused and never runs."""

from __future__ import annotations

import builtins
import contextlib
import os
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qola.core.errors import QolaError
from qola.plan.tree.aiter import AiterTree, expression_names
from qola.plan.tree.safe_eval import evaluate


@pytest.fixture()
def names(tmp_path: Path) -> dict[str, Any]:
    tree = AiterTree(tmp_path, tmp_path / "aiter_meta", "installed")
    return expression_names(tree, archs=("gfx942", "gfx950"), env={"CK_TILE_X": "7"}, hip_version="7.2.1")


def test_aiter_forms(names: dict[str, Any], tmp_path: Path) -> None:
    meta = tmp_path / "aiter_meta"
    assert evaluate("f'{AITER_CSRC_DIR}/kernels/a.cu'", names) == f"{meta}/csrc/kernels/a.cu"
    assert evaluate("f'{CK_DIR}/example'", names) == f"{meta}/3rdparty/composable_kernel/example"
    assert evaluate("f'-DX={os.environ.get(\"CK_TILE_X\", 2)}'", names) == "-DX=7"
    assert evaluate("f'-DY={os.environ.get(\"CK_TILE_Y\", 2)}'", names) == "-DY=2"
    assert evaluate("os.environ.get('MHA_HIP_CLANG_PATH')", names) is None
    assert evaluate("f'{get_asm_dir()}/fmha_v3_fwd/codegen.py --output_dir {{}}'", names) == (
        f"{meta}/hsa/gfx950//fmha_v3_fwd/codegen.py --output_dir {{}}"
    )
    assert evaluate("get_gfx()", names) == "gfx950"  # the last target arch
    assert (
        evaluate(
            "'-mllvm --misched-prera-direction=bottomup' if int(torch.version.hip.split('.')[0]) >= 7 "
            "else '-mllvm --misched-bottomup=1'",
            names,
        )
        == "-mllvm --misched-prera-direction=bottomup"
    )
    assert evaluate("'-DENABLE_TORCH_FP8' if hasattr(torch, 'float8_e4m3fnuz') else ''", names) == "-DENABLE_TORCH_FP8"
    assert evaluate("hasattr(torch, 'no_such_thing')", names) is False
    assert evaluate("str(int('3') + 1)", names) == "4"
    assert evaluate("None", names) is None and evaluate("True", names) is True
    assert evaluate("[1, 'a'][1:]", names) == ["a"]


def test_old_hip_takes_other_branch(tmp_path: Path) -> None:
    tree = AiterTree(tmp_path, tmp_path, "develop")
    names = expression_names(tree, archs=("gfx90a",), env={}, hip_version="5.2.3")
    expr = "'new' if int(torch.version.hip.split('.')[0]) >= 7 else 'old'"
    assert evaluate(expr, names) == "old"


HOSTILE = [
    "__import__('os').system('touch {marker}')",
    "os.system('touch {marker}')",
    "open('{marker}', 'w').write('x')",
    "().__class__.__bases__[0].__subclasses__()",
    "CK_DIR.__class__.__mro__",
    "get_gfx.__globals__",
    "(lambda: __import__('os').system('touch {marker}'))()",
    "[__import__('os').system('touch {marker}') for _ in 'a']",
    "{{x: 1 for x in 'ab'}}",
    "{{1, 2}}",
    "exec('import os; os.system(\"touch {marker}\")')",
    "eval('1')",
    "getattr(os, 'system')('touch {marker}')",
    "os.environ.__class__",
    "os.environ._data",
    "'{{0.__class__}}'.format(1)",
    "2 ** 100000",
    "10 ** 10 ** 10",
    "'a' * 10 ** 9",
    "[1] * 10 ** 9",
    "(x := 1)",
    "torch.version.__dict__",
    "hasattr(CK_DIR, 'upper')",
    "int('9' * 5000)",
    "breakpoint()",
    "'a'.replace('a', 'b' * 99999).replace('b', 'c' * 99999)",
    "f'{{get_gfx:>{{\"9\" * 5}}}}'",
]


@pytest.mark.parametrize("template", HOSTILE)
def test_hostile_expressions_refused_and_nothing_ran(
    template: str, names: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = tmp_path / "ran"
    calls = []

    def system(*a: object) -> int:
        calls.append(a)
        return 0

    monkeypatch.setattr(os, "system", system)
    real_import = builtins.__import__

    def spy_import(name: str, *a: Any, **k: Any) -> ModuleType:
        if name in ("os", "subprocess", "sys", "shutil", "posix"):
            calls.append(("import", name))
        return real_import(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", spy_import)
    expr = template.format(marker=marker)
    try:
        with pytest.raises(QolaError) as info:
            evaluate(expr, names, where="optCompilerConfig.json: module_x, key 'srcs'[0]")
    finally:
        monkeypatch.setattr(builtins, "__import__", real_import)
    assert not marker.exists()
    assert calls == []
    text = info.value.render()
    assert "module_x" in text and "srcs" in text  # says where
    assert ("refused" in text) or ("cannot parse" in text)


def test_unknown_name_named(names: dict[str, Any]) -> None:
    with pytest.raises(QolaError, match="unknown name 'NOPE'"):
        evaluate("f'{NOPE}/x'", names)


def _fuzz_names() -> dict[str, Any]:
    tree = AiterTree(Path("/nonexistent"), Path("/nonexistent"), "develop")
    return expression_names(tree, archs=("gfx942",), env={"A": "1"}, hip_version="6.4.0")


expr_atoms = st.sampled_from(
    [
        "1",
        "'a'",
        "CK_DIR",
        "os",
        "os.environ",
        "torch.version.hip",
        "get_gfx()",
        "int",
        "hasattr",
        "None",
        "True",
        "[1, 2]",
        "'x'.split",
        "AITER_CONFIGS",
        "__x",
        "lambda: 0",
    ]
)
expr_ops = st.sampled_from(
    [" + ", " * ", " if True else ", " and ", " or ", " == ", "(", ")", "[", "]", ".", ", ", " ** ", "f'{", "}'"]
)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.one_of(expr_atoms, expr_ops), min_size=1, max_size=10))
def test_fuzz_evaluator_only_qolaerror(parts: list[str]) -> None:
    with contextlib.suppress(QolaError):
        evaluate("".join(parts), _fuzz_names())


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=60))
def test_fuzz_evaluator_raw_text(text: str) -> None:
    with contextlib.suppress(QolaError):
        evaluate(text, _fuzz_names())
