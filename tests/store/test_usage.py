"""qola usage: records read back (torn lines skipped), merged into a fragment checked against the
module's variant universe, and the fragment built ahead exactly (`qola plan --usage`, `[usage]`):
on the example tree, and on the real AITER tree with Transformer Engine's manifest."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from support.attn_abi import attn_manifest
from support.common import KERNELS, run_qola
from support.te_example import te_manifest

from qola.jit import format as fmt
from qola.plan import variants as V
from qola.plan.model import Generator
from qola.store.usage import fragment, records
from qola.store.usage.records import Record

MANIFEST = attn_manifest("qg")
USED = ["attn_fwd_d128_bf16_batch_b64x32_mask_lse", "attn_fwd_d128_bf16_batch_b64x32_nmask_lse"]
KEY = "ab" * 32


def rec(unit: str, module: str = "libattn_fwd", event: str = "compile", pid: int = 7) -> Record:
    return Record(event, module, f"qg_{module}", unit, "sm_90", KEY, "host-a", pid, 1700000000)


def write_records(path: Path, recs: list[Record], tail: str = "") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(records.render(r) for r in recs) + tail)
    return path


def plan_files(proc: subprocess.CompletedProcess[str]) -> dict[str, set[str]]:
    """module -> the instances its generators write under the plan's filters (CK: the plan's own
    listing; the example's generator: its --list_blobs under the filter)."""
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out: dict[str, set[str]] = {}
    for m in json.loads(proc.stdout)["modules"]:
        for g in m["generators"]:
            files = g.get("files")
            if files is None and g["command"].split()[0].endswith("attn/generate.py"):
                files = V.list_blobs(Generator(g["command"], g["direction"]), dict(os.environ), g["filter"])
            if files and not g["dispatch_only"]:
                out.setdefault(m["name"], set()).update(n for n in files if not n.endswith("_api"))
    return out


def test_a_record_round_trips_and_damage_is_detected() -> None:
    line = records.render(rec(USED[0]))
    assert records.parse_line(line) == rec(USED[0])
    assert len(line.encode()) <= fmt.USAGE_MAX_LINE and line.count("\t") == len(fmt.USAGE_FIELDS)
    assert "checksum" in problem(line.replace("mask_lse", "mask_nlse"))  # bit flip
    assert "checksum" in problem(line[:40])  # torn
    bad = records.render(rec("x*"))  # a glob never passes as a name
    assert "not a plain file name" in problem(bad)


def test_merge_skips_torn_lines_and_writes_the_fragment(tmp_path: Path) -> None:
    (tmp_path / "m.toml").write_text(MANIFEST)
    d = tmp_path / "rec"
    write_records(d / f"{fmt.USAGE_PREFIX}a-1-x{fmt.USAGE_SUFFIX}", [rec(USED[0]), rec(USED[1])])
    write_records(
        d / f"{fmt.USAGE_PREFIX}b-2-y{fmt.USAGE_SUFFIX}",
        [rec(USED[0], event="cache", pid=2)],
        tail=records.render(rec(USED[1]))[:50],
    )  # a process killed mid-write
    (d / "unrelated.txt").write_text("not read\n")
    frag = tmp_path / "usage.toml"
    proc = run_qola("usage", "merge", str(d), "-m", str(tmp_path / "m.toml"), "-a", str(KERNELS), "-o", str(frag))
    assert proc.returncode == 0, proc.stderr
    assert "skipped 1 record line" in proc.stderr and "2 variant(s) of 1 module(s)" in proc.stderr
    got = fragment.load(frag)
    assert sorted((v.module, v.name) for v in got.variants) == [("libattn_fwd", n) for n in USED]
    assert all(fragment.line("libattn_fwd", n) in frag.read_text() for n in USED)


@pytest.mark.cli
@pytest.mark.parametrize("name, message", [
    ("attn_fwd_d128_bf16_batch_b64x32_nmask_lse.so.0PNcSK", "is not a variant of module libattn_fwd"),
    ("attn_fwd_d128_bf16_batch_b64x32_nmask_lsx", "nearest: attn_fwd_d128_bf16_batch_b64x32_nmask_lse"),
    ("attn_fwd_d128_fp16_batch_b64x32_nmask_lse", "excluded by the manifest's variant tables"),
])  # fmt: skip
def test_merge_refuses_names_outside_the_universe(tmp_path: Path, name: str, message: str) -> None:
    (tmp_path / "m.toml").write_text(MANIFEST)
    r = write_records(tmp_path / "r.rec", [rec(USED[0]), rec(name)])
    proc = run_qola("usage", "merge", str(r), "-m", str(tmp_path / "m.toml"), "-a", str(KERNELS))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert message in proc.stderr and f"recorded at {r}:2" in proc.stderr and "Traceback" not in proc.stderr


def test_merge_of_records_naming_an_unknown_module_is_refused(tmp_path: Path) -> None:
    (tmp_path / "m.toml").write_text(MANIFEST)
    r = write_records(tmp_path / "r.rec", [rec(USED[0], module="libnope")])
    proc = run_qola("usage", "merge", str(r), "-m", str(tmp_path / "m.toml"), "-a", str(KERNELS))
    assert proc.returncode == 2 and "module 'libnope' is not built by this manifest" in proc.stderr


@pytest.mark.cli
def test_merge_without_records_says_how_to_record(tmp_path: Path) -> None:
    (tmp_path / "m.toml").write_text(MANIFEST)
    (tmp_path / "rec").mkdir()
    proc = run_qola("usage", "merge", str(tmp_path / "rec"), "-m", str(tmp_path / "m.toml"), "-a", str(KERNELS))
    assert proc.returncode == 2 and "QOLA_USAGE_DIR" in proc.stderr


@pytest.mark.cli
@pytest.mark.parametrize("how", ["flag", "manifest-files", "manifest-variants"])
def test_plan_with_the_fragment_generates_exactly_the_used_variants(tmp_path: Path, how: str) -> None:
    frag = tmp_path / "usage.toml"
    frag.write_text(fragment.render([("libattn_fwd", n) for n in USED], None))
    text, args = MANIFEST, []
    if how == "flag":
        args = ["--usage", str(frag)]
    elif how == "manifest-files":
        text += '[usage]\nfiles = ["usage.toml"]\n'
    else:
        text += "[usage]\nvariants = [\n" + "".join(f"  {fragment.line('libattn_fwd', n)}\n" for n in USED) + "]\n"
    (tmp_path / "m.toml").write_text(text)
    proc = run_qola("plan", "--json", "-m", str(tmp_path / "m.toml"), "-a", str(KERNELS), *args)
    assert plan_files(proc) == {"libattn_fwd": set(USED)}


def test_with_jit_the_used_variants_are_built_ahead_and_the_rest_deferred(tmp_path: Path) -> None:
    (tmp_path / "m.toml").write_text(
        MANIFEST
        + "[jit]\n[usage]\nvariants = [\n"
        + "".join(f"  {fragment.line('libattn_fwd', n)}\n" for n in USED)
        + "]\n"
    )
    proc = run_qola("plan", "--json", "-m", str(tmp_path / "m.toml"), "-a", str(KERNELS))
    assert proc.returncode == 0, proc.stderr
    mod = json.loads(proc.stdout)["modules"][0]
    assert mod["jit"]["ahead"] == sorted(USED)
    assert len(plan_files(proc)["libattn_fwd"]) == 16  # every bf16 instance is still generated (8 + 8 deferred)


@pytest.mark.cli
def test_a_fragment_with_other_keys_is_refused(tmp_path: Path) -> None:
    (tmp_path / "m.toml").write_text(MANIFEST)
    frag = tmp_path / "usage.toml"
    frag.write_text('[usage]\nfiles = ["x.toml"]\n')
    proc = run_qola("plan", "-m", str(tmp_path / "m.toml"), "-a", str(KERNELS), "--usage", str(frag))
    assert proc.returncode == 2 and "a usage fragment holds [usage] with commit and variants only" in proc.stderr


def test_cover_reports_ahead_jit_and_absent(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "manifest.json").write_text(
        json.dumps(
            {
                "build_key": KEY,
                "modules": [
                    {
                        "name": "libattn_fwd",
                        "md_name": "qg_libattn_fwd",
                        "success": True,
                        "jit": {"aot": {"names": [USED[0]]}, "deferred": {"names": [USED[1]]}},
                    }
                ],
            }
        )
    )
    r = write_records(tmp_path / "r.rec", [rec(USED[0]), rec(USED[1]), rec("attn_fwd_d64_bf16_batch_b64x64_mask_lse")])
    proc = run_qola("usage", "cover", str(r), "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "3 variant(s) recorded: 1 built ahead, 1 deferred to the JIT, 1 absent" in proc.stdout
    assert run_qola("usage", "cover", str(r), "--out", str(out), "--strict").returncode == 1


# ------------------------------------------------------------------ the real AITER tree, TE's manifest
@pytest.mark.aiter
def test_te_recorded_usage_plans_exactly_the_recorded_kernels(aiter_root: Path, tmp_path: Path) -> None:
    # TE's whole receipt-700 set: deterministic maxq16 kernels included, whose convert_dq CK matches
    # but never lists (16 gfx950 kernels were lost; qola.plan.ckfilter)
    m = te_manifest(tmp_path / "te.toml")
    base = ["-m", str(m), "-a", str(aiter_root), "--allow-unpinned"]
    full = plan_files(run_qola("plan", "--json", *base))
    # a model's set: bf16, head size 128, batch mode (every mask, dropout and padding kernel of those)
    used = {mod: sorted(n for n in names if "_d128_bf16_" in n and "_batch_" in n) for mod, names in full.items()}
    assert set(used) == {"libmha_fwd", "libmha_bwd"} and all(used.values())
    assert sum(map(len, used.values())) < sum(map(len, full.values())) // 10
    d = tmp_path / "rec"
    recs = [
        Record("compile", mod, f"te_{mod}", n, "gfx950", KEY, "h", i, 1)
        for i, (mod, names) in enumerate(used.items())
        for n in names
    ]
    write_records(d / f"{fmt.USAGE_PREFIX}h-1-a{fmt.USAGE_SUFFIX}", recs[::2])
    write_records(d / f"{fmt.USAGE_PREFIX}h-2-b{fmt.USAGE_SUFFIX}", recs[1::2] + recs[:3], tail="qola-usage 1\tcomp")
    frag = tmp_path / "usage.toml"
    proc = run_qola("usage", "merge", str(d), *base, "-o", str(frag))
    assert proc.returncode == 0, proc.stderr
    assert plan_files(run_qola("plan", "--json", *base, "--usage", str(frag))) == {k: set(v) for k, v in used.items()}


def test_a_ck_name_brings_its_twin_for_the_other_arch(monkeypatch: pytest.MonkeyPatch) -> None:
    from qola.plan import variants as vmod
    from qola.plan.model import Generator, ModulePlan, Plan
    from qola.store.usage import apply

    k = "fmha_fwd_d128_bf16_batch_b128x128_nmask_lse"
    every = [f"{k}_gfx9", f"{k}_gfx950", "fmha_fwd_d64_bf16_batch_b64x64_nmask_lse_gfx9"]
    mod = ModulePlan(
        "libmha_fwd",
        "te_libmha_fwd",
        "cpp_itfs",
        "shared",
        (),
        (),
        (),
        (),
        (Generator("g.py", "fwd"),),
        True,
        False,
        False,
        None,
    )
    plan = Plan("te", "hip", ("gfx942", "gfx950"), "/t", "/t", None, "m.toml", "0", (mod,))
    monkeypatch.setattr(apply, "universe", lambda m, env: {0: (every, every)})
    monkeypatch.setattr(vmod, "flavor_of", lambda g: "ck")
    assert apply.check(plan, {"libmha_fwd": [f"{k}_gfx950"]}, {}) == {"libmha_fwd": {0: every[:2]}}


def test_the_build_record_keeps_the_usage_fragments_for_a_reproduction(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from qola.pipeline.begin import command_record
    from qola.pipeline.record import settings_record
    from qola.pipeline.spec import BuildSpec

    monkeypatch.chdir(tmp_path)
    spec = BuildSpec.make(manifest="m.toml", usage_files=("usage.toml",))
    assert settings_record(command_record(spec), {}, []).to_json()["usage_files"] == [str(tmp_path / "usage.toml")]


def problem(line: str) -> str:
    """What ``records.parse_line`` says of a line it refuses."""
    got = records.parse_line(line)
    assert isinstance(got, str), got
    return got
