"""Issue 11, the build-run/CLI slice: bad numbers and directories are refused before anything runs,
the no-op fast path notices a replaced compiler / compiler environment / re-pointed symlinks / tuned
configs, one build per build and output dir, children die with qola, last-resort errors are one line.

Builds use a fake nvcc (answers the toolchain probes, compiles plain C++ with g++): about a second each.
"""

from __future__ import annotations

import argparse
import errno
import hashlib
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from subprocess import CompletedProcess

import pytest
from support.common import qola_command, run_qola
from support.fake_nvcc import TINY, fake_nvcc, make_tree
from support.procs import alive_after, default_dispositions, descendants

from qola import cli
from qola.core.errors import QolaError
from qola.store import fastpath

# what this slice added is imported in the tests (each then fails on its own on the base commit)
STAMP = "toolchain.id"

MANIFEST = (
    '[qola]\nnamespace = "qk"\n[build]\narchitectures = ["sm_90"]\n%s'
    '[[modules]]\nname = "module_tiny"\nsrcs = ["csrc/tiny/tiny.cu"]\nis_python_module = false\n'
)


@pytest.fixture
def setup(tmp_path: Path) -> tuple[Path, Path, Path, dict[str, str], Callable[..., CompletedProcess[str]]]:
    """(tmp, tree, manifest, env, build(*extra, env=…) -> CompletedProcess) for `-o tmp/out`."""
    tree = make_tree(tmp_path / "tree")
    m = tmp_path / "q.toml"
    m.write_text(MANIFEST % "")
    env = {"CUDACXX": str(fake_nvcc(tmp_path / "nvcc"))}

    def build(
        *extra: str, env_extra: dict[str, str] | None = None, out: str = "out", root: str | None = None
    ) -> CompletedProcess[str]:
        args = ["build", "--manifest", str(m), "--aiter-root", root or str(tree), "-o", str(tmp_path / out), *extra]
        return run_qola(*args, env={**env, **(env_extra or {})}, cwd=tmp_path)

    return tmp_path, tree, m, env, build


def objects_built(build_dir: Path) -> list[str]:
    try:
        lines = (build_dir / ".ninja_log").read_text().splitlines()[1:]
    except OSError:
        return []
    return [ln.split("\t")[3] for ln in lines if ln.split("\t")[3].endswith(".o")]


def sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*") if p.is_file()}


def one_error(proc_: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert proc_.returncode == 2, proc_.stdout + proc_.stderr
    assert "Traceback" not in proc_.stderr, proc_.stderr
    assert "error:" in proc_.stderr and all(n in proc_.stderr for n in needles), proc_.stderr


# ---- item 4: numbers are validated before anything runs --------------------------------------------


@pytest.mark.cli
@pytest.mark.parametrize(
    "extra, env_extra, manifest_extra, needle",
    [
        (("-j", "-5"), {}, "", "-j/--jobs"),
        (("-j", "0"), {}, "", "-j/--jobs"),
        (("-j", "99999999999"), {}, "", "-j/--jobs"),
        (("-j", "two"), {}, "", "-j/--jobs"),
        ((), {"MAX_JOBS": "-3"}, "", "MAX_JOBS"),
        ((), {}, "jobs = 10000000\n", "[build].jobs"),
    ],
)
def test_bad_job_counts_refused_before_anything_runs(
    setup: tuple[Path, Path, Path, dict[str, str], Callable[..., CompletedProcess[str]]],
    extra: tuple[str, ...],
    env_extra: dict[str, str],
    manifest_extra: str,
    needle: str,
) -> None:
    tmp, _tree, m, _env, build = setup
    assert build("-j", "2").returncode == 0
    lib = tmp / "out" / "lib" / "qk_module_tiny.so"
    before = sha(lib)
    text = m.read_text()
    m.write_text(text.replace("[build]\n", "[build]\n" + manifest_extra))
    res = build(*extra, "--build-dir", str(tmp / "fresh"), env_extra=env_extra)
    assert res.returncode == 2 and "Traceback" not in res.stderr and needle in res.stderr, res.stderr
    assert lib.is_file() and sha(lib) == before, "the previous output lost its library"
    assert not objects_built(tmp / "fresh")


# ---- item 7: the no-op fast path and the graph notice what changes the compilers' output ------------


def test_compiler_replaced_in_place_recompiles(
    setup: tuple[Path, Path, Path, dict[str, str], Callable[..., CompletedProcess[str]]],
) -> None:
    tmp, _tree, _m, env, build = setup
    assert build().returncode == 0 and "up to date" in build().stderr
    n = len(objects_built(tmp / "out.build"))
    old_id = json.loads((tmp / "out" / "manifest.json").read_text())["toolchain"]["identity"]
    nvcc = Path(env["CUDACXX"])
    st = nvcc.stat()
    fake_nvcc(nvcc, tag="fake-2")  # same path, same size, new --version …
    os.utime(nvcc, ns=(st.st_atime_ns, st.st_mtime_ns))  # … and the old mtime
    res = build()
    assert res.returncode == 0 and "up to date" not in res.stderr, res.stderr
    assert len(objects_built(tmp / "out.build")) > n, "nothing recompiled with the new compiler"
    assert json.loads((tmp / "out" / "manifest.json").read_text())["toolchain"]["identity"] != old_id
    assert "Build fake-2" in json.loads((tmp / "out.build" / STAMP).read_text())["version_output"]
    assert "up to date" in build().stderr


@pytest.mark.parametrize(
    "var",
    [
        "NVCC_APPEND_FLAGS",
        "NVCC_PREPEND_FLAGS",
        "CPATH",
        "HIPCC_COMPILE_FLAGS_APPEND",
        "CCC_OVERRIDE_OPTIONS",
        "LIBRARY_PATH",
    ],
)
def test_compiler_environment_change_rebuilds(
    setup: tuple[Path, Path, Path, dict[str, str], Callable[..., CompletedProcess[str]]], var: str
) -> None:
    tmp, _tree, _m, _env, build = setup
    assert build().returncode == 0 and "up to date" in build().stderr
    n = len(objects_built(tmp / "out.build"))
    res = build(env_extra={var: "-DQOLA_TEST_FLAG=1" if "FLAGS" in var or "OPTIONS" in var else str(tmp)})
    assert res.returncode == 0 and "up to date" not in res.stderr, res.stderr
    assert len(objects_built(tmp / "out.build")) > n, f"{var} changed, nothing recompiled"
    stamp = json.loads((tmp / "out.build" / STAMP).read_text())
    assert var in stamp["env"]


def test_one_list_of_compiler_variables_feeds_fast_path_and_graph(
    setup: tuple[Path, Path, Path, dict[str, str], Callable[..., CompletedProcess[str]]],
) -> None:
    from qola.toolchain import identity

    assert set(identity.COMPILER_ENV) <= set(fastpath.ENV_KEYS)
    assert {
        "NVCC_APPEND_FLAGS",
        "NVCC_PREPEND_FLAGS",
        "HIPCC_COMPILE_FLAGS_APPEND",
        "HIPCC_LINK_FLAGS_APPEND",
        "CCC_OVERRIDE_OPTIONS",
        "CPATH",
        "C_INCLUDE_PATH",
        "CPLUS_INCLUDE_PATH",
        "LIBRARY_PATH",
        "HIP_PATH",
        "ROCM_PATH",
        "HIP_PLATFORM",
        "PTXAS_FLAGS",
        "INCLUDES",
    } <= set(identity.COMPILER_ENV)
    tmp, _tree, _m, _env, build = setup
    assert build().returncode == 0
    graph = (tmp / "out.build" / "build.ninja").read_text()
    edges = [ln for ln in graph.splitlines() if ln.startswith("build ") and " phony " not in ln]
    implicit = [ln.split(" | ", 1)[1].split(" || ")[0].split() if " | " in ln else [] for ln in edges]
    assert edges and all(identity.STAMP in deps for deps in implicit), edges


def test_repointed_tree_and_manifest_symlinks_rebuild(
    setup: tuple[Path, Path, Path, dict[str, str], Callable[..., CompletedProcess[str]]],
) -> None:
    tmp, tree, m, env, build = setup
    other = tmp / "tree2"
    shutil.copytree(tree, other, copy_function=shutil.copy2)  # same sizes and mtimes …
    src = other / "csrc" / "tiny" / "tiny.cu"
    st = src.stat()
    src.write_text(TINY % 43)  # … one source differs in content only
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns))
    link = tmp / "current"
    link.symlink_to(tree)
    assert build(root=str(link)).returncode == 0 and "up to date" in build(root=str(link)).stderr
    link.unlink()
    link.symlink_to(other)
    res = build(root=str(link))
    assert res.returncode == 0 and "up to date" not in res.stderr, res.stderr
    # the manifest given as a symlink, re-pointed at another one with the same size and mtime
    m2 = tmp / "q2.toml"
    m2.write_text(m.read_text().replace('"qk"', '"qz"'))
    os.utime(m2, ns=(m.stat().st_atime_ns, m.stat().st_mtime_ns))
    mlink = tmp / "m.toml"
    mlink.symlink_to(m)
    args = ("build", "--manifest", str(mlink), "--aiter-root", str(tree), "-o", str(tmp / "o2"))
    assert run_qola(*args, env=env).returncode == 0 and "up to date" in run_qola(*args, env=env).stderr
    mlink.unlink()
    mlink.symlink_to(m2)
    res = run_qola(*args, env=env)
    assert res.returncode == 0 and "up to date" not in res.stderr, res.stderr
    assert (tmp / "o2" / "lib" / "qz_module_tiny.so").is_file()


def test_tuned_configs_are_inputs_of_the_fast_path(
    setup: tuple[Path, Path, Path, dict[str, str], Callable[..., CompletedProcess[str]]],
) -> None:
    tmp, tree, _m, _env, build = setup
    assert build().returncode == 0 and "up to date" in build().stderr
    csv = tree / "aiter" / "configs" / "softmax_tuned.csv"
    st = csv.stat()
    text = csv.read_text()
    csv.write_text(text.replace("1", "2", 1))  # same size and mtime, other content
    os.utime(csv, ns=(st.st_atime_ns, st.st_mtime_ns))
    res = build()
    assert res.returncode == 0 and "up to date" not in res.stderr, res.stderr
    assert (tmp / "out" / "configs" / "softmax_tuned.csv").read_text() == csv.read_text()
    assert "up to date" in build().stderr
    # a per-model CSV joins AITER's merge of a config; an AITER_CONFIG_* override replaces it
    (tree / "aiter" / "configs" / "model_configs").mkdir()
    shutil.copy(csv, tree / "aiter" / "configs" / "model_configs" / "m1_softmax_tuned.csv")
    assert "up to date" not in build().stderr
    assert "up to date" in build().stderr
    assert "up to date" not in build(env_extra={"AITER_CONFIG_SOFTMAX_EXTRA": str(csv)}).stderr


# ---- item 8: one build per build dir and output dir --------------------------------------------------


def test_concurrent_builds_of_one_output_dir_are_refused_naming_the_holder(
    setup: tuple[Path, Path, Path, dict[str, str], Callable[..., CompletedProcess[str]]],
) -> None:
    tmp, tree, m, env, build = setup
    args = ["build", "--manifest", str(m), "--aiter-root", str(tree), "-o", str(tmp / "out")]
    first = subprocess.Popen(
        qola_command(*args),
        env={**os.environ, **env, "FAKE_NVCC_SLEEP": "600"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=tmp,
        preexec_fn=default_dispositions,
    )
    try:
        deadline = time.time() + 60
        while not (tmp / "out.build" / "build.ninja").exists() and time.time() < deadline:
            time.sleep(0.2)
        graph = (tmp / "out.build" / "build.ninja").stat()
        second = build()
        one_error(second, "another qola build is using", f"pid {first.pid}", "command: qola build")
        after = (tmp / "out.build" / "build.ninja").stat()  # refused before it planned or wrote anything
        assert (after.st_ino, after.st_mtime_ns) == (graph.st_ino, graph.st_mtime_ns)
        one_error(build("--build-dir", str(tmp / "elsewhere")), "the output dir", f"pid {first.pid}")
        one_error(build("--wait", "0.5"), "waited 0.5 s", f"pid {first.pid}")
        assert not objects_built(tmp / "elsewhere")
    finally:
        first.send_signal(signal.SIGTERM)
        assert first.wait(timeout=30) == 128 + signal.SIGTERM
    waited = build("--wait")  # the holder is gone: the lock is free
    assert waited.returncode == 0, waited.stderr


# ---- item 4 (directories): refused with exit 2 before any work -------------------------------------


@pytest.mark.cli
@pytest.mark.parametrize(
    "out, build_dir, needle",
    [
        ("/", None, "refusing to use / as the output dir"),
        ("{tree}/csrc/include", None, "is inside the kernel tree"),
        ("{tree}", None, "the output dir and the kernel tree are the same directory"),
        # a tree inside the output dir under a name qola never writes is accepted (TE's OUT/third_party/aiter,
        # issue 21: tests/clients/test_te_flow.py); under one it writes, refused there too
        ("{tmp}/o", "{tmp}/o", "the output dir and the build dir are the same directory"),
        ("{tmp}/b/o", "{tmp}/b", "is inside the build dir"),
        ("{tmp}/o", "{tree}/build", "the build dir {tree}/build is inside the kernel tree"),
        ("{tmp}/q.toml", None, "exists and is not a directory"),
    ],
)
def test_output_and_build_dirs_are_checked_before_any_work(
    setup: tuple[Path, Path, Path, dict[str, str], Callable[..., CompletedProcess[str]]],
    out: str,
    build_dir: str | None,
    needle: str,
) -> None:
    tmp, tree, m, env, _build = setup
    before = snapshot(tree)
    fill = {"tmp": tmp, "tree": tree}
    extra = ["--build-dir", build_dir.format(**fill)] if build_dir else []
    res = run_qola(
        "build", "--manifest", str(m), "--aiter-root", str(tree), "-o", out.format(**fill), *extra, env=env, cwd=tmp
    )
    one_error(res, needle.format(**fill))
    assert snapshot(tree) == before and not list(tree.rglob("*.ninja")), "the tree was written to"


def _mount_tmpfs(at: Path, options: str) -> bool:
    at.mkdir(parents=True, exist_ok=True)
    try:
        return (
            subprocess.run(
                ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(at)], capture_output=True, timeout=30
            ).returncode
            == 0
        )
    except (OSError, subprocess.SubprocessError):
        return False


@pytest.mark.parametrize(
    "options, needle",
    [("ro,size=1m", "is not writable (a read-only file system"), ("size=1m", "not enough free space")],
)
def test_read_only_or_full_output_fs_refused_before_compiling(
    setup: tuple[Path, Path, Path, dict[str, str], Callable[..., CompletedProcess[str]]], options: str, needle: str
) -> None:
    tmp, tree, m, env, _build = setup
    mnt = tmp / "mnt"
    if not _mount_tmpfs(mnt, options):
        pytest.skip("cannot mount a tmpfs here (needs root / CAP_SYS_ADMIN)")
    try:
        res = run_qola(
            "build",
            "--manifest",
            str(m),
            "--aiter-root",
            str(tree),
            "-o",
            str(mnt / "out"),
            "--build-dir",
            str(tmp / "b"),
            env=env,
            cwd=tmp,
        )
        one_error(res, needle)
        assert not objects_built(tmp / "b")
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


def test_room_counts_the_previous_output(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from qola.pipeline import preflight

    out = tmp_path / "out"
    (out / "lib").mkdir(parents=True)
    (out / "lib" / "big.so").write_bytes(b"\0" * (3 * 1024 * 1024))
    for other in ("third_party/aiter", ".qola/prev/lib"):  # a kernel tree inside OUT, the previous version
        (out / other).mkdir(parents=True)
        (out / other / "big").write_bytes(b"\0" * (3 * 1024 * 1024))  # neither counts
    real = os.statvfs

    class Small:
        def __init__(self, st: os.statvfs_result) -> None:
            self.f_bavail, self.f_frsize, self.f_favail, self.f_files, self.f_flag = 4, 1024 * 1024, 1000, 1000, 0

    monkeypatch.setattr(os, "statvfs", lambda p: Small(real(p)))
    with pytest.raises(QolaError, match="the output there now takes 3 MiB"):
        preflight.room(out, tmp_path / "b", min_free=1024 * 1024)
    preflight.room(tmp_path / "fresh", tmp_path / "b2", min_free=1024 * 1024)  # 2 MiB needed, 4 free


# ---- item 5: children in their own process groups, ended with qola ----------------------------------


@pytest.mark.parametrize("sig, code", [(signal.SIGKILL, -signal.SIGKILL), (signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_killed_build_leaves_no_children(
    setup: tuple[Path, Path, Path, dict[str, str], Callable[..., CompletedProcess[str]]], sig: signal.Signals, code: int
) -> None:
    tmp, tree, m, env, _build = setup
    args = ["build", "--manifest", str(m), "--aiter-root", str(tree), "-o", str(tmp / "out")]
    # a shell's background job inherits SIGINT ignored (and qola rightly keeps it so): give the child
    # the disposition a terminal user's qola has
    qola = subprocess.Popen(
        qola_command(*args),
        env={**os.environ, **env, "FAKE_NVCC_SLEEP": "600"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp,
        preexec_fn=default_dispositions,
    )
    ours: list[int] = []
    try:
        deadline = time.time() + 60
        while time.time() < deadline:
            ours = descendants(qola.pid)
            names = [Path(f"/proc/{p}/comm").read_text().strip() for p in ours if Path(f"/proc/{p}/comm").exists()]
            if "sleep" in names and "ninja" in names:
                break
            time.sleep(0.2)
        else:
            pytest.fail("the build never reached its compile")
        qola.send_signal(sig)
        assert qola.wait(timeout=30) == code
        alive = alive_after(ours, 15)
        assert not alive, f"still running after qola died: {alive}"
        if sig != signal.SIGKILL:
            assert qola.stderr is not None and "Traceback" not in qola.stderr.read()
    finally:
        qola.kill()
        for pid in alive_after(ours, 0):  # only the processes this test started
            os.kill(pid, signal.SIGKILL)


# ---- item 6: toolchain hints name only what `qola build` accepts ------------------------------------


def test_followed_version_hint_works(
    setup: tuple[Path, Path, Path, dict[str, str], Callable[..., CompletedProcess[str]]],
) -> None:
    tmp, _tree, m, _env, build = setup
    m.write_text(m.read_text().replace("[build]", 'cuda_versions = ["12.4"]\n[build]'))
    old = fake_nvcc(tmp / "nvcc13")
    one_error(build(env_extra={"CUDACXX": str(old)}), "CUDACXX", "cuda_versions")
    assert build(env_extra={"CUDACXX": str(fake_nvcc(tmp / "nvcc12", release="12.4"))}).returncode == 0


# ---- item 7 (CLI): last-resort errors are one line; --debug shows the traceback ----------------------


@pytest.mark.cli
@pytest.mark.parametrize(
    "exc, needles",
    [
        (
            OSError(errno.EACCES, "Permission denied", "/srv/x/lib"),
            ("Permission denied", "'/srv/x/lib'", "errno 13", "EACCES"),
        ),
        (
            OSError(errno.ENOSPC, "No space left on device", "/o/a", None, "/o/b"),
            ("No space left", "'/o/a' -> '/o/b'", "ENOSPC"),
        ),
        (RecursionError("maximum recursion depth exceeded"), ("nested too deeply",)),
        (MemoryError(), ("out of memory",)),
    ],
)
def test_cli_last_resort_is_one_line_and_debug_shows_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], exc: BaseException, needles: tuple[str, ...]
) -> None:
    import qola.commands.build as build_cmd

    def boom(args: argparse.Namespace) -> None:
        raise exc

    monkeypatch.setattr(build_cmd, "run", boom)
    assert cli.main(["build", "-m", "x.toml", "-o", "o"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.startswith("error: ") and all(n in err for n in needles), err
    assert len([ln for ln in err.splitlines() if ln.startswith("error:")]) == 1
    assert cli.main(["--debug", "build", "-m", "x.toml", "-o", "o"]) == 2
    assert "Traceback" in capsys.readouterr().err


@pytest.mark.cli
def test_cli_interrupt_is_130_without_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import qola.commands.build as build_cmd

    def interrupted(args: argparse.Namespace) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(build_cmd, "run", interrupted)
    assert cli.main(["build", "-m", "x.toml", "-o", "o"]) == 130
    assert "Traceback" not in capsys.readouterr().err
