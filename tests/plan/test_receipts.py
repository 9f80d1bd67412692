"""Receipt 700 without a patch (issue 31): a CK generator that does not know a receipt lists the same
kernels as without one; qola then applies receipt 700's selection itself through its variant filter
and says so in the plan, refuses any other unknown receipt, and leaves a generator that knows the
receipt alone (qola.plan.receipts). Fixture trees: tests/support/receipt_tree.py; the real CK: the
amd-aiter sdist (marker aiter)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from support import receipt_tree as rt
from support.common import run_qola

NOTE = "does not know receipt 700"


def plan(tmp: Path, tree: Path, receipt: int | None, extra: str = "") -> tuple[dict[str, Any], str]:
    m = rt.manifest(tmp / f"m{receipt}.toml", receipt, extra)
    proc = run_qola("plan", "--manifest", str(m), "--aiter-root", str(tree), "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout), proc.stderr


def files(data: dict[str, Any]) -> dict[tuple[str, str], set[str]]:
    """(module, direction) -> the file names its generator writes under the plan's filter."""
    return {
        (m["name"], g["direction"]): {Path(f).name for f in g["files"]}
        for m in data["modules"]
        for g in m["generators"]
    }


def test_a_generator_ignoring_700_gets_qolas_selection_and_the_plan_says_so(tmp_path: Path) -> None:
    old = rt.write_tree(tmp_path / "old", ())
    new = rt.write_tree(tmp_path / "new", (600, 700))
    got, err = plan(tmp_path, old, 700)
    want, want_err = plan(tmp_path, new, 700)
    # what qola selects on the old generator is exactly what the generator that knows 700 lists
    assert files(got) == files(want)
    assert len(files(got)[("libmha_fwd", "fwd")]) == 9 and len(files(got)[("libmha_bwd", "bwd")]) == 73
    assert files(got)[("libmha_fwd", "fwd_splitkv")] == {"fmha_fwd_splitkv_api"}  # the dispatch alone
    notes = [w for w in got["warnings"] if NOTE in w]
    assert len(notes) == 4 and all("qola applies it" in w for w in notes), got["warnings"]
    assert any("fwd: selects fp16/bf16, row-major V, with LSE" in w for w in notes)
    assert err.count(NOTE) == 4  # printed, not only recorded
    gens = {(m["name"], g["direction"]): g for m in got["modules"] for g in m["generators"]}
    assert {k: g["qola_receipt"] for k, g in gens.items()} == dict.fromkeys(gens, "700")
    assert gens[("libmha_fwd", "batch_prefill")]["dispatch_only"]
    text = run_qola("plan", "--manifest", str(tmp_path / "m700.toml"), "--aiter-root", str(old)).stdout
    assert text.count("receipt   700, applied by qola") == 4
    # the generator that knows 700 is left alone: no note, no filter, no mark
    assert not [w for w in want["warnings"] if NOTE in w] and NOTE not in want_err
    assert all(g["filter"] is None and g["qola_receipt"] is None for m in want["modules"] for g in m["generators"])


def test_declared_variants_are_narrowed_by_qolas_receipt(tmp_path: Path) -> None:
    old = rt.write_tree(tmp_path / "old", ())
    new = rt.write_tree(tmp_path / "new", (700,))
    variants = '[[mha_fwd_variants]]\ndtype = "bf16"\n[[mha_bwd_variants]]\ndeterministic = false\n'
    got, _ = plan(tmp_path, old, 700, variants)
    want, _ = plan(tmp_path, new, 700, variants)
    assert files(got) == files(want)
    fwd = files(got)[("libmha_fwd", "fwd")] - {"fmha_fwd_api"}
    assert len(fwd) == 4 and all("_bf16_" in f and "_vr_" in f and "_nsquant" in f for f in fwd)
    assert not any("storerandval" in f or "_deterministic" in f for f in files(got)[("libmha_bwd", "bwd")])


def test_another_unknown_receipt_is_an_error_naming_it_and_the_generator(tmp_path: Path) -> None:
    old = rt.write_tree(tmp_path / "old", ())
    m = rt.manifest(tmp_path / "m.toml", 123)
    proc = run_qola("plan", "--manifest", str(m), "--aiter-root", str(old))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "receipt 123 is unknown to the tree's generator" in proc.stderr
    assert f"{old}/{rt.CK}/generate.py -d fwd --receipt 123" in proc.stderr
    # a receipt the generator knows is no error (600 lists fewer than no receipt)
    known = rt.write_tree(tmp_path / "known", (600,))
    assert (
        run_qola(
            "plan", "--manifest", str(rt.manifest(tmp_path / "k.toml", 600)), "--aiter-root", str(known)
        ).returncode
        == 0
    )


def _count(data: dict[str, Any]) -> int:
    return sum(
        len([f for f in g["files"] if not Path(f).stem.endswith("_api")])
        for m in data["modules"]
        for g in m["generators"]
        if g["files"] is not None and "01_fmha/generate.py" in g["command"]
    )


@pytest.mark.aiter
@pytest.mark.slow
def test_te_manifest_on_the_sdist_plans_receipt_700(aiter_root: Path, tmp_path: Path) -> None:
    """TE's manifest shape (two archs, receipt 700, the split/prefill directions dropped) on the
    amd-aiter sdist, whose CK predates receipt 700: qola applies it, and the CK kernel files planned
    fall far below the table's own receipt (600). docs/benchmarks.md records the counts."""
    base = (
        '[qola]\nnamespace = "te"\n[build]\narchitectures = ["gfx950", "gfx942"]\n'
        '[[modules]]\nname = "libmha_fwd"\nmode = "cpp_itfs"\n{r}'
        'drop_srcs = ["mha_fwd_split.cu", "mha_fwd_batch_prefill.cu"]\n'
        'drop_directions = ["fwd_splitkv", "batch_prefill"]\n'
        '[[modules]]\nname = "libmha_bwd"\nmode = "cpp_itfs"\n{r}'
    )
    counts = {}
    for name, r in (("table", ""), ("te", "receipt = 700\n")):
        m = tmp_path / f"{name}.toml"
        m.write_text(base.format(r=r))
        proc = run_qola("plan", "--manifest", str(m), "--aiter-root", str(aiter_root), "--json")
        assert proc.returncode == 0, proc.stderr
        data = json.loads(proc.stdout)
        counts[name] = _count(data)
        if r:
            assert sum(NOTE in w for w in data["warnings"]) == 2, data["warnings"]  # fwd and bwd
    print(f"CK kernel files planned: table receipt {counts['table']}, receipt 700 {counts['te']}")
    assert counts["te"] * 10 < counts["table"] * 6, counts  # 11,260 against 20,636 (2026-11-26)


def test_a_receipt_a_non_ck_generator_rejects_is_refused_at_plan_time(tmp_path: Path) -> None:
    """Issue 51: the example tree's generator (not CK's) exits 2 on ``--receipt 99``; ``plan`` and
    ``variants`` said nothing (rc 0) and only the build failed. A receipt it knows still plans."""
    from support.common import KERNELS

    body = '[qola]\nnamespace = "qk"\n[build]\narchitectures = ["sm_90"]\n[[modules]]\nname = "libattn_fwd"\n'
    m = tmp_path / "m.toml"
    m.write_text(body + 'mode = "cpp_itfs"\nreceipt = 99\n')
    for command in ("plan", "variants"):
        proc = run_qola(command, "--manifest", str(m), "--aiter-root", str(KERNELS))
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, (command, proc.stderr)
        assert "module libattn_fwd: receipt 99 is rejected by the tree's generator" in proc.stderr, proc.stderr
        assert "unknown receipt 99" in proc.stderr  # the generator's own words
    m.write_text(body + 'mode = "cpp_itfs"\nreceipt = 1\n')
    assert run_qola("plan", "--manifest", str(m), "--aiter-root", str(KERNELS)).returncode == 0
