"""ck-jit's parse rule (tests/support/ckjit_rule.py) applied to every compile and link command of a
real graph: Transformer Engine's manifest shape (libmha_fwd + libmha_bwd, receipt 700, gfx942 and
gfx950, narrowed by variants) on the amd-aiter sdist, as ``qola build --dry-run`` writes it.

ck-jit stubs a kernel only when it reads the compile line's source as qola meant it; it takes over
the ``libmha_*`` link only when it finds the library after ``-o``, the objects in the ``@file`` and
the version script. A line it misreads is compiled for real without a word (issue 31: ``-MT obj``
made every object "the source", nothing was stubbed), so the rule is checked here, line by line."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from pathlib import Path

import pytest
from support.ckjit_rule import API_RE, arch_flags, classify, ld_flags
from support.common import compile_commands, run_qola
from support.rocm_aiter import manifest

pytestmark = [pytest.mark.aiter, pytest.mark.hip]

LIBS = {"libmha_fwd": "lib/te_libmha_fwd.so", "libmha_bwd": "lib/te_libmha_bwd.so"}


@pytest.fixture(scope="module")
def graph(aiter_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("ckjit_contract")
    # TE's example's arch order (examples/te-manifest.toml): the run's other plans of the sdist's CK
    # backward generator list under the same command, so this plan takes their listings
    m = manifest(tmp / "qola_manifest.toml", "te", ("gfx950", "gfx942"), fwd=True, bwd=True)
    out = tmp / "out"
    proc = run_qola("build", "-m", str(m), "-a", str(aiter_root), "-o", str(out), "--dry-run", "-j", "2")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return Path(str(out) + ".build")


def _ninja(build: Path, *args: str) -> str:
    return subprocess.run(["ninja", "-C", str(build), *args], capture_output=True, text=True, check=True).stdout


def test_every_compile_line_reads_as_qola_meant_it(graph: Path) -> None:
    units = compile_commands(graph)  # a host-only edge's two lines: ck-jit sees the second when the first fails
    assert len(units) >= 16
    kinds: dict[str, list[str]] = {}
    for u in units:
        argv = shlex.split(u["command"])
        call = classify(argv, u["directory"])
        src = os.path.normpath(os.path.join(u["directory"], u["file"]))
        assert call.source == src, f"ck-jit reads {call.source!r} as the source of\n{u['command']}"
        assert call.output == u["output"], u["command"]
        assert arch_flags(argv), u["command"]  # ck-jit records each blob's archs from its line
        kinds.setdefault(call.kind, []).append(os.path.basename(src))
    # every CK instance qola generated is a blob ck-jit stubs; every CK dispatch file one it rewrites
    instances = [n for n in kinds.get("blob", []) if n.startswith("fmha_") and not API_RE.match(n)]
    assert len(instances) >= 12, kinds
    assert {"fmha_fwd_api.cpp", "fmha_bwd_api.cpp"} <= set(kinds.get("api", [])), kinds
    assert all("/blob/" not in n for n in kinds.get("compile", [])), kinds  # the wrapper compiles for real
    assert any(n.startswith("qola_libmha_fwd_itfs") for n in kinds.get("compile", [])), kinds


def test_the_libmha_links_are_taken_over_as_ck_jit_reads_them(graph: Path) -> None:
    links = {u["output"]: u for u in json.loads(_ninja(graph, "-t", "compdb", "link"))}
    assert set(LIBS.values()) <= set(links), sorted(links)
    for module, lib in LIBS.items():
        argv = shlex.split(links[lib]["command"])
        assert classify(argv, graph).kind == "post_build", links[lib]["command"]
        # the objects reach ck-jit through the @file (ninja writes $in_newline into it): each one
        # a token ending in .o, every compile of the module among them
        rsp = [a for a in argv if a.startswith("@")]
        assert rsp == [f"@{lib}.rsp"], argv
        query = _ninja(graph, "-t", "query", lib)
        inputs = [ln.strip() for ln in query.split("input: link", 1)[1].split("outputs:", 1)[0].splitlines()]
        objs = [i for i in inputs if i and not i.startswith("|")]
        assert objs and all(o.endswith(".o") and " " not in o for o in objs), objs
        assert len([o for o in objs if o.startswith(f"obj/{module}/")]) == len(objs)
        script = [f for f in ld_flags(argv) if "--version-script" in f]
        assert script and Path(script[0].split("=", 1)[1]).name == "te.version", argv
