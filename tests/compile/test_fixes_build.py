"""What qola's fixes (qola/plan/fixes.py) change in what a library *does*: the fixture tree of
tests/support/fixes_tree.py (AITER's shape at TE's pin where the fixes change it) built for sm_90
with the fixes (the default) and with ``[qola] fixes = "none"`` (upstream as it is), each library
called by a consumer like TE's (``QOLA_NS(mha_bwd)(args, stream)``) and what it did read from its
event log: a ``v3_api_check`` probe that runs the CK backward and overwrites dq, or loads code
objects before answering; the deterministic varlen workspace not zeroed; ``$AITER_ASM_DIR``'s code
object loaded over the embedded one; gfx1250's top-left causal backward returning -1. Each holds
with the fixes and fails without them. The tree is never written; the compiles read the staged copy."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
from support import fixes_tree as ft
from support import itfs_fixture as fx
from support.common import run_qola

pytestmark = pytest.mark.slow


@dataclass(frozen=True)
class Built:
    tmp: Path
    tree: Path
    tree_digests: dict[str, str]
    asm: Path

    def call(self, out: str, what: str, asm_dir: bool = False) -> tuple[str, list[str]]:
        log = self.tmp / f"{out}-{what}-{asm_dir}.log"
        env = {**os.environ, "FIXTURE_LOG": str(log)}
        env.pop("AITER_ASM_DIR", None)
        if asm_dir:
            env["AITER_ASM_DIR"] = str(self.asm)
        proc = subprocess.run([str(self.tmp / f"use_{out}"), what], env=env, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.strip(), log.read_text().splitlines() if log.exists() else []


def _digests(tree: Path) -> dict[str, str]:
    return {
        str(p.relative_to(tree)): hashlib.sha256(p.read_bytes()).hexdigest() for p in tree.rglob("*") if p.is_file()
    }


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    tmp = tmp_path_factory.mktemp("fixes")
    tree = ft.write_tree(tmp / "aiter")
    digests = _digests(tree)
    (tmp / "use.cc").write_text(ft.DRIVER)
    for out, line in (("fixed", None), ("upstream", '"none"')):
        m = ft.manifest(tmp / f"{out}.toml", line)
        proc = run_qola("build", "--manifest", str(m), "--aiter-root", str(tree), "-o", str(tmp / out), "-j", "2")
        assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
        cmd = fx.consumer_argv(tree, tmp / out, tmp / "use.cc", tmp / f"use_{out}", "sm_90")
        link = subprocess.run(cmd, capture_output=True, text=True)
        assert link.returncode == 0, link.stderr
    return Built(tmp, tree, digests, ft.other_asm_dir(tmp / "asm"))


def test_a_probe_never_runs_the_ck_backward(built: Built) -> None:
    assert built.call("fixed", "probe-no") == ("ret=-1 dq=0", [])
    said, events = built.call("upstream", "probe-no")
    assert said == "ret=2 dq=7" and "ck-run" in events  # upstream: the probe wrote dq


def test_a_probe_answers_before_loading_a_code_object(built: Built) -> None:
    assert built.call("fixed", "probe-yes") == ("ret=1 dq=0", [])
    said, events = built.call("upstream", "probe-yes")
    assert said == "ret=1 dq=0" and events == ["load dqdkdv_m0 EMBEDDED-BLOB-01"]


def test_the_deterministic_varlen_workspace_is_zeroed(built: Built) -> None:
    assert built.call("fixed", "det-group")[1] == ["alloc 128 zero=1", "ck-run"]
    assert built.call("upstream", "det-group")[1] == ["alloc 128 zero=0", "ck-run"]


def test_the_embedded_code_object_wins_over_aiter_asm_dir(built: Built) -> None:
    for asm_dir in (False, True):
        assert built.call("fixed", "run", asm_dir)[1] == ["load dqdkdv_m0 EMBEDDED-BLOB-01", "launch dqdkdv_m0"]
    assert built.call("upstream", "run", True)[1][0] == "load dqdkdv_m0 ELSEWHERE-BLOB01"  # another AITER's


def test_gfx1250_top_left_causal_runs_the_bottom_right_kernel(built: Built) -> None:
    said, events = built.call("fixed", "gfx1250-causal")
    assert said == "ret=0.5 dq=0" and events[-1] == "launch dqdkdv_m2"
    assert built.call("upstream", "gfx1250-causal")[0] == "ret=2 dq=7"  # no v3 kernel: the CK fallback


def test_the_tree_stays_as_it_was_and_the_compile_reads_the_staged_copy(built: Built) -> None:
    assert _digests(built.tree) == built.tree_digests
    staged = built.tmp / "fixed.build" / "fixed" / "csrc" / "cpp_itfs" / "mha_bwd.cu"
    assert "qola fix bwd-probe-no-fallback" in staged.read_text()
    graph = (built.tmp / "fixed.build" / "build.ninja").read_text()
    assert str(staged) in graph and str(built.tree / "csrc" / "cpp_itfs" / "mha_bwd.cu") not in graph
    assert f"-I{built.tmp / 'fixed.build' / 'fixed' / 'csrc' / 'include'}" in graph
    assert not (built.tmp / "upstream.build" / "fixed").exists()


def test_the_output_records_its_builder_and_fixes(built: Built) -> None:
    fixed = json.loads((built.tmp / "fixed" / "manifest.json").read_text())
    upstream = json.loads((built.tmp / "upstream" / "manifest.json").read_text())
    assert fixed["builder"] == upstream["builder"] == "qola"
    assert [(f["name"], f["status"]) for f in fixed["fixes"]] == [(n, "applied") for n in ft.fixes_names()]
    assert upstream["fixes"] == [] and fixed["build_key"] != upstream["build_key"]
    audit = run_qola("audit", str(built.tmp / "fixed"))
    assert audit.returncode == 0, audit.stdout + audit.stderr
    again = run_qola("audit", "--reproduce", str(built.tmp / "fixed"))  # elsewhere: the staged copies too
    assert again.returncode == 0 and "1 library byte-identical" in again.stdout + again.stderr, again.stderr


def test_audit_names_an_output_another_builder_wrote(built: Built, tmp_path: Path) -> None:
    """TE's cache key names no builder: an output QoLA wrote (its manifest.json is QoLA's record)
    in the place of qola's is named by the audit, not passed."""
    import shutil

    other = tmp_path / "qola-built-then-replaced"
    shutil.copytree(built.tmp / "fixed", other, symlinks=True)
    ours = json.loads((other / "manifest.json").read_text())
    qolas = {  # QoLA's record (qola/build_tools/builder.py at bbcf79e): what its build writes there
        "generated_at": ours["generated_at"],
        "aiter_root": ours["aiter_root"],
        "manifest_src": ours["manifest_src"],
        "gpu_archs": ours["gpu_archs"],
        "modules": [
            {
                "md_name": "te_libmha_bwd",
                "success": True,
                "error": None,
                "so_path": "lib/te_libmha_bwd.so",
                "duration_s": 1,
            }
        ],
        "summary": {"total": 1, "success": 1, "failed": 0},
    }
    (other / "manifest.json").write_text(json.dumps(qolas))
    audit = run_qola("audit", str(other))
    assert audit.returncode == 2 and "built by QoLA, not by qola" in audit.stderr, audit.stdout + audit.stderr


def test_a_rebuild_follows_the_trees_file_and_keeps_the_fix(tmp_path: Path) -> None:
    """The staged copy is made again from the tree on every build: an edit of the tree's file reaches
    the compile (and the fix stays made); an unchanged one keeps the copy's mtime (nothing recompiles)."""
    tree = ft.write_tree(tmp_path / "aiter")
    m = ft.manifest(tmp_path / "m.toml")
    staged = tmp_path / "out.build" / "fixed" / "csrc" / "cpp_itfs" / "mha_bwd.cu"

    def build() -> None:
        proc = run_qola("build", "--manifest", str(m), "--aiter-root", str(tree), "-o", str(tmp_path / "out"))
        assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]

    build()
    first = staged.stat().st_mtime_ns
    build()
    assert staged.stat().st_mtime_ns == first
    src = tree / "csrc" / "cpp_itfs" / "mha_bwd.cu"
    src.write_text(src.read_text() + "// edited after the first build\n")
    build()
    text = staged.read_text()
    assert "// edited after the first build" in text and "qola fix bwd-probe-no-fallback" in text
