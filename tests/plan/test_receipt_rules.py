"""Receipt 700 as QoLA applies it today, and a receipt judged per generator script (issues 40, 41).

* QoLA's AITER patch 0003 adds receipt 700 to CK's fMHA codegen without sink kernels; its newer
  patch 0011 drops that condition, so sink kernels are in. qola's own receipt 700 (on a CK that
  lacks it) follows both, and the plan note names the rule and the patches it comes from.
* A receipt is known to a generator script when any direction's listing changes with it: a
  direction whose kernels the receipt leaves as they are is no evidence that the script ignores it.

Fixture trees: tests/support/receipt_tree.py (the project's own CK-shaped generator).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from support import receipt_tree as rt
from support.common import run_qola


def plan(tmp: Path, tree: Path, receipt: int | None, name: str = "m") -> tuple[dict[str, Any], str]:
    m = rt.manifest(tmp / f"{name}{receipt}.toml", receipt)
    proc = run_qola("plan", "--manifest", str(m), "--aiter-root", str(tree), "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout), proc.stderr


def fwd_files(data: dict[str, Any]) -> set[str]:
    (gen,) = [g for m in data["modules"] for g in m["generators"] if g["direction"] == "fwd"]
    return {Path(f).name for f in gen["files"]}


def test_qolas_receipt_700_keeps_sink_kernels_as_qolas_0011_does(tmp_path: Path) -> None:
    old = rt.write_tree(tmp_path / "old", (), sink=True)
    new = rt.write_tree(tmp_path / "new", (600, 700), sink=True)  # a CK with 0003 and 0011
    got, err = plan(tmp_path, old, 700, "old")
    want, _ = plan(tmp_path, new, 700, "new")
    kernels = fwd_files(got) - {"fmha_fwd_api"}
    assert fwd_files(got) == fwd_files(want)
    assert len(kernels) == 16, sorted(kernels)  # 2 hdims x 2 dtypes x 2 modes x sink/nsink
    assert sum("_sink_" in f for f in kernels) == 8 and sum("_nsink_" in f for f in kernels) == 8
    # the plan says which rule it applied, and from which of QoLA's patches
    (note,) = [w for w in got["warnings"] if "does not know receipt 700" in w and ": fwd: " in w]
    assert "QoLA's AITER patches 0003 and 0011" in note and "sink kernels included" in note, note
    assert "QoLA's AITER patches 0003 and 0011" in err
    # a CK that knows 700 is left alone (whatever its own sink rule)
    assert not [w for w in want["warnings"] if "receipt 700" in w]


def test_a_receipt_one_direction_ignores_is_known_to_the_script(tmp_path: Path) -> None:
    """The fixture's receipt 600 narrows fwd (row-major V only) and leaves bwd as it is: the script
    knows it, so neither direction is refused, and qola applies nothing of its own."""
    tree = rt.write_tree(tmp_path / "t", (600,), table_receipt=0)
    m = rt.manifest(tmp_path / "m.toml", 600)
    proc = run_qola("plan", "--manifest", str(m), "--aiter-root", str(tree), "--json")
    assert proc.returncode == 0, proc.stderr
    assert "unknown" not in proc.stderr
    data = json.loads(proc.stdout)
    gens = [g for mod in data["modules"] for g in mod["generators"]]
    assert {g["direction"]: g["receipt"] for g in gens} == dict.fromkeys(
        ("fwd", "fwd_splitkv", "batch_prefill", "bwd"), "600"
    )
    assert all(g["qola_receipt"] is None and g["filter"] is None for g in gens)
    # a script that knows no receipt at all is still refused for one it does not know
    bare = rt.write_tree(tmp_path / "bare", (), table_receipt=0)
    refused = run_qola("plan", "--manifest", str(m), "--aiter-root", str(bare))
    assert refused.returncode == 2 and "receipt 600 is unknown to the tree's generator" in refused.stderr


def test_a_ck_with_upstreams_receipt_700_gets_the_sink_kernels_qolas_0011_keeps(tmp_path: Path) -> None:
    """A CK whose own receipt 700 is upstream's (0003 alone: no sink kernels) is no longer left alone
    silently: its fwd generator runs without the receipt and qola's rule (sink kernels in) selects, so
    the kernels are those of a CK with 0003 and 0011; the plan says so. bwd is left to CK's rule."""
    upstream = rt.write_tree(tmp_path / "upstream", (600, 700), sink=True, upstream_700=True)
    with_0011 = rt.write_tree(tmp_path / "with0011", (600, 700), sink=True)
    got, err = plan(tmp_path, upstream, 700, "up")
    want, _ = plan(tmp_path, with_0011, 700, "w")
    assert fwd_files(got) == fwd_files(want) and sum("_sink_" in f for f in fwd_files(got)) == 8
    (note,) = [w for w in got["warnings"] if "by upstream's rule" in w]
    assert ": fwd: " in note and "QoLA's AITER patches 0003 and 0011" in note and "by upstream's rule" in err
    gens = {g["direction"]: g for m in got["modules"] for g in m["generators"]}
    assert gens["fwd"]["qola_receipt"] == "700" and "--receipt" not in gens["fwd"]["command"]
    assert gens["bwd"]["qola_receipt"] is None and gens["bwd"]["receipt"] == "700"
