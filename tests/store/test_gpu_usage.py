"""On a GPU: the recorded-usage round trip on the example tree (issue 25). libattn_fwd (cpp_itfs, bf16,
[jit] with nothing ahead) runs a causal and a non-causal call while recording (QOLA_USAGE_DIR); the
records merge into a fragment; the library rebuilt with it (`--usage`) runs both calls again under
QOLA_JIT_COVERAGE=strict with an empty JIT cache: no compile, results match torch. Rebuilt with the
causal variant removed from the set, the causal call fails with the message that names it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, cast

import pytest
from support.attn_abi import attn_manifest, child_call, child_preamble
from support.common import KERNELS, run_qola
from support.jit_lib import NVCC, counting_nvcc

from qola.store.usage import fragment, records

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

MANIFEST = attn_manifest("qu", "[jit]\n")

CHILD = (
    child_call("qu")
    + r"""
import json
print(json.dumps({"r": r, "err": (o.float() - ref).abs().max().item(),
                  "error": lib.qu_qola_jit_last_error().decode(), "status": lib.qu_qola_jit_last_status()}))
"""
)


def _build(tmp_path: Path, name: str, *extra: str) -> Path:
    out = tmp_path / name
    proc = run_qola(
        "build", "--manifest", str(tmp_path / "q.toml"), "--aiter-root", str(KERNELS), "-o", str(out), *extra
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out


@pytest.mark.skipif(NVCC is None, reason="needs nvcc")
def test_recorded_usage_round_trip_on_gpu(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    (tmp_path / "q.toml").write_text(MANIFEST)
    (tmp_path / "child.py").write_text(child_preamble() + CHILD)
    cc, count = counting_nvcc(tmp_path)

    def compiles() -> int:
        return len(count.read_text().split()) if count.exists() else 0

    def call(out: Path, causal: int, cache: str, **env: str) -> dict[str, Any]:
        jit = {"QOLA_JIT_CACHE_DIR": str(tmp_path / cache), "QOLA_JIT_COMPILER": str(cc)}
        return child_json(tmp_path, out, causal, {**jit, **env})

    # 1. everything deferred; a real run records what it resolves
    first = _build(tmp_path, "out1")
    key = json.loads((first / "manifest.json").read_text())["build_key"]
    rec = tmp_path / "rec"
    for causal in (0, 1):
        got = call(first, causal, "cache1", QOLA_USAGE_DIR=str(rec))
        assert got["r"] == 0 and got["err"] < 5e-2, got
    assert compiles() == 2
    read = records.read(records.record_files([rec]))
    assert read.bad_lines == 0 and len(read.records) == 2
    units = sorted({r.unit for r in read.records})
    assert len(units) == 2 and all("_d128_bf16_batch_" in u for u in units), units
    assert {r.event for r in read.records} == {"compile"} and {r.build_key for r in read.records} == {key}
    assert {r.module for r in read.records} == {"libattn_fwd"}
    causal_unit = next(u for u in units if "_mask_" in u)

    # 2. merge, 3. build exactly that set ahead (the rest stays deferred)
    frag = tmp_path / "usage.toml"
    proc = merge_usage(tmp_path, rec, frag)
    assert proc.returncode == 0, proc.stderr
    assert sorted(v.name for v in fragment.load(frag).variants) == units
    second = _build(tmp_path, "out2", "--usage", str(frag))
    jit = json.loads((second / "manifest.json").read_text())["modules"][0]["jit"]
    assert jit["aot"]["names"] == units and not set(units) & set(jit["deferred"]["names"])
    assert run_qola("usage", "cover", str(rec), "--out", str(second), "--strict").returncode == 0

    # 4. run again: fail-closed mode, an empty cache, no JIT compile
    before = compiles()
    for causal in (0, 1):
        got = call(second, causal, "cache2", QOLA_JIT_COVERAGE="strict")
        assert got["r"] == 0 and got["err"] < 5e-2 and got["status"] == 0, got
    assert compiles() == before

    # 5. the causal variant removed from the set: the causal call fails naming it
    frag.write_text(fragment.render([("libattn_fwd", u) for u in units if u != causal_unit], None))
    third = _build(tmp_path, "out3", "--usage", str(frag))
    got = call(third, 0, "cache3", QOLA_JIT_COVERAGE="strict")
    assert got["r"] == 0 and got["status"] == 0, got
    got = call(third, 1, "cache3", QOLA_JIT_COVERAGE="strict")
    assert got["r"] != 0 and got["status"] == 9, got  # QOLA_JIT_E_COVERAGE
    assert f"variant {causal_unit} of module qu_libattn_fwd was not built ahead" in got["error"]
    assert fragment.line("libattn_fwd", causal_unit) in got["error"]
    assert compiles() == before


@pytest.mark.skipif(NVCC is None, reason="needs nvcc")
def test_ahead_variants_record_their_first_call_on_gpu(tmp_path: Path) -> None:
    """Without [jit] and with --record-ahead (docs/usage.md, "Recording variants built ahead"): every
    variant is built ahead as a recorded copy; a real call computes what torch does and records its
    variant once (event ``ahead``), nothing else; the record merges into a fragment that builds."""
    pytest.importorskip("torch")
    (tmp_path / "q.toml").write_text(attn_manifest("qu"))
    (tmp_path / "child.py").write_text(child_preamble() + CHILD)
    out = _build(tmp_path, "out", "--record-ahead")
    data = json.loads((out / "manifest.json").read_text())
    assert "jit" not in data["modules"][0] and not (out / "jit" / "qu_libattn_fwd").exists()

    def call(lib: Path, causal: int, **env: str) -> dict[str, Any]:
        return child_json(
            tmp_path, lib, causal, {"QOLA_JIT_CACHE_DIR": str(tmp_path / "cache"), "QOLA_JIT": "0", **env}
        )

    rec = tmp_path / "rec"
    got = call(out, 0, QOLA_USAGE_DIR=str(rec), QOLA_JIT_COVERAGE="strict")
    assert got["r"] == 0 and got["err"] < 5e-2 and got["status"] == 0, got
    first = records.read(records.record_files([rec]))
    assert first.bad_lines == 0 and len(first.records) == 1
    (r,) = first.records
    assert (r.event, r.module, r.md_name, r.build_key) == ("ahead", "libattn_fwd", "qu_libattn_fwd", data["build_key"])
    assert "_d128_bf16_batch_" in r.unit and "_nmask_" in r.unit
    got = call(out, 1, QOLA_USAGE_DIR=str(rec))
    assert got["r"] == 0 and got["err"] < 5e-2, got
    both = records.read(records.record_files([rec])).records
    assert len(both) == 2 and {x.event for x in both} == {"ahead"}
    units = sorted({x.unit for x in both})
    assert len(units) == 2 and any("_mask_" in u for u in units)
    assert not (tmp_path / "cache").exists()  # nothing compiled, no JIT cache made
    assert run_qola("usage", "cover", str(rec), "--out", str(out), "--strict").returncode == 0

    frag = tmp_path / "usage.toml"
    proc = merge_usage(tmp_path, rec, frag)
    assert proc.returncode == 0, proc.stderr
    assert sorted(v.name for v in fragment.load(frag).variants) == units
    used = _build(tmp_path, "out2", "--usage", str(frag), "--record-ahead")
    inst = json.loads((used / "manifest.json").read_text())["modules"][0]["instances"]["names"]
    assert sorted(n for n in inst if not n.endswith("_api")) == units  # exactly the recorded set
    for causal in (0, 1):
        got = call(used, causal, QOLA_JIT_COVERAGE="strict")
        assert got["r"] == 0 and got["err"] < 5e-2 and got["status"] == 0, got


def child_json(tmp_path: Path, out: Path, causal: int, env: dict[str, str]) -> dict[str, Any]:
    """What child.py prints last (JSON) for one call through OUT's qu_libattn_fwd.so, under this
    environment plus ``env``."""
    p = subprocess.run(
        [sys.executable, str(tmp_path / "child.py"), str(out / "lib/qu_libattn_fwd.so"), str(causal)],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=600,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    return cast("dict[str, Any]", json.loads(p.stdout.strip().splitlines()[-1]))


def merge_usage(tmp_path: Path, rec: Path, frag: Path) -> subprocess.CompletedProcess[str]:
    """``qola usage merge REC`` for tmp/q.toml into the fragment ``frag``."""
    return run_qola(
        "usage",
        "merge",
        str(rec),
        "--manifest",
        str(tmp_path / "q.toml"),
        "--aiter-root",
        str(KERNELS),
        "-o",
        str(frag),
    )
