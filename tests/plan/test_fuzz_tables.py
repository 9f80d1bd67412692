"""Fuzz over module tables (the tree's optCompilerConfig.json), not only manifests: odd module
keys, hostile expressions, huge and deeply nested values, wrong types. Planning either succeeds
with names that are safe as file names, or raises QolaError (exit 2) — never another exception —
and writes nothing anywhere."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.common import KERNELS

from qola.core import rules
from qola.core.errors import QolaError
from qola.plan.manifest import parse
from qola.plan.planner import PlanInputs, make_plan
from qola.plan.tree.aiter import DEFAULTS, TABLE, open_tree

BASE = json.loads((KERNELS / TABLE).read_text())
HOSTILE = [
    "f'{1:>99999999999}'",
    "f'{[[\"a\"*100000]*100000]}'",
    "'a'*100000",
    "['a'*100000]*100000",
    "'../../evil'",
    "'x\\n'",
    "'*'",
    "'a b'",
    "'x\\x00'",
    "''",
    "None",
    "True",
    "7",
    "__import__('os').system('touch pwned')",
    "open('/etc/passwd').read()",
    "(lambda: 1)()",
    "-" * 3000 + "1",
    "(" * 300 + "1" + ")" * 300,
    "+".join(["1"] * 3000),
    "1e308*10",
    "2**64**64",
    "f'{AITER_CSRC_DIR}/kernels/rmsnorm.cu'",
    "f'{AITER_CSRC_DIR}/../../../x.cu'",
    "f'{AITER_CSRC_DIR}/attn'",
    "f'{AITER_CSRC_DIR}/attn/generate.py -d fwd --receipt 0 --output_dir {{}}'",
    "os.environ.get('HOME')",
    "get_gfx()",
    "str(int('9'*40))",
    "f'{1:{\"9\"*9}}'",
]
ODD_KEYS = ["../x", "a b", "x\x00y", "..", "*", "k" * 200, "x\n", "", "-", "é", "module_rmsnorm", "libattn_fwd"]
FIELDS = [*DEFAULTS, "is_experimental", "no_such_key"]


@dataclass(frozen=True)
class Deep:
    """A list nested ``n`` deep, written as JSON text (json.dumps itself recurses)."""

    n: int


def dump(value: Any) -> str:
    if isinstance(value, Deep):
        return "[" * value.n + "]" * value.n
    if isinstance(value, list):
        return "[" + ", ".join(dump(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)}: {dump(v)}" for k, v in value.items()) + "}"
    return json.dumps(value)


scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=24),
    st.sampled_from(HOSTILE),
)
values = st.recursive(
    scalars,
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=6), kids, max_size=3),
    max_leaves=10,
)
field_values = st.one_of(values, values, values, values, values, st.sampled_from([2, 17, 60, 900, 5000]).map(Deep))
entries = st.dictionaries(st.sampled_from(FIELDS), field_values, max_size=4)
keys = st.one_of(st.sampled_from(sorted(BASE)), st.sampled_from(ODD_KEYS), st.text(max_size=12))


@st.composite
def tables(draw: st.DrawFn) -> tuple[str, str | None]:
    """(table JSON text, a module to ask for or None for AITER's "all")."""
    if draw(st.integers(0, 19)) == 0:
        return draw(st.sampled_from(["[]", "{", "null", '{"a": 1}', '{"a": []}', "\x00", ""])), None
    table = {k: dict(v) for k, v in BASE.items()} if draw(st.booleans()) else {}
    changes = draw(st.dictionaries(keys, entries, min_size=1, max_size=3))
    for key, entry in changes.items():
        table.setdefault(key, {}).update(entry)
    ask = draw(st.one_of(st.none(), st.sampled_from(sorted(table))))
    return dump(table), ask


def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st_ = p.lstat()
            out[str(p.relative_to(root))] = (st_.st_size, st_.st_mtime_ns)
    return out


@pytest.fixture(scope="module")
def fuzz_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("fuzz")
    shutil.copytree(KERNELS, base / "tree", ignore=shutil.ignore_patterns("__pycache__", "*.co"))
    (base / "out").mkdir()
    return base


@settings(
    max_examples=120,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    case=tables(), arch=st.sampled_from([("sm_90",), ("gfx942", "gfx950")]), mode=st.sampled_from([None, "cpp_itfs"])
)
def test_hostile_tables_plan_or_refuse(
    fuzz_root: Path, case: tuple[str, str | None], arch: tuple[str, ...], mode: str | None
) -> None:
    text, ask = case
    root = fuzz_root / "tree"
    (root / TABLE).write_text(text, errors="surrogatepass")
    before = snapshot(fuzz_root)
    manifest = f'[qola]\nnamespace = "qk"\n[build]\narchitectures = {json.dumps(list(arch))}\n'
    if ask is not None:
        manifest += f"[[modules]]\nname = {json.dumps(ask)}\n"
    try:
        plan = make_plan(
            parse(manifest, "m.toml"),
            open_tree(root),
            PlanInputs(archs=arch, mode=mode, env={}, hip_version="7.2.0" if arch[0].startswith("gfx") else None),
        )
    except QolaError as exc:
        assert exc.render().startswith("error: ")
    else:
        for mod in plan.modules:  # every name that becomes a file name is one the manifest would accept
            assert rules.module_key_problem(mod.name) is None, mod.name
            assert rules.is_c_ident(mod.md_name) and len(mod.md_name) <= rules.MAX_LIBRARY_NAME, mod.md_name
            for s in (*mod.sources, *mod.flags_extra_hip, *mod.flags_extra_cc, *mod.include_dirs):
                assert "\x00" not in s and "\n" not in s
        assert len({m.md_name for m in plan.modules}) == len(plan.modules)
        json.dumps(plan.to_json())
    assert snapshot(fuzz_root) == before  # planning writes nothing, anywhere in or next to the tree
    assert not (Path.cwd() / "pwned").exists()
