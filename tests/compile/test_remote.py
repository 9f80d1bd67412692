"""``qola build --remote`` (issue 26): every compile as an REAPI action on a real loopback service
(BuildGrid + buildbox workers, tests/support/remote_stack.py), in the ROCm 7 env (markers ``rocm``, ``remote``).

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
import shutil
from pathlib import Path
from typing import Any

import pytest
from support import remote_stack
from support.repro import ATTN, SOFTMAX, TINY_MODULE, libraries, manifest, tree_copy

from qola.core.errors import QolaError
from qola.pipeline import run as pipeline
from qola.pipeline.report import BuildReport
from qola.pipeline.run import BuildSpec
from qola.store import remote

pytestmark = pytest.mark.remote
_why = remote_stack.missing()
chroot = pytest.mark.skipif(_why is not None, reason=str(_why))  # the ROCm 7 env, where the stack installs
MODULES = SOFTMAX + ATTN + TINY_MODULE


def toolchain_id(tmp: Path, arch: str) -> str:
    from qola.toolchain import find_toolchain

    tc = find_toolchain([arch], env=dict(os.environ), accepted_versions=None, cache_dir=tmp / "probe")
    return remote.toolchain_id(tc, dict(os.environ))


def build(tmp: Path, name: str, tree: Path, m: Path, **kw: Any) -> pipeline.BuildReport:
    return pipeline.build(
        BuildSpec.make(
            manifest=str(m),
            aiter_root=str(tree),
            output_dir=str(tmp / f"out-{name}"),
            build_dir=str(tmp / f"build-{name}"),
            jobs=2,
            **kw,
        )
    )


def notes(report: BuildReport) -> str:
    return "\n".join(report.compiled.notes if report.compiled else [])


@pytest.mark.rocm
@chroot
def test_hip_remote_identical_and_second_client_all_cached(tmp_path: Path) -> None:
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


@pytest.mark.rocm
@chroot
def test_other_compiler_never_answers_and_bad_endpoints_stop_early(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
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


@pytest.mark.rocm
@chroot
def test_refused_token_stops_before_compiling(tmp_path: Path) -> None:
    tree = tree_copy(tmp_path / "kernels")
    m = manifest(tmp_path / "q.toml", "gfx942", SOFTMAX)
    token = tmp_path / "token"
    token.write_text("not-a-jwt")
    with (
        remote_stack.running(tmp_path / "svc", auth_secret="s3cret") as svc,
        pytest.raises(QolaError, match="did not run the start-up action"),
    ):
        build(tmp_path, "t", tree, m, remote=svc.url, remote_options={"token": str(token)})


@pytest.mark.rocm
@chroot
def test_service_lost_mid_build_publishes_nothing_or_falls_back_when_allowed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tree = tree_copy(tmp_path / "kernels")
    m = manifest(tmp_path / "q.toml", "gfx942", SOFTMAX + TINY_MODULE)
    dead = f"grpc://127.0.0.1:{remote_stack.free_port()}"
    monkeypatch.setattr(remote, "probe", lambda *a, **k: None)  # the service answered, then went away
    failed = build(tmp_path, "f", tree, m, remote=dead)
    assert not failed.ok
    out = tmp_path / "out-f" / "lib"  # no library of a module whose compile did not run
    assert not out.exists() or not [p for p in out.iterdir() if p.suffix in (".so", ".a")]
    log = "\n".join(r.detail or "" for r in failed.modules)
    assert "the REAPI service at http://127.0.0.1:" in log and "nothing was compiled locally" in log, log
    saved = build(tmp_path, "s", tree, m, remote=dead, remote_fallback=True)
    assert saved.ok
    text = notes(saved)
    # softmax.cu, softmax_pybind.cu, tiny.cu and the tiny module's generated tiny_gen.cu
    assert "0 compile(s) ran on workers, 0 came from the action cache, 4 compiled locally" in text, text
    assert build(tmp_path, "l", tree, m).ok
    assert libraries(tmp_path / "out-s") == libraries(tmp_path / "out-l")


needs_nvcc = pytest.mark.skipif(not shutil.which("nvcc"), reason="needs nvcc (the host's CUDA toolkit)")


@pytest.mark.slow
@needs_nvcc
@pytest.mark.skipif(remote_stack.missing_host() is not None, reason=str(remote_stack.missing_host()))
def test_cuda_remote_identical_and_second_client_all_cached(tmp_path: Path) -> None:
    """CUDA: nvcc is the host's (CUDA 13.0 cannot compile against the chroot's glibc 2.43 headers), so
    the client and the workers run on the host with buildbox's programs from the chroot
    (remote_stack.host_tools) and BuildGrid runs inside it."""
    tools = remote_stack.host_tools(tmp_path / "bin")
    env = {**os.environ, "PATH": f"{tools}:{os.environ.get('PATH', '')}"}
    tree = tree_copy(tmp_path / "a" / "kernels")
    m = manifest(tmp_path / "q.toml", "sm_90", MODULES)
    assert build(tmp_path, "local", tree, m).ok
    from qola.toolchain import find_toolchain

    tc = find_toolchain(["sm_90"], env=env, accepted_versions=None, cache_dir=tmp_path / "probe")
    with remote_stack.in_chroot(tmp_path / "svc") as svc:
        svc.worker("w1", remote.toolchain_id(tc, env), tools=tools)
        first = build(tmp_path, "r1", tree, m, remote=svc.url, env=env)
        assert first.ok, [r.detail for r in first.modules if r.status != "built"]
        text = notes(first)
        ran = int(text.split("--remote (")[1].split("): ")[1].split(" compile")[0])
        assert ran >= 4 and " 0 came from the action cache, 0 compiled locally" in text, text
        second = build(tmp_path, "r2", tree_copy(tmp_path / "b" / "kernels"), m, remote=svc.url, env=env)
        assert second.ok
        assert f"0 compile(s) ran on workers, {ran} came from the action cache, 0 compiled locally" in notes(second)
    want = libraries(tmp_path / "out-local")
    for name in ("r1", "r2"):
        got = libraries(tmp_path / f"out-{name}")
        assert got.keys() == want.keys() and [n for n in want if want[n] != got[n]] == [], name


@pytest.mark.rocm
@pytest.mark.ck
@pytest.mark.slow
@chroot
def test_ck_fwd_library_remote_identical(aiter_root: Path, tmp_path: Path) -> None:
    """A real CK library: AITER's libmha_fwd (TE's manifest shape) narrowed to one fMHA forward kernel
    for gfx942, built locally, then remotely into the same (cleaned) dirs: byte-identical. Its
    generated asm_fmha_fwd_v3 file spells __FILE__, so a local build holds the build dir's path;
    that compile's action is sent again naming the client's build dir (remote_launch.NAMES_BUILD_DIR)."""
    from support.rocm_aiter import manifest as te_manifest

    m = te_manifest(tmp_path / "te.toml", "te", ("gfx942",))
    local = build(tmp_path, "x", aiter_root, m)
    assert local.ok, [r.detail for r in local.modules if r.status != "built"]
    want = libraries(tmp_path / "out-x")
    shutil.rmtree(tmp_path / "out-x")
    shutil.rmtree(tmp_path / "build-x")
    with remote_stack.running(tmp_path / "svc") as svc:
        svc.worker("w1", toolchain_id(tmp_path, "gfx942"))
        rem = build(tmp_path, "x", aiter_root, m, remote=svc.url)
        assert rem.ok, [r.detail for r in rem.modules if r.status != "built"]
        assert "0 came from the action cache, 0 compiled locally" in notes(rem), notes(rem)
    got = libraries(tmp_path / "out-x")
    assert want.keys() == got.keys() == {"te_libmha_fwd.so"}
    assert want == got
