"""``qola build --remote`` (issue 26): every compile as an REAPI action on a real loopback service
(BuildGrid + buildbox workers, tests/remote_stack.py), in the ROCm 7 env (markers ``rocm``, ``remote``).

* a HIP build (gfx942: the example tree's softmax module, a generated attention family and a tiny
  module that spells ``__FILE__``) compiled on the workers is byte-identical to a local build, and a
  second clean client (another tree copy, build and output dir) compiles nothing: every compile
  comes from the action cache, and its libraries are the same bytes;
* a worker with another compiler id is never given the build; an unreachable endpoint and refused
  credentials stop the build before anything compiles (exit 2, the endpoint named); the service
  failing mid-build fails the build with nothing published, or (``--remote-fallback``) compiles
  locally and says so.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import remote_stack
from test_reproducible import ATTN, SOFTMAX, TINY_MODULE, libraries, manifest, tree_copy

from qola import pipeline, remote
from qola.errors import QolaError
from qola.pipeline import BuildSpec

pytestmark = [pytest.mark.rocm, pytest.mark.remote,
              pytest.mark.skipif(remote_stack.missing() is not None, reason=str(remote_stack.missing()))]
MODULES = SOFTMAX + ATTN + TINY_MODULE


def toolchain_id(tmp: Path, arch: str) -> str:
    from qola.toolchain import find_toolchain

    tc = find_toolchain([arch], env=dict(os.environ), accepted_versions=None, cache_dir=tmp / "probe")
    return remote.toolchain_id(tc, dict(os.environ))


def build(tmp: Path, name: str, tree: Path, m: Path, **kw) -> pipeline.BuildReport:
    return pipeline.build(BuildSpec(manifest=str(m), aiter_root=str(tree), output_dir=str(tmp / f"out-{name}"),
                                    build_dir=str(tmp / f"build-{name}"), jobs=2, **kw))


def notes(report) -> str:
    return "\n".join(report.compiled.notes if report.compiled else [])


def test_hip_remote_identical_and_second_client_all_cached(tmp_path):
    tree = tree_copy(tmp_path / "a" / "kernels")
    m = manifest(tmp_path / "q.toml", "gfx942", MODULES)
    local = build(tmp_path, "local", tree, m)
    assert local.ok
    with remote_stack.running(tmp_path / "svc") as svc:
        assert svc.startup < 60, svc.startup
        svc.worker("w1", toolchain_id(tmp_path, "gfx942"))
        first = build(tmp_path, "r1", tree, m, remote=svc.url)
        assert first.ok, [r.detail for r in first.modules if r.status != "built"]
        text = notes(first)
        assert " 0 came from the action cache" in text and "0 compiled locally" in text, text
        ran = int(text.split("--remote (")[1].split("): ")[1].split(" compile")[0])
        assert ran >= 4, text  # softmax, tiny, the attention instances and their API
        # a second client: another tree copy at another path, clean build and output dirs
        tree2 = tree_copy(tmp_path / "other" / "place" / "kernels")
        second = build(tmp_path, "r2", tree2, m, remote=svc.url)
        assert second.ok
        text2 = notes(second)
        assert f"0 compile(s) ran on workers, {ran} came from the action cache, 0 compiled locally" in text2, text2
    want = libraries(tmp_path / "out-local")
    assert set(want) == {"qk_module_softmax.so", "qk_libattn_fwd.a", "qk_module_tiny.so"}
    for name in ("r1", "r2"):
        got = libraries(tmp_path / f"out-{name}")
        assert got.keys() == want.keys()
        assert [n for n in want if want[n] != got[n]] == [], f"{name}: libraries differ from the local build"


def test_other_compiler_never_answers_and_bad_endpoints_stop_early(tmp_path, monkeypatch):
    tree = tree_copy(tmp_path / "kernels")
    m = manifest(tmp_path / "q.toml", "gfx942", SOFTMAX)
    monkeypatch.setattr(remote, "PROBE_TIMEOUT", 15.0)
    with remote_stack.running(tmp_path / "svc") as svc:
        svc.worker("other", "0" * 32)  # a worker with another compiler
        with pytest.raises(QolaError, match="no worker with this toolchain"):
            build(tmp_path, "x", tree, m, remote=svc.url)
        assert "qola-remote" not in svc.log("other")  # it never ran one of ours
        port = remote_stack.free_port()
    with pytest.raises(QolaError, match=f"127.0.0.1:{port}"):
        build(tmp_path, "y", tree, m, remote=f"grpc://127.0.0.1:{port}")
    assert not (tmp_path / "out-x" / "lib").exists() and not (tmp_path / "out-y" / "lib").exists()
    with pytest.raises(QolaError, match="not an REAPI endpoint"):
        build(tmp_path, "z", tree, m, remote="ftp://host")


def test_refused_token_stops_before_compiling(tmp_path):
    tree = tree_copy(tmp_path / "kernels")
    m = manifest(tmp_path / "q.toml", "gfx942", SOFTMAX)
    token = tmp_path / "token"
    token.write_text("not-a-jwt")
    with remote_stack.running(tmp_path / "svc", auth_secret="s3cret") as svc:
        with pytest.raises(QolaError, match="did not run the start-up action"):
            build(tmp_path, "t", tree, m, remote=svc.url, remote_options={"token": str(token)})


def test_service_lost_mid_build_publishes_nothing_or_falls_back_when_allowed(tmp_path, monkeypatch):
    tree = tree_copy(tmp_path / "kernels")
    m = manifest(tmp_path / "q.toml", "gfx942", SOFTMAX + TINY_MODULE)
    dead = f"grpc://127.0.0.1:{remote_stack.free_port()}"
    monkeypatch.setattr(remote, "probe", lambda *a, **k: None)  # the service answered, then went away
    failed = build(tmp_path, "f", tree, m, remote=dead)
    assert not failed.ok
    assert not (tmp_path / "out-f" / "lib").exists()  # nothing half-published
    log = "\n".join(r.detail or "" for r in failed.modules)
    assert "the REAPI service at http://127.0.0.1:" in log and "nothing was compiled locally" in log, log
    saved = build(tmp_path, "s", tree, m, remote=dead, remote_fallback=True)
    assert saved.ok
    text = notes(saved)
    assert "0 compile(s) ran on workers, 0 came from the action cache, 2 compiled locally" in text, text
    local = build(tmp_path, "l", tree, m)
    assert libraries(tmp_path / "out-s") == libraries(tmp_path / "out-l")


