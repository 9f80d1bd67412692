"""Beyond one machine: ``qola build --dist`` on a loopback sccache-dist farm, a Redis-backed shared
compile cache, and what qola says sccache did (its statistics, read before and after ninja)."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path
from subprocess import CompletedProcess

import pytest
from support.common import KERNELS, run_qola
from support.farm import dist_farm, redis, sccache, sccache_env, stats

from qola.compile.dist import Stats

SOFTMAX = '[qola]\nnamespace = "qk"\n[build]\narchitectures = ["{arch}"]\n[[modules]]\nname = "module_softmax"\n'


def manifest(tmp: Path, arch: str = "sm_90", extra: str = "") -> Path:
    m = tmp / "q.toml"
    m.write_text(SOFTMAX.format(arch=arch) + extra)
    return m


def libs(out: Path) -> dict[str, str]:
    """Every published library's sha256, by its path in OUT."""
    files = json.loads((out / "manifest.json").read_text())["files"]
    return {
        rel: hashlib.sha256((out / rel).read_bytes()).hexdigest() for rel in sorted(files) if rel.startswith("lib/")
    }


def build(
    m: Path, out: Path, *args: str, env: dict[str, str] | None = None, build_dir: Path | None = None
) -> CompletedProcess[str]:
    argv = ["build", "--manifest", str(m), "--aiter-root", str(KERNELS), "-o", str(out), *args]
    if build_dir is not None:
        argv += ["--build-dir", str(build_dir)]
    return run_qola(*argv, env=env)


# -- sccache's statistics, as qola reads them ------------------------------------------------------

SNAPSHOT = {
    "stats": {
        "compile_requests": 5,
        "cache_hits": {"counts": {"CUDA": 2}, "adv_counts": {}},
        "cache_misses": {"counts": {"CUDA": 1, "PTX": 3}, "adv_counts": {}},
        "dist_compiles": {"127.0.0.1:10501": 4},
        "dist_errors": 1,
    }
}


def test_stats_difference_counts_this_build_only() -> None:
    before = Stats.of(SNAPSHOT)
    later = json.loads(json.dumps(SNAPSHOT))
    s = later["stats"]
    s["compile_requests"], s["cache_hits"]["counts"]["CUDA"] = 9, 5
    s["dist_compiles"] = {"127.0.0.1:10501": 10, "127.0.0.1:10502": 3}
    delta = Stats.of(later).minus(before)
    assert (delta.requests, delta.hits, delta.misses, delta.dist_errors) == (4, 3, 0, 0)
    assert delta.remote == {"127.0.0.1:10501": 6, "127.0.0.1:10502": 3} and delta.remote_total == 9
    text = delta.describe()
    assert "3 cache hit(s) (100.0 %)" in text and "9 compile(s) ran on the farm" in text
    # garbage from a foreign sccache never raises
    assert Stats.of({"stats": {"cache_hits": "x", "dist_compiles": [1]}}) == Stats()


def test_dist_without_a_farm_configured_is_an_error_with_a_hint(tmp_path: Path) -> None:
    env = sccache_env(tmp_path / "sc")  # an empty sccache config: dist disabled
    try:
        proc = build(manifest(tmp_path), tmp_path / "out", "--dist", "--dry-run", env=env)
    finally:
        sccache(env, "--stop-server")
    assert proc.returncode == 2, proc.stderr
    assert "sccache has no build farm configured" in proc.stderr and "[dist]" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_dist_with_another_launcher_is_refused(tmp_path: Path) -> None:
    proc = build(manifest(tmp_path), tmp_path / "out", "--dist", "--launcher", "true", "--dry-run")
    assert proc.returncode == 2 and "--dist compiles through sccache" in proc.stderr, proc.stderr


def test_dist_with_a_scheduler_that_does_not_answer_compiles_locally(tmp_path: Path) -> None:
    from support.farm import free_port

    env = sccache_env(
        tmp_path / "sc",
        f'[dist]\nscheduler_url = "http://127.0.0.1:{free_port()}"\n[dist.auth]\ntype = "token"\ntoken = "t"\n',
    )
    try:
        proc = build(manifest(tmp_path), tmp_path / "out", "--dist", "--dry-run", "-j", "2", env=env)
    finally:
        sccache(env, "--stop-server")
    assert proc.returncode == 0, proc.stderr
    assert "scheduler does not answer" in proc.stderr and "compiles locally" in proc.stderr


@pytest.mark.hip
def test_dist_compiles_hip_locally_with_a_note(tmp_path: Path) -> None:
    tree = tmp_path / "kernels"
    shutil.copytree(KERNELS, tree, ignore=shutil.ignore_patterns("hsa"))
    m = manifest(tmp_path, arch="gfx90a")
    proc = run_qola(
        "build",
        "--manifest",
        str(m),
        "--aiter-root",
        str(tree),
        "-o",
        str(tmp_path / "out"),
        "--dist",
        "-j",
        "2",
        env={"HIP_PLATFORM": "amd"},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "sccache-dist cannot distribute HIP compiles" in proc.stderr
    assert "sccache" not in (tmp_path / "out.build" / "build.ninja").read_text()  # no launcher at all


# -- a real farm on loopback ------------------------------------------------------------------------


@pytest.mark.slow
def test_dist_build_runs_compiles_on_the_farm_and_matches_a_local_build(tmp_path: Path) -> None:
    m = manifest(tmp_path)
    bdir = tmp_path / "b"
    local = build(m, tmp_path / "local", "-j", "2", build_dir=bdir)
    assert local.returncode == 0, local.stderr
    shutil.rmtree(bdir)
    with dist_farm(tmp_path / "farm", servers=2) as client:
        proc = build(m, tmp_path / "dist", "--dist", env=client, build_dir=bdir)
        remote = sum(stats(client)["stats"]["dist_compiles"].values())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # -j sized for the farm (2 servers x this machine's CPUs), not by the local rule
    said = re.search(r"-j (\d+) \(farm: 2 server\(s\), (\d+) CPUs", proc.stderr)
    assert said and said.group(1) == said.group(2), proc.stderr
    ran = re.search(r"(\d+) compile\(s\) ran on the farm", proc.stderr)
    assert ran and int(ran.group(1)) > 0, proc.stderr
    assert int(ran.group(1)) == remote  # qola's count is sccache's own
    assert libs(tmp_path / "dist") == libs(tmp_path / "local") != {}


@pytest.mark.slow
def test_redis_cache_serves_a_clean_rebuild(tmp_path: Path) -> None:
    m = manifest(tmp_path, extra='[[modules]]\nname = "module_rmsnorm"\n')
    with redis(tmp_path / "redis") as url:
        env = {**sccache_env(tmp_path / "sc"), "SCCACHE_REDIS_ENDPOINT": url}
        try:
            first = build(m, tmp_path / "o1", "--launcher", "sccache", "-j", "2", env=env)
            assert first.returncode == 0, first.stderr
            built = libs(tmp_path / "o1")
            # a clean machine at the same paths (sccache keys the build dir's prefix map, which keeps
            # __FILE__ of generated sources out of the libraries): no build dir, no output, no local
            # cache, a fresh sccache server
            sccache(env, "--stop-server")
            shutil.rmtree(tmp_path / "o1.build")
            shutil.rmtree(tmp_path / "o1")
            shutil.rmtree(tmp_path / "sc" / "local-cache", ignore_errors=True)
            second = build(m, tmp_path / "o1", "--launcher", "sccache", "-j", "2", env=env)
            data = stats(env)
        finally:
            sccache(env, "--stop-server")
    assert second.returncode == 0, second.stderr
    assert data["cache_location"].startswith("redis"), data["cache_location"]
    hits = sum(data["stats"]["cache_hits"]["counts"].values())
    misses = sum(data["stats"]["cache_misses"]["counts"].values())
    assert hits >= 3 and hits / (hits + misses) >= 0.95, data["stats"]
    said = re.search(r"(\d+) cache hit\(s\) \(([\d.]+) %\)", second.stderr)
    assert said and int(said.group(1)) == hits, second.stderr
    assert libs(tmp_path / "o1") == built != {}


@pytest.mark.hip  # the dry run still resolves the HIP compiler
def test_hip_build_through_an_sccache_with_a_farm_is_warned(tmp_path: Path) -> None:
    from support.farm import free_port

    env = sccache_env(
        tmp_path / "sc",
        f'[dist]\nscheduler_url = "http://127.0.0.1:{free_port()}"\n[dist.auth]\ntype = "token"\ntoken = "t"\n',
    )
    try:
        proc = build(
            manifest(tmp_path, arch="gfx942"),
            tmp_path / "out",
            "--launcher",
            "sccache",
            "--dry-run",
            env={**env, "HIP_PLATFORM": "amd"},
        )
    finally:
        sccache(env, "--stop-server")
    assert proc.returncode == 0, proc.stderr
    assert "sccache is configured for an sccache-dist farm, which cannot compile HIP" in proc.stderr
