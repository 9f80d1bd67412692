"""tests/support/once.py: a shared session dir is made by one process, and a failed make is redone."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest
from support.once import MARK, made_in


def _make_counting(root: Path) -> None:
    with open(root.parent / "calls", "a") as f:
        f.write("made\n")
    (root / "data").write_text("x")


def _worker(base: str, go: multiprocessing.synchronize.Event, out: multiprocessing.queues.Queue[str]) -> None:
    go.wait()
    out.put(str(made_in(Path(base), "shared", _make_counting)))


def test_processes_asking_at_once_make_it_once(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("fork")
    go, out = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(str(tmp_path), go, out)) for _ in range(4)]
    for p in procs:
        p.start()
    go.set()  # all four ask together
    roots = {out.get(timeout=120) for _ in procs}
    for p in procs:
        p.join(timeout=120)
        assert p.exitcode == 0
    assert roots == {str(tmp_path / "shared")}
    assert (tmp_path / "calls").read_text() == "made\n"
    assert (tmp_path / "shared" / "data").read_text() == "x"


def test_a_failed_make_is_never_taken_as_made(tmp_path: Path) -> None:
    def broken(root: Path) -> None:
        (root / "half").write_text("")
        raise RuntimeError("generator failed")

    with pytest.raises(RuntimeError, match="generator failed"):
        made_in(tmp_path, "shared", broken)
    assert not (tmp_path / "shared" / MARK).exists()
    root = made_in(tmp_path, "shared", _make_counting)
    assert sorted(p.name for p in root.iterdir()) == sorted([MARK, "data"])  # the half-made file gone
    assert made_in(tmp_path, "shared", broken) == root  # made now: not made again
