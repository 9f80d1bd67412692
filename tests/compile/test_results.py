"""A build's results are values (issue 36 item 2): a stage returns new results and leaves the ones
it was given as they were; a hook's extra edge is a typed ninja edge, written by ninja_syntax."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from qola.compile import ninja
from qola.compile.results import ModuleResult, Ran, Status, settle
from qola.core.errors import FailedProcessError


def _result(name: str, **kw: object) -> ModuleResult:
    return ModuleResult(name, f"qk_{name}", "cpp_itfs", "shared", **kw)  # type: ignore[arg-type]


def test_settle_returns_new_results_and_leaves_the_given_ones(tmp_path: Path) -> None:
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "qk_a.so").write_bytes(b"\x7fELF")
    given = {"a": _result("a", log=("generated",), codegen_seconds=0.5), "b": _result("b"), "c": _result("c")}
    outcome = ninja.NinjaRun(
        1, ["obj/b/x.o"], {"a": ["a warning"], "b": ["FAILED: obj/b/x.o", "x.cu: error: boom"]}, []
    )
    ran = Ran(
        outcome,
        {"a": "lib/qk_a.so", "b": "lib/qk_b.so"},  # c: not in the graph (it failed before)
        {"a": 1.5},
        tmp_path,
        owner=lambda out: out.split("/")[1] if out.startswith("obj/") else None,
    )
    out = settle(given, ran)
    assert out["a"].status is Status.BUILT and out["a"].log == ("generated", "a warning") and out["a"].seconds == 2.0
    assert out["b"].status is Status.FAILED and "boom" in (out["b"].error or "")
    assert (out["b"].detail or "").startswith("error: FAILED: obj/b/x.o")
    assert out["c"] is given["c"]
    # what it was given is as it was: no stage changes another's result
    assert given["a"].status is Status.PENDING and given["a"].log == ("generated",) and given["a"].seconds == 0.0
    assert given["b"].status is Status.PENDING and given["b"].error is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        given["a"].status = Status.BUILT  # type: ignore[misc]


def test_a_failed_result_is_a_new_one_with_the_output_in_its_log() -> None:
    r = _result("m", log=("generated",))
    exc = FailedProcessError(["gen.py", "--x"], 3, "line one\nline two\n")
    failed = r.failed(exc)
    assert failed.status is Status.FAILED and failed.error == exc.message and failed.detail == exc.render()
    assert failed.log[:4] == ("generated", "$ gen.py --x", "line one\nline two", "(exit code 3)")
    assert r.status is Status.PENDING and r.log == ("generated",)
    noted = r.noted(["careful"], ["printed"])
    assert noted.warnings == ("careful",) and noted.log == ("generated", "warning: careful", "printed")


def test_an_extra_edge_is_typed_and_written_by_ninja_syntax(tmp_path: Path) -> None:
    edge = ninja.Edge("asm", "obj/m/embed.o", ("/e b/m.S",), (("module", "m"),))
    graph = ninja.Graph(rules={"asm": {"command": "cc -c $in -o $out"}}, variables={}, targets=(), extra_edges=(edge,))
    ninja.write(graph, tmp_path / "build.ninja")
    text = (tmp_path / "build.ninja").read_text()
    assert "build obj/m/embed.o: asm /e$ b/m.S\n  module = m\n" in text  # ninja_syntax escapes the space
    assert graph.owners() == {"obj/m/embed.o": "m"}
    assert edge.module == "m" and ninja.Edge("x", "o", ()).module is None
