"""Hostile manifests and kernel trees (issue 11): every bad input is one clear error (exit 2),
never a traceback, a hang, an exhausted memory or a file written outside the output dirs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, cast

import pytest
from support.common import KERNELS
from support.limited import qola, user_error

from qola.core.errors import QolaError
from qola.plan.manifest import parse
from qola.plan.model import Plan
from qola.plan.planner import PlanInputs, make_plan
from qola.plan.tree.aiter import TABLE, open_tree

ARCHS = ("sm_90",)
QUICK = '[qola]\nnamespace = "qk"\n[build]\narchitectures = ["sm_90"]\n'


@pytest.fixture()
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "tree"
    shutil.copytree(KERNELS, root, ignore=shutil.ignore_patterns("__pycache__", "*.co"))
    return root


def table(root: Path) -> dict[str, Any]:
    return cast("dict[str, Any]", json.loads((root / TABLE).read_text()))


def set_table(root: Path, data: dict[str, Any] | str) -> None:
    (root / TABLE).write_text(data if isinstance(data, str) else json.dumps(data))


def plan(root: Path, text: str = QUICK, **kw: Any) -> Plan:
    return make_plan(parse(text, "m.toml"), open_tree(root), PlanInputs(archs=ARCHS, env={}, **kw))


def mf(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "m.toml"
    path.write_text(text)
    return path


def files_under(path: Path) -> set[str]:
    return {str(p.relative_to(path)) for p in path.rglob("*")}


# ---------------------------------------------------------------- 1, 2, 4: names from the tree


def test_table_md_name_escaping_the_output_dir_is_refused_and_nothing_is_written(tree: Path, tmp_path: Path) -> None:
    data = table(tree)
    data["module_softmax"]["md_name"] = "'../../../evil'"
    set_table(tree, data)
    m = mf(tmp_path, QUICK)
    work = tmp_path / "work"
    work.mkdir()
    before = files_under(tmp_path)
    user_error(
        qola("plan", "--manifest", str(m), "--aiter-root", str(tree), cwd=work),
        TABLE,
        "module 'module_softmax'",
        "'md_name'",
        "path separator",
    )
    user_error(
        qola(
            "build",
            "--manifest",
            str(m),
            "--aiter-root",
            str(tree),
            "-o",
            str(tmp_path / "out"),
            "--build-dir",
            str(tmp_path / "b"),
            "--dry-run",
            cwd=work,
        ),
        "module 'module_softmax'",
        "'md_name'",
    )
    assert {p for p in files_under(tmp_path) if p.split("/")[0] not in ("out", "b")} == before
    assert not escaped("evil", tmp_path)


def escaped(name: str, tmp_path: Path) -> list[Path]:
    """Files called `name*` that a '../' escape from the dirs under tmp_path could have written:
    anywhere below tmp_path, or directly in one of the dirs above it. (Not the whole of
    tmp_path.parent: sibling tests write their own 'evil.h' and the like there.)"""
    found = list(tmp_path.rglob(f"{name}*"))
    found += [p for up in tmp_path.parents[:5] for p in up.glob(f"{name}*")]
    return found


@pytest.mark.parametrize(
    "md_name,why",
    ids=["newline", "space", "star", "nul", "dotdot-slash", "dotdot", "long", "empty"],
    argvalues=[
        ("x\n", "control character"),
        ("a b", "space"),
        ("*", "not a C identifier"),
        ("x\x00y", "NUL"),
        ("../x", "path separator"),
        ("a..b", "'..'"),
        ("a" * 200, "at most 96"),
        ("", None),
    ],
)
def test_table_md_name_follows_the_manifest_rule(tree: Path, md_name: str, why: str) -> None:
    data = table(tree)
    data["module_softmax"]["md_name"] = repr(md_name)
    set_table(tree, data)
    if why is None:  # empty: the module key is the name, as in AITER
        assert next(m for m in plan(tree).modules if m.name == "module_softmax").md_name == "qk_module_softmax"
        return
    with pytest.raises(QolaError) as info:
        plan(tree)
    text = info.value.render()
    assert TABLE in text and "module 'module_softmax'" in text and "'md_name'" in text and why in text


@pytest.mark.parametrize(
    "key,why",
    ids=["space", "slash", "dotdot", "nul", "newline", "long", "dash"],
    argvalues=[
        ("bad key", "space"),
        ("a/b", "path separator"),
        ("..", "'..'"),
        ("x\x00y", "NUL"),
        ("x\n", "control"),
        ("k" * 200, "at most 96"),
        ("-x", "not a C identifier"),
    ],
)
def test_table_module_key_follows_the_manifest_rule(tree: Path, key: str, why: str) -> None:
    data = table(tree)
    data[key] = data.pop("module_softmax")
    set_table(tree, data)
    with pytest.raises(QolaError) as info:
        plan(tree)  # no [[modules]]: every table module, AITER's "all"
    text = info.value.render()
    assert TABLE in text and f"module key {key!r}" in text and why in text


def test_module_key_with_space_is_exit_2_not_ninja(tree: Path, tmp_path: Path) -> None:
    data = table(tree)
    data["mod x"] = data.pop("module_softmax")
    set_table(tree, data)
    user_error(
        qola("plan", "--manifest", str(mf(tmp_path, QUICK)), "--aiter-root", str(tree)),
        "module key 'mod x'",
        "contains a space",
    )


@pytest.mark.parametrize(
    "text,needle",
    ids=["md_name-nl", "name-nl", "sm-nl", "gfx-nl", "ns-nl", "sha-nl", "ver-nl", "ns-300", "md_name-120", "name-120"],
    argvalues=[
        ('[[modules]]\nname = "a"\nmd_name = "x\\n"\n', "modules[0].md_name"),
        ('[[modules]]\nname = "a\\n"\n', "modules[0].name"),
        ('[build]\narchitectures = ["sm_90\\n"]\n', "unknown architecture 'sm_90\\n'"),
        ('[build]\narchitectures = ["gfx942\\n"]\n', "unknown architecture 'gfx942\\n'"),
        ('[qola]\nnamespace = "te\\n"\n', "qola.namespace"),
        ('[qola]\naiter_commit = "abcd\\n"\n', "qola.aiter_commit"),
        ('[qola]\nrocm_versions = ["7.2\\n"]\n', "qola.rocm_versions"),
        ('[qola]\nnamespace = "' + "n" * 300 + '"\n', "at most 64"),
        ('[[modules]]\nname = "a"\nmd_name = "' + "m" * 120 + '"\n', "at most 96"),
        ('[[modules]]\nname = "' + "m" * 120 + '"\n', "at most 96"),
    ],
)
def test_manifest_names_fullmatch_and_are_bounded(text: str, needle: str) -> None:
    with pytest.raises(QolaError) as info:
        parse(text, "m.toml")
    assert needle in info.value.render()


def test_rules_end_in_backslash_z() -> None:
    from qola.core import rules

    for good, bad in (("x", "x\n"), ("sm_90", "sm_90\n"), ("gfx942", "gfx942\n")):
        assert rules.vendor(good) or rules.is_c_ident(good)
        assert not rules.vendor(bad) and not rules.is_c_ident(bad)
    assert rules.MAX_LIBRARY_NAME + len(".so.staging-4194304.tmp") < 255


def test_two_modules_with_one_md_name_is_an_error_naming_both(tree: Path) -> None:
    data = table(tree)
    data["module_softmax"]["md_name"] = "'module_rmsnorm'"
    set_table(tree, data)
    with pytest.raises(QolaError) as info:
        plan(tree)
    text = info.value.render()
    assert "'module_rmsnorm' and 'module_softmax' both build 'qk_module_rmsnorm'" in text


def test_manifest_md_name_clash_is_an_error(tree: Path) -> None:
    text = (
        QUICK
        + '[[modules]]\nname = "module_rmsnorm"\n[[modules]]\nname = "module_softmax"\nmd_name = "module_rmsnorm"\n'
    )
    with pytest.raises(QolaError, match="both build 'qk_module_rmsnorm'"):
        plan(tree, text)


# ---------------------------------------------------------------- 4: cpp_itfs and Python modules


def test_cpp_itfs_of_a_table_python_module_is_an_error(tree: Path, tmp_path: Path) -> None:
    text = QUICK + '[[modules]]\nname = "module_rmsnorm"\nmode = "cpp_itfs"\n'
    with pytest.raises(QolaError) as info:
        plan(tree, text)
    assert "module 'module_rmsnorm' is a Python extension module" in info.value.message
    hint = info.value.hint or ""
    assert 'mode = "pybind"' in hint and "is_python_module = false" in hint
    user_error(
        qola("plan", "--manifest", str(mf(tmp_path, text)), "--aiter-root", str(tree)), "is a Python extension module"
    )


def test_cpp_itfs_with_manifest_is_python_module_true_is_an_error(tree: Path) -> None:
    text = QUICK + '[[modules]]\nname = "libattn_fwd"\nmode = "cpp_itfs"\nis_python_module = true\n'
    with pytest.raises(QolaError, match="is_python_module = true contradicts mode cpp_itfs"):
        plan(tree, text)


def test_cpp_itfs_declared_torch_free_or_registered_plans(tree: Path) -> None:
    text = (
        QUICK + '[[modules]]\nname = "module_rmsnorm"\nmode = "cpp_itfs"\nis_python_module = false\n'
        'drop_srcs = ["*_pybind.cu"]\n[[modules]]\nname = "libattn_fwd"\nmode = "cpp_itfs"\n'
        '[[modules]]\nname = "libnew"\nmode = "cpp_itfs"\nsrcs = ["csrc/kernels/softmax.cu"]\n'
    )
    mods = {m.name: m for m in plan(tree, text).modules}
    assert not mods["module_rmsnorm"].is_python_module
    assert [Path(s).name for s in mods["module_rmsnorm"].sources] == ["rmsnorm.cu"]
    assert not mods["libattn_fwd"].is_python_module and not mods["libnew"].is_python_module


# ---------------------------------------------------------------- 3: the manifest file


def test_manifest_dev_zero_is_refused_at_once(tmp_path: Path) -> None:
    user_error(
        qola(
            "plan",
            "--manifest",
            "/dev/zero",
            "--aiter-root",
            str(KERNELS),
        ),
        "character device",
        "not a regular file",
    )


def test_manifest_fifo_is_refused_not_waited_on(tmp_path: Path) -> None:
    fifo = tmp_path / "m.toml"
    os.mkfifo(fifo)
    user_error(
        qola(
            "plan",
            "--manifest",
            str(fifo),
            "--aiter-root",
            str(KERNELS),
        ),
        "a FIFO",
    )


def test_manifest_too_big_and_a_directory(tmp_path: Path) -> None:
    big = tmp_path / "big.toml"
    big.write_text("# x\n" * (5 << 18))  # 5 MiB of comments
    user_error(qola("plan", "--manifest", str(big), "--aiter-root", str(KERNELS)), "at most 4,194,304")
    user_error(qola("plan", "--manifest", str(tmp_path), "--aiter-root", str(KERNELS)), "a directory")


def test_manifest_nested_5000_deep(tmp_path: Path) -> None:
    text = "x = " + "[" * 5000 + "]" * 5000 + "\n"
    with pytest.raises(QolaError, match="nests arrays or tables too deeply"):
        parse(text, "m.toml")
    user_error(qola("plan", "--manifest", str(mf(tmp_path, text)), "--aiter-root", str(KERNELS)), "too deeply")


# ---------------------------------------------------------------- 5: variant matrices


def test_huge_variant_matrix_is_refused_with_its_size(tmp_path: Path) -> None:
    opts = ", ".join(f"o{i} = [{', '.join(str(v) for v in range(40))}]" for i in range(6))
    text = (
        QUICK + '[[modules]]\nname = "libattn_fwd"\n[[variants]]\nmodule = "libattn_fwd"\n'
        f'pattern = "{"_".join("{o%d}" % i for i in range(6))}"\noptions = {{{opts}}}\n'
    )
    with pytest.raises(QolaError) as info:
        parse(text, "m.toml")
    assert "variants[0]: expands to 4,096,000,000 variants (40 o0 × 40 o1" in info.value.render()
    user_error(
        qola(
            "variants",
            "--manifest",
            str(mf(tmp_path, text)),
            "--aiter-root",
            str(KERNELS),
        ),
        "4,096,000,000 variants",
    )


# ---------------------------------------------------------------- 6: hostile table values


@pytest.mark.parametrize(
    "value,needle",
    ids=["width", "list-repr", "repeat", "unary-5000", "sum-5000"],
    argvalues=[
        ("f'{1:>99999999999}'", "format width or precision larger than 1000"),
        ("f'{[[\"a\"*100000]*100000]}'", "longer than 100000"),
        ("['a'*100000]*100000", "longer than 100000"),
        ("-" * 5000 + "1", "nested too deeply"),
        ("+".join(["1"] * 5000), "nested too deeply"),
    ],
)
def test_hostile_expression_is_exit_2_naming_module_and_key(
    tree: Path, tmp_path: Path, value: str, needle: str
) -> None:
    data = table(tree)
    data["module_softmax"]["flags_extra_hip"] = [value]
    set_table(tree, data)
    user_error(
        qola("plan", "--manifest", str(mf(tmp_path, QUICK)), "--aiter-root", str(tree)),
        "module 'module_softmax', key 'flags_extra_hip'",
        needle,
    )


def test_deep_json_in_the_table(tree: Path, tmp_path: Path) -> None:
    text = (tree / TABLE).read_text()
    set_table(tree, text.replace('"verbose": "False"', '"verbose": ' + "[" * 100000 + "]" * 100000, 1))
    user_error(
        qola("plan", "--manifest", str(mf(tmp_path, QUICK)), "--aiter-root", str(tree)), "JSON nested too deeply"
    )
    data = json.loads(text)
    data["module_softmax"]["third_party"] = json.loads("[" * 200 + "]" * 200)
    set_table(tree, data)
    with pytest.raises(QolaError, match="module 'module_softmax', key 'third_party': value nested more than 16"):
        plan(tree)


@pytest.mark.parametrize(
    "field,value,needle",
    [
        ("srcs", [5], "expected a string"),
        ("srcs", ["'a\\nb.cu'"], "NUL or line break"),
        ("flags_extra_hip", [["-O3"]], "expected a string"),
        ("extra_ldflags", 7, "expected a string"),
        ("is_python_module", "'yes'", "expected true or false"),
        ("flags_extra_hip_per_source", [5], "expected a table"),
        ("hip_clang_path", ["'x'"], "expected a string"),
    ],
)
def test_table_value_of_the_wrong_type(tree: Path, field: str, value: Any, needle: str) -> None:
    data = table(tree)
    data["module_softmax"][field] = value
    set_table(tree, data)
    with pytest.raises(QolaError) as info:
        plan(tree)
    assert f"module 'module_softmax', key '{field}'" in info.value.render() and needle in info.value.render()


# ---------------------------------------------------------------- 7: tree files that are not regular files


@pytest.mark.parametrize("rel", ["aiter/jit/core.py", TABLE])
def test_tree_file_fifo_is_refused_not_waited_on(tree: Path, tmp_path: Path, rel: str) -> None:
    (tree / rel).unlink()
    os.mkfifo(tree / rel)
    user_error(
        qola("plan", "--manifest", str(mf(tmp_path, QUICK)), "--aiter-root", str(tree)),
        f"{tree / rel} is a FIFO, not a regular file",
    )


def test_tree_file_symlink_to_dev_zero_is_refused(tree: Path, tmp_path: Path) -> None:
    (tree / TABLE).unlink()
    (tree / TABLE).symlink_to("/dev/zero")
    user_error(
        qola("plan", "--manifest", str(mf(tmp_path, QUICK)), "--aiter-root", str(tree)),
        "is a character device, not a regular file",
    )


def test_read_small(tmp_path: Path) -> None:
    from qola.plan.tree.files import read_small

    f = tmp_path / "f"
    f.write_bytes(b"x" * 10)
    assert read_small(f, limit=10, what="file") == b"x" * 10
    with pytest.raises(QolaError, match="10 bytes; at most 9"):
        read_small(f, limit=9, what="file")
    (tmp_path / "l").symlink_to(f)
    with pytest.raises(QolaError, match="symlink"):
        read_small(tmp_path / "l", limit=10, what="file", nofollow=True)
    with pytest.raises(FileNotFoundError):
        read_small(tmp_path / "missing", limit=10, what="file")


def test_tuned_config_fifo_is_refused(tmp_path: Path) -> None:
    good = tmp_path / "a_gemm.csv"
    good.write_text("M,us\n1,2\n")
    fifo = tmp_path / "b_gemm.csv"
    os.mkfifo(fifo)
    code = (
        "from qola.plan.tree.aiter_configs import MergedConfig, merge\nfrom qola.core.errors import QolaError\n"
        f"try:\n    merge(MergedConfig('a_gemm.csv', ({str(good)!r}, {str(fifo)!r}), ''))\n"
        "except QolaError as e:\n    print(e.message)\n"
    )
    try:  # in a child: opening a FIFO the old way blocks forever
        proc = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("reading a FIFO tuned config hung")
    assert f"{fifo} is a FIFO, not a regular file" in proc.stdout, proc.stdout + proc.stderr


# ---------------------------------------------------------------- 8: drop_srcs


@pytest.mark.parametrize(
    "pattern,needle", [("../secret.cu", "'..' component"), ("/etc/x.cu", "absolute path"), ("a\x00.cu", "NUL")]
)
def test_drop_srcs_outside_the_module_is_a_manifest_error(pattern: str, needle: str) -> None:
    with pytest.raises(QolaError) as info:
        parse(f'[[modules]]\nname = "a"\ndrop_srcs = [{json.dumps(pattern)}]\n', "m.toml")
    assert "modules[0].drop_srcs" in info.value.render() and needle in info.value.render()


def _git_tree(tree: Path) -> str:
    git = ["git", "-C", str(tree), "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "t"], check=True)
    return subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()


def test_drop_srcs_matching_nothing_in_the_pinned_tree_is_an_error(tree: Path, tmp_path: Path) -> None:
    head = _git_tree(tree)
    text = (
        f'[qola]\nnamespace = "qk"\naiter_commit = "{head}"\n[build]\narchitectures = ["sm_90"]\n'
        '[[modules]]\nname = "module_rmsnorm"\ndrop_srcs = ["rmsnorm_pybindd.cu"]\n'
    )
    user_error(
        qola("plan", "--manifest", str(mf(tmp_path, text)), "--aiter-root", str(tree)),
        "modules.module_rmsnorm.drop_srcs: 'rmsnorm_pybindd.cu' matches none of the module's sources",
        "nearest source names: rmsnorm_pybind.cu",
    )
    good = text.replace("rmsnorm_pybindd.cu", "*_pybind.cu")
    proc = qola("plan", "--manifest", str(mf(tmp_path, good)), "--aiter-root", str(tree), "--json")
    assert proc.returncode == 0, proc.stderr
    assert [Path(s).name for s in json.loads(proc.stdout)["modules"][0]["sources"]] == ["rmsnorm.cu"]


def test_drop_srcs_matching_nothing_in_an_unpinned_tree_warns(tree: Path) -> None:
    text = QUICK + '[[modules]]\nname = "module_rmsnorm"\ndrop_srcs = ["gone.cu"]\n'
    warnings = plan(tree, text).warnings
    assert any("'gone.cu' matches none of the module's sources" in w and "pins" in w for w in warnings)


def test_tuned_config_name_from_core_py_cannot_leave_the_build_dir(tree: Path, tmp_path: Path) -> None:
    core = tree / "aiter/jit/core.py"
    core.write_text(core.read_text().replace('"rmsnorm_tuned"', '"../../../evil_tuned"'))
    user_error(
        qola("plan", "--manifest", str(mf(tmp_path, QUICK)), "--aiter-root", str(tree)),
        "aiter/jit/core.py: AITER_CONFIG_RMSNORM_FILE: tuned-config name '../../../evil_tuned'",
        "path separator",
    )
