"""A damaged OUT is refused with the way back (issue 51, 5): a manifest.json cut short and a planted
``.qola/next`` were refused cleanly, the first with a hint ("remove it") that named nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from qola.core.errors import QolaError
from qola.output import outdir


def test_a_truncated_manifest_is_refused_saying_how_to_recover(tmp_path: Path) -> None:
    out = tmp_path / "out"
    (out / "lib").mkdir(parents=True)
    (out / "manifest.json").write_text('{"builder": "qo')
    with pytest.raises(QolaError) as got:
        outdir.check_output(out)
    assert "is not a qola build record" in str(got.value)
    assert got.value.hint is not None and f"rm -r {out}" in got.value.hint and "build again" in got.value.hint


def test_a_planted_next_is_refused_saying_how_to_recover(tmp_path: Path) -> None:
    nxt = tmp_path / "out" / ".qola" / "next"
    nxt.mkdir(parents=True)
    with pytest.raises(QolaError) as got:
        outdir.complete(tmp_path / "out")
    assert got.value.hint == f"remove {nxt} and rebuild"
