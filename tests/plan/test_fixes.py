"""qola's fixes of the tree's code (qola/plan/fixes.py), decided on the fixture tree of
tests/support/fixes_tree.py (the shape of AITER at TE's pin where the fixes change it): each fix
found and applied, idempotent (its own result reads as "present"), a half-matching file "changed"
(its modules fail naming it, never skipped), an older AITER (the sdist's shape) "absent"; the plan
lists them, ``[qola] fixes`` switches them, the key follows them and the tree is never written."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from support import fixes_tree as ft
from support.common import run_qola

from qola.core.errors import QolaError
from qola.plan import fixes


def _tree(tmp: Path) -> Path:
    return ft.write_tree(tmp / "aiter")


def _text(name: str) -> str:
    fix = fixes.by_name(name)
    return ft.COMMON if fix.file.endswith(".h") else ft.SOURCE


@pytest.mark.parametrize("name", fixes.NAMES)
def test_each_fix_applies_to_the_pins_shape_once(name: str) -> None:
    fix = fixes.by_name(name)
    text = _text(name)
    after, state, note = fixes.apply_fix(fix, text)
    assert (state, note) == (fixes.APPLIED, "") and after != text
    assert f"qola fix {name}" in after  # the staged copy says which fix changed it
    again, state2, note2 = fixes.apply_fix(fix, after)
    assert (again, state2) == (after, fixes.PRESENT) and "already has it" in note2


def test_what_each_fix_changes() -> None:
    after = fixes.fixed_text(fixes.FIXES, "csrc/cpp_itfs/mha_bwd.cu", ft.SOURCE)
    fallback = after.index("return asm_ret;")
    assert after.index("if(a.v3_api_check)", fallback) < after.index("fmha_bwd_launcher launcher")
    load = after.index("new AiterAsmKernel")
    assert "return 1;" in after[after.index("float fmha_v3_bwd(mha_bwd_args a") : load]
    assert "/*zero_init=*/a.is_deterministic && a.is_group_mode" in after
    assert 'if(arch_id == "gfx1250" && mt == 1 && a.seqlen_q == a.seqlen_k)' in after
    common = fixes.fixed_text(fixes.FIXES, "csrc/include/aiter_hip_common.h", ft.COMMON)
    assert "if(qola_asm_dir_first && AITER_ASM_DIR != nullptr)" in common


def test_a_half_matching_file_is_changed_and_an_older_one_absent() -> None:
    changed = ft.SOURCE.replace(
        "    if(asm_ret != -1)\n        return asm_ret;", "    if(asm_ret >= 0) { return asm_ret; }"
    )
    _after, state, note = fixes.apply_fix(fixes.by_name("bwd-probe-no-fallback"), changed)
    assert state == fixes.CHANGED and "bwd-probe-no-fallback" in note and "mha_bwd.cu" in note
    # the sdist's AITER: a loader that reads AITER_ASM_DIR and has no embedded map at all
    older = 'void load(const char* hsaco) { const char* AITER_ASM_DIR = std::getenv("AITER_ASM_DIR"); }\n'
    assert fixes.apply_fix(fixes.by_name("asm-embedded-first"), older)[1] == fixes.ABSENT


def test_unknown_fix_names_are_refused_with_the_nearest() -> None:
    with pytest.raises(QolaError, match="did you mean bwd-probe-no-fallback"):
        fixes.chosen(("bwd-probe-no-falback",), "[qola].fixes")
    assert fixes.chosen(()) == ()  # "none" / []
    assert fixes.chosen(None) == fixes.FIXES == fixes.chosen(("all",))


def _plan(tmp: Path, tree: Path, fixes_line: str | None, *extra: str) -> dict[str, Any]:
    m = ft.manifest(tmp / "m.toml", fixes_line)
    proc = run_qola("plan", "--manifest", str(m), "--aiter-root", str(tree), "--json", *extra)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data: dict[str, Any] = json.loads(proc.stdout)
    return data


def _digests(tree: Path) -> dict[str, str]:
    return {
        str(p.relative_to(tree)): hashlib.sha256(p.read_bytes()).hexdigest() for p in tree.rglob("*") if p.is_file()
    }


def test_the_plan_lists_the_fixes_and_the_manifest_switches_them(tmp_path: Path) -> None:
    tree = _tree(tmp_path)
    before = _digests(tree)
    data = _plan(tmp_path, tree, None)
    assert [(f["name"], f["status"], f["modules"]) for f in data["fixes"]] == [
        (n, "applied", ["libmha_bwd"]) for n in fixes.NAMES
    ]
    assert _plan(tmp_path, tree, '"none"')["fixes"] == []
    assert [f["name"] for f in _plan(tmp_path, tree, '["bwd-det-group-zero-ws"]')["fixes"]] == ["bwd-det-group-zero-ws"]
    assert _plan(tmp_path, tree, None, "--fixes", "none")["fixes"] == []  # the command line beats the manifest
    text = run_qola("plan", "--manifest", str(tmp_path / "m.toml"), "--aiter-root", str(tree))
    assert "fix         bwd-probe-no-fallback: applied, csrc/cpp_itfs/mha_bwd.cu" in text.stdout
    assert _digests(tree) == before  # planning reads the tree, never writes it
    bad = ft.manifest(tmp_path / "bad.toml", '["bwd-probe"]')
    proc = run_qola("plan", "--manifest", str(bad), "--aiter-root", str(tree))
    assert proc.returncode == 2 and "[qola].fixes: no fix named 'bwd-probe'" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_the_build_key_follows_the_fixes(tmp_path: Path) -> None:
    tree = _tree(tmp_path)
    keys = []
    for line in (None, '"none"', '["bwd-gfx1250-causal"]'):
        m = ft.manifest(tmp_path / "k.toml", line)
        proc = run_qola("plan", "--manifest", str(m), "--aiter-root", str(tree), "--key")
        assert proc.returncode == 0, proc.stderr[-2000:]
        keys.append(proc.stdout.split()[-1])
    assert len(set(keys)) == 3


def test_a_changed_target_fails_its_module_naming_the_fix(tmp_path: Path) -> None:
    tree = _tree(tmp_path)
    src = tree / "csrc/cpp_itfs/mha_bwd.cu"
    src.write_text(
        src.read_text().replace(
            "    if(asm_ret != -1)\n        return asm_ret;", "    if(asm_ret >= 0) return asm_ret;"
        )
    )
    data = _plan(tmp_path, tree, None)
    assert {f["name"]: f["status"] for f in data["fixes"]}["bwd-probe-no-fallback"] == "changed"
    assert any("bwd-probe-no-fallback" in w and "libmha_bwd" in w for w in data["warnings"])
    out = tmp_path / "out"
    proc = run_qola("build", "--manifest", str(tmp_path / "m.toml"), "--aiter-root", str(tree), "-o", str(out))
    assert proc.returncode == 1, proc.stdout + proc.stderr[-3000:]
    assert "fix bwd-probe-no-fallback" in proc.stdout + proc.stderr
    assert not (out / "lib" / "te_libmha_bwd.so").exists()
    assert not list((tmp_path / "out.build").rglob("*.o"))  # failed before anything compiled


def test_the_overlay_is_bounded_and_names_what_it_stages(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The staged dirs are copied whole: a tree that fills them past the bound is refused with a
    message (never a build that eats the memory), and what is staged is the fixed dirs' files."""
    from qola.compile import overlay
    from qola.plan.model import Plan

    tree = _tree(tmp_path)
    plan = Plan.from_json(_plan(tmp_path, tree, None))
    staged = overlay.staged(plan, tmp_path / "fixed")
    assert set(staged.files) == {
        "csrc/cpp_itfs/mha_bwd.cu",
        "csrc/include/aiter_hip_common.h",
        "csrc/include/mha_bwd.h",
    }
    assert staged.links["csrc/include/ck_lite"] == str(tree / "csrc" / "include" / "ck_lite")
    assert "aiter" in staged.links and ".git" not in staged.links
    monkeypatch.setattr(overlay, "MAX_STAGED_TOTAL", 100)
    with pytest.raises(QolaError, match="more than 0 MiB of files"):
        overlay.staged(plan, tmp_path / "fixed")
