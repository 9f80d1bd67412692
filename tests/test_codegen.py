"""Staged codegen: stamps skip unchanged runs, a new filter never keeps an old filter's instances,
a failing generator leaves the last good output in place."""

from __future__ import annotations

import sys

import pytest

from conftest import KERNELS
from qola.codegen import GenJob, run_generators
from qola.errors import FailedProcessError
from qola.plan import Generator

GEN = Generator(f"{KERNELS}/csrc/attn/generate.py -d fwd --receipt 0 --output_dir {{}}", "fwd", "0")


def names(res) -> set[str]:
    return {p.rsplit("/", 1)[1].removesuffix(".cu") for p in res.sources}


def test_stamp_skips_and_filters_never_leak(tmp_path):
    env = {"PATH": "/usr/bin:/bin"}
    a = run_generators(GenJob("m", (GEN,), (("--filter", "*_d64_fp16_batch_*"),)), tmp_path, env=env)
    assert not a.skipped and names(a) == {n for n in names(a) if "_d64_fp16_batch_" in n} | {"attn_fwd_api"}
    assert len(names(a)) == 5
    again = run_generators(GenJob("m", (GEN,), (("--filter", "*_d64_fp16_batch_*"),)), tmp_path, env=env)
    assert again.skipped and names(again) == names(a)
    b = run_generators(GenJob("m", (GEN,), (("--filter", "*_d128_bf16_group_*"),)), tmp_path, env=env)
    assert not b.skipped
    assert names(b) & names(a) == {"attn_fwd_api"}  # nothing of the earlier filter survives
    assert not [p for p in (tmp_path / "m").iterdir() if p.name.startswith(".staging")]


def test_failing_generator_keeps_the_last_good_output(tmp_path):
    env = {"PATH": "/usr/bin:/bin"}
    good = run_generators(GenJob("m", (GEN,), (("--filter", "*_d64_fp32_*"),)), tmp_path, env=env)
    bad = Generator(f"{KERNELS}/csrc/attn/generate.py -d nope --output_dir {{}}", "nope")
    with pytest.raises(FailedProcessError) as info:
        run_generators(GenJob("m", (bad,)), tmp_path, env=env, python=sys.executable)
    assert "exit code" in info.value.message and "generate.py" in info.value.message
    assert {p.rsplit("/", 1)[1] for p in good.sources} == {p.name for p in (tmp_path / "m" / "blob").iterdir()}


def test_a_file_named_in_the_command_decides_a_rerun(tmp_path):
    """A tuned-config CSV passed by path (not through {qola_configs}) is hashed into the stamp: editing it
    reruns the generator, an untouched one still skips."""
    script = tmp_path / "gen.py"
    script.write_text("import sys, pathlib\nsrc, out = sys.argv[1], sys.argv[2]\n"
                      "rows = pathlib.Path(src).read_text().split()\n"
                      "for r in rows:\n    (pathlib.Path(out) / f'k_{r}.cpp').write_text('int x;\\n')\n")
    csv = tmp_path / "tuned.csv"
    csv.write_text("a\nb\n")
    gen = Generator(f"{script} {csv} {{}}", "csv")
    env = {"PATH": "/usr/bin:/bin"}
    first = run_generators(GenJob("m", (gen,)), tmp_path / "gen", env=env)
    assert {p.rsplit("/", 1)[1] for p in first.sources} == {"k_a.cpp", "k_b.cpp"}
    assert run_generators(GenJob("m", (gen,)), tmp_path / "gen", env=env).skipped
    csv.write_text("a\nc\n")
    edited = run_generators(GenJob("m", (gen,)), tmp_path / "gen", env=env)
    assert not edited.skipped and {p.rsplit("/", 1)[1] for p in edited.sources} == {"k_a.cpp", "k_c.cpp"}
