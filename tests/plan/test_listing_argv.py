"""A generator's ``--filter`` past the OS's one-argument limit (issue 51 item 2): a narrowed backward
variant on two archs, or a ``[usage]`` set of thousands of kernels, made a filter of hundreds of KB,
and listing failed with "Argument list too long". Past a threshold the generator's argv goes by file
(:func:`qola.core.argfile.passed`), read back by qola's recorder: the generator sees the same argv."""

from __future__ import annotations

import json
from pathlib import Path

from support.argv_gen import ONE_ARG_MAX, argv_generator, huge_filter

from qola.core.argfile import THRESHOLD, fits, passed
from qola.plan.listing import list_blobs


def test_a_list_past_the_threshold_goes_by_file(tmp_path: Path) -> None:
    small = ["--filter", "a*"]
    assert fits(small) and passed(small, tmp_path / "a.json", "--from=") == small
    big = ["--filter", "x" * (THRESHOLD + 1)]
    got = passed(big, tmp_path / "b.json", "--from=")
    assert got == [f"--from={tmp_path / 'b.json'}"] and json.loads((tmp_path / "b.json").read_text()) == big
    many = [f"file_{i:06d}.o" for i in range(THRESHOLD // 8)]  # short ones, long together
    assert not fits(many)


def test_listing_under_a_filter_ten_times_the_one_argument_limit(tmp_path: Path) -> None:
    gen, env, seen = argv_generator(tmp_path)
    filt = huge_filter("k_b", ",")
    assert len(filt) >= 10 * ONE_ARG_MAX
    assert list_blobs(gen, env, filt) == ["k_b"]
    args = json.loads(seen.read_text())
    assert args[args.index("--filter") + 1] == filt


def test_listing_through_the_any_of_shim_ten_times_the_limit(tmp_path: Path) -> None:
    """A CK filter (``|`` any-of: qola's shim wraps the generator) of 10× the limit."""
    gen, env, seen = argv_generator(tmp_path)
    filt = huge_filter("k_c", "|")
    assert list_blobs(gen, env, filt) == ["k_c"]
    args = json.loads(seen.read_text())
    assert args[args.index("--filter") + 1] == filt
