"""One home for each thing (issue 12): child processes go through qola.core.proc and fail with one
error, file writes go through qola.core.fsutil, name/arch/version rules live in qola.core.rules and one
probe, and the code the docs describe is the code that runs."""

from __future__ import annotations

import os
import re
import signal
import sys
import threading
import time
from ast import Call
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

import qola
from qola.core import proc
from qola.core.errors import FailedProcessError

SRC = Path(qola.__file__).parent
# the one module allowed to import subprocess, and the one left to the pipeline work of issue 12
SUBPROCESS_ALLOWED = {"core/proc.py", "plan/variants.py"}


# ---- process runs: one runner, one failure error ---------------------------------------------------


def test_only_the_runner_imports_subprocess() -> None:
    users = sorted(
        str(p.relative_to(SRC))
        for p in SRC.rglob("*.py")
        if re.search(r"^\s*(import subprocess|from subprocess import)", p.read_text(), re.M)
    )
    assert set(users) <= SUBPROCESS_ALLOWED, users


def test_run_checked_one_error_for_every_failure(tmp_path: Path) -> None:
    with pytest.raises(FailedProcessError) as info:
        proc.run_checked([sys.executable, "-c", "import sys; print('bad things'); sys.exit(3)"], hint="fix it")
    err = info.value
    assert err.returncode == 3 and "exit code 3" in err.message and "bad things" in err.message
    assert err.hint == "fix it" and err.exit_code == 1

    with pytest.raises(FailedProcessError) as info:
        proc.run_checked([str(tmp_path / "no-such-program")])
    assert info.value.returncode == 127 and "cannot run" in info.value.message

    with pytest.raises(FailedProcessError) as info:
        proc.run_checked([sys.executable, "-c", "print('started', flush=True); import time; time.sleep(60)"], timeout=2)
    assert info.value.returncode == 124 and "no answer within 2 s" in info.value.message

    with pytest.raises(FailedProcessError) as info:
        proc.run_checked([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"])
    assert "killed by SIGKILL" in info.value.message

    done = proc.run_checked([sys.executable, "-c", "import sys; sys.exit(1)"], any_exit=True)
    assert done.returncode == 1


def test_link_step_and_compiler_probe_fail_through_the_runner(tmp_path: Path) -> None:
    from qola.compile import link
    from qola.jit import key

    with pytest.raises(FailedProcessError) as info:
        link.run_step(["sh", "-c", "echo undefined reference >&2; exit 1"])
    assert "undefined reference" in info.value.output
    bad = tmp_path / "cc"
    bad.write_text("#!/bin/sh\necho broken >&2\nexit 4\n")
    bad.chmod(0o755)
    with pytest.raises(FailedProcessError) as info:
        key.probe_compiler(str(bad), {"PATH": "/usr/bin:/bin"})
    assert info.value.returncode == 4 and "--version" in info.value.message


def _generator(tmp_path: Path) -> Path:
    script = tmp_path / "slow_gen.py"
    script.write_text(
        "import os, subprocess, sys, time\n"
        "out = sys.argv[sys.argv.index('--output_dir') + 1]\n"
        "child = subprocess.Popen(['sleep', '600'])\n"  # a grandchild: the whole group must end
        f"open({str(tmp_path / 'pids')!r}, 'w').write(f'{{os.getpid()}} {{child.pid}}')\n"
        "time.sleep(600)\n"  # ended by the test, never by time
    )
    return script


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="needs the main thread")
def test_ctrl_c_ends_generators_running_in_worker_threads(tmp_path: Path) -> None:
    from qola.compile.codegen import GenJob, run_generators
    from qola.plan.planner import Generator

    script = _generator(tmp_path)
    job = GenJob("m", (Generator(f"{script} --output_dir {{}}"),))
    pids_file = tmp_path / "pids"
    start = time.monotonic()
    # A shell's background job (the README's test command run with `&` beside a load) inherits SIGINT
    # ignored, and qola rightly leaves an ignored SIGINT alone: model an interactive Ctrl-C by giving
    # SIGINT its default handler for the test, and send it to the main thread itself (a process-wide
    # kill may land on the worker thread, where it would not interrupt the main thread's wait).
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with (
            ThreadPoolExecutor(max_workers=2) as pool,
            pytest.raises(proc.Interrupted),
            proc.signals_end_children(),
        ):
            future = pool.submit(run_generators, job, tmp_path / "gen", env={"PATH": os.environ["PATH"]})
            while not pids_file.exists() or len(pids_file.read_text().split()) < 2:
                assert time.monotonic() - start < 300, "the generator did not start"
                time.sleep(0.05)
            main = threading.main_thread().ident
            assert main is not None
            signal.pthread_kill(main, signal.SIGINT)
            time.sleep(600)  # the handler raises Interrupted here
    finally:
        signal.signal(signal.SIGINT, previous)
        proc.reset_stop()  # this process goes on to run other tests (a qola process would exit)
    pids = [int(p) for p in pids_file.read_text().split()]
    assert proc.wait_gone(pids, 10) == [], "a generator (or its child) survived Ctrl-C"
    assert isinstance(future.exception(), FailedProcessError)
    assert not (tmp_path / "gen" / "m" / "blob").exists()  # nothing half-generated was published


# ---- file writes: one home (qola.core.fsutil) -----------------------------------------------------------


def test_write_if_changed_keeps_mtime_takes_bytes_and_fixes_mode(tmp_path: Path) -> None:
    from qola.core.fsutil import write_if_changed

    path = write_if_changed(tmp_path / "d" / "f.cu", "int x;\n")
    os.utime(path, (1_000_000, 1_000_000))
    write_if_changed(path, b"int x;\n")  # same bytes: untouched
    assert path.stat().st_mtime == 1_000_000
    write_if_changed(path, b"int x;\n", mode=0o755)  # same bytes, other mode: chmod only
    assert path.stat().st_mtime == 1_000_000 and path.stat().st_mode & 0o777 == 0o755
    write_if_changed(path, "int y;\n")
    assert path.read_text() == "int y;\n" and path.stat().st_mtime != 1_000_000
    assert [p.name for p in path.parent.iterdir()] == ["f.cu"]  # no temp file left


def test_atomic_write_temp_prefix_commit_and_replace_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from qola.core import fsutil

    seen = []
    real = os.replace

    def spy(src: Any, dst: Any) -> None:
        seen.append(Path(src).name)
        return real(src, dst)

    monkeypatch.setattr("qola.core.fsutil.os.replace", spy)
    fsutil.atomic_write(tmp_path / "k.meta", b"x", temp_prefix=".tmp-k.meta-", sync_dir=True)
    assert seen[-1].startswith(".tmp-k.meta-") and (tmp_path / "k.meta").read_bytes() == b"x"
    assert (tmp_path / "k.meta").stat().st_mode & 0o777 == 0o644

    tmp = tmp_path / ".tmp-built"
    tmp.write_bytes(b"\x7fELF")
    fsutil.commit(tmp, tmp_path / "k.so")
    assert (tmp_path / "k.so").read_bytes() == b"\x7fELF" and not tmp.exists()

    final = tmp_path / "blob"
    for content in ("old", "new"):
        stage = tmp_path / f".staging-{content}"
        stage.mkdir()
        (stage / "a.cu").write_text(content)
        fsutil.replace_dir(stage, final)
        assert (final / "a.cu").read_text() == content and not stage.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["blob", "k.meta", "k.so"]


def test_atomic_writers_live_in_fsutil() -> None:
    """No module renames its own temp files: they call qola.core.fsutil. Left out, each for a reason:
    outdir.py (the output switch: renames and exchanges of whole published dirs, its own
    roll-forward protocol, tested under SIGKILL at every step), jit/prebuild.py (the compiler's temp output
    and the moving aside of a bad header tree, named by qola.jit.format, under the key's lock) and
    ninja.py (build.ninja: the pipeline work of issue 12 owns that file), templates/genwrap/record_reads.py
    (the generator recorder: it runs in the generator's own interpreter, standard library only, and
    writes its record to a temp name it then renames over the path qola gave it)."""
    allowed = {"core/fsutil.py", "output/outdir.py", "jit/prebuild.py", "compile/ninja.py"}
    allowed.add("templates/genwrap/record_reads.py")  # the generator recorder (above)
    found = sorted(
        str(p.relative_to(SRC))
        for p in SRC.rglob("*.py")
        if re.search(r"os\.replace\(|os\.rename\(|\.rename\(|mkstemp\(", p.read_text())
        and str(p.relative_to(SRC)) not in allowed
    )
    assert found == [], found


# ---- rules: one home (qola.core.rules) ------------------------------------------------------------------


@pytest.mark.parametrize("ns", ["class", "and", "co_await", "_Bool", "__x", "_X", "te ns", "9te"])
def test_a_bad_namespace_is_refused_wherever_it_comes_from(ns: str) -> None:
    from qola.compile.elf import ExportRule
    from qola.core.errors import QolaError
    from qola.hooks import embed
    from qola.output.consumers import render_config_header
    from qola.plan.manifest import parse

    with pytest.raises(QolaError, match="namespace"):
        parse(f'[qola]\nnamespace = "{ns}"\n')
    for use in (lambda: embed.check_names(ns, "m"), lambda: ExportRule(ns), lambda: render_config_header(ns, "1.0")):
        with pytest.raises(QolaError, match="namespace"):
            use()


ARCHS = [
    "gfx90a",
    "gfx942",
    "gfx1100",
    "gfx90a:xnack-",
    "gfx942:sramecc+:xnack-",
    "sm_80",
    "sm_90a",
    "sm_100f",
    "gfx9",
    "gfx90a:tgsplit+",
    "gfx90a:xnack",
    "sm_9",
    "sm_1000",
    "GFX90A",
    "native",
    "gfx942\n",
    "",
]


def test_one_arch_syntax_for_manifest_toolchain_and_embed(tmp_path: Path) -> None:
    from qola.core import rules
    from qola.core.errors import QolaError
    from qola.hooks import embed
    from qola.plan.manifest import check_archs
    from qola.toolchain.archs import vendor_of

    for arch in ARCHS:
        want = rules.vendor(arch)
        try:
            got = vendor_of(arch)
        except QolaError:
            got = None
        assert got == want, arch
        try:
            check_archs([arch])
            manifest_ok = True
        except ValueError:
            manifest_ok = False
        assert manifest_ok == (want is not None), arch
    (tmp_path / "hsa" / "gfx90a").mkdir(parents=True)
    for arch in ("gfx90a:xnack-", "gfx9", "../x"):
        with pytest.raises(QolaError, match=f"architecture {re.escape(repr(arch))}"):
            embed.collect(tmp_path, [arch], None)


def test_arch_lists_one_rule(tmp_path: Path) -> None:
    from qola.core.errors import QolaError
    from qola.plan.manifest import parse
    from qola.toolchain.archs import validate_archs

    for archs, needle in (
        (["gfx942", "sm_90"], "mix HIP and CUDA"),
        (["gfx90a:xnack-", "gfx90a:xnack+"], "different features"),
    ):
        with pytest.raises(QolaError, match=needle):
            validate_archs(archs)
        with pytest.raises(QolaError, match=needle):
            parse("[build]\narchitectures = [" + ", ".join(f'"{a}"' for a in archs) + "]\n")


def test_hip_version_is_probed_once_the_same_way(tmp_path: Path) -> None:
    """Planning's torch.version.hip and the build's toolchain read the version with one probe."""
    from qola.pipeline.prepare import hip_version
    from qola.plan.manifest import parse
    from qola.toolchain import hip

    fake = tmp_path / "bin" / "hipcc"
    fake.parent.mkdir()
    fake.write_text('#!/bin/sh\necho "HIP version: 6.4.43484-9999"\necho "AMD clang version 19.0.0"\n')
    fake.chmod(0o755)
    env = {"PATH": f"{fake.parent}:/usr/bin:/bin", "ROCM_PATH": str(tmp_path)}
    manifest = parse('[qola]\nrocm_versions = ["7.2"]\n')
    assert hip_version(env, manifest) == "6.4.43484"
    assert hip.read_version(str(fake), str(tmp_path), env)[1:] == ("6.4.43484", "-9999")
    assert hip_version({"PATH": str(tmp_path / "none")}, manifest) in ("7.2", hip.installed_version({}))
    users = [
        str(p.relative_to(SRC)) for p in SRC.rglob("*.py") if re.search(r"re\.\w+\(r?[\"']HIP version", p.read_text())
    ]
    assert users == ["toolchain/versions.py"]


def test_core_py_is_named_once() -> None:
    import ast

    from support.common import KERNELS

    from qola.plan.tree.aiter import open_tree
    from qola.plan.tree.aiter_core import CORE

    assert open_tree(KERNELS).core_path == KERNELS / CORE
    found = []
    for path in SRC.rglob("*.py"):
        tree = ast.parse(path.read_text())
        docs = {
            id(n.body[0].value)
            for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef)) and n.body and isinstance(n.body[0], ast.Expr)
        }
        found += [
            str(path.relative_to(SRC))
            for n in ast.walk(tree)
            if isinstance(n, ast.Constant)
            and isinstance(n.value, str)
            and id(n) not in docs
            and n.value.endswith("core.py")
        ]
    # commands/build.py: the pipeline work of issue 12 owns that file (it should use tree.core_path)
    assert sorted(found) in (["plan/tree/aiter_core.py"], ["commands/build.py", "plan/tree/aiter_core.py"])


# ---- no dead or untrue code -------------------------------------------------------------------------


def test_every_listed_command_exists() -> None:
    import importlib

    from qola import cli

    for name in cli.COMMANDS:
        assert hasattr(importlib.import_module(f"qola.commands.{name}"), "register"), name


def test_doctor_reports_tools_and_fails_without_a_host_compiler(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    import argparse

    from qola.commands import doctor

    env = {**os.environ}
    code = doctor.run(argparse.Namespace(), env=env)
    out = capsys.readouterr().out
    for name in ("ninja", "host C++", "HIP compiler", "CUDA compiler", "tar", "JIT cache"):
        assert name in out
    assert code in (0, 1)
    bad = {**env, "CXX": str(tmp_path / "no-such-c++"), "QOLA_JIT_CACHE_DIR": str(tmp_path / "jit")}
    assert doctor.run(argparse.Namespace(), env=bad) == 1
    captured = capsys.readouterr()
    assert "missing  host C++" in captured.out and "cannot build: host C++" in captured.err
    assert f"{tmp_path / 'jit'} (created on first use)" in captured.out


@pytest.mark.parametrize("name", ["child_environ", "is_c_keyword", "configs_dir"])
def test_removed_dead_code_stays_removed(name: str) -> None:
    users = [
        str(p.relative_to(SRC))
        for p in SRC.rglob("*.py")
        if re.search(rf"\b{name}\b", p.read_text()) and not (name == "configs_dir" and p.name == "codegen.py")
    ]  # GenJob.configs_dir: another thing
    assert users == []


# ---- what qola ships: runtime/ (into libraries) and templates/ (added to modules) -------------------


def test_shipped_files_live_where_their_role_says() -> None:
    from qola.core import tomlfile
    from qola.jit.layout import runtime_dir, runtime_sources
    from qola.plan import registry

    assert (registry.runtime_dir() / "qola_common.h").is_file()
    assert runtime_dir() == registry.runtime_dir() / "jit" and all(p.is_file() for p in runtime_sources())
    for name, entry in registry.load().items():
        for rel in (*entry.add_srcs, *entry.headers, *entry.add_includes):
            assert (registry.templates_dir() / rel).exists(), (name, rel)
    pyproject = tomlfile.loads((SRC.parent / "pyproject.toml").read_text())
    shipped = pyproject["tool"]["setuptools"]["package-data"]["qola"]
    assert {"runtime/**/*", "templates/**/*"} <= set(shipped)


# ---- issue 33: one checked open, a deadline on every child, one secret type ---------------------------


def _calls(path: Path, names: set[str]) -> Iterator[tuple[Call, str]]:
    import ast

    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
            if name in names:
                yield node, ast.unparse(f)


def test_every_child_qola_runs_has_a_deadline() -> None:
    """Every call of the runner (``proc.run``, ``proc.run_checked``) passes ``timeout=``; the one wait
    without it is ninja's (the build: ended by SIGTERM/SIGINT through signals_end_children, each
    compile under its own launcher) and the compile a cache launcher runs under it (ended with it). A new call without a deadline fails here."""
    allowed = {("compile/ninja.py", "proc.started"), ("compile/cache_launch.py", "proc.started")}
    missing = []
    for path in SRC.rglob("*.py"):
        rel = str(path.relative_to(SRC))
        if rel == "core/proc.py":
            continue
        for node, name in _calls(path, {"run", "run_checked", "started", "popen"}):
            if not (name.startswith("proc.") or (name in ("run_checked",) and "proc" in path.read_text())):
                continue
            if name in ("run_checked",) and rel.startswith("toolchain/"):
                continue  # toolchain's own wrapper (host.run_checked): QOLA_PROBE_TIMEOUT inside
            if not any(k.arg == "timeout" for k in node.keywords) and (rel, name) not in allowed:
                missing.append(f"{rel}:{node.lineno} {name}")
    assert missing == [], missing


# Every other open in the package, each for a reason (a write, qola's own shipped data, /proc, an fd the
# checked open returned, a walk that checks each entry with fstat on the fd it opened); counted per file.
# Reading a tree, a service's output, a cache, an output or build dir, or a patches dir goes through
# qola.core.inputs: a new open anywhere else fails here.
OTHER_OPENS = {
    "core/fsutil.py": 8,  # the one write primitive: temp files, fsync of dirs, comparing/copying what it writes, a log's append
    "cli.py": 3,  # /dev/null for a reader gone (a write); a closed standard fd reopened on /dev/null, its stream (standard_streams)
    "core/lock.py": 6,  # lock files (O_NOFOLLOW, O_EXCL when created) and /proc/locks, /proc/<pid>/cmdline
    "pipeline/progress.py": 3,  # /proc/<pid>/stat, /proc/<pid>/cmdline, /proc/uptime (the running units)
    "core/proc.py": 1,  # /proc/<pid>/stat
    "compile/ninja.py": 1,  # .ninja_log (the pipeline work of issues 31/34 owns ninja.py)
    "compile/unresolved.py": 1,  # os.fdopen of an fd from the checked open (pyelftools reads it)
    "jit/cache.py": 1,  # the lock file beside an entry (O_NOFOLLOW, created)
    "jit/headers.py": 6,  # the bundle (written, extracted O_EXCL|O_NOFOLLOW) and the dir walk (fstat per fd)
    "jit/libtable.py": 1,  # os.fdopen of an fd from the checked open (qola.jit.safeio)
    "jit/prebuild.py": 3,  # the compiler's temp output and the compile log (writes)
    "output/consumers.py": 1,  # qola_common.h shipped with qola
    "output/outdir.py": 4,  # OUT's switch protocol: manifest.json and lock fds (O_NOFOLLOW, fstat checked)
    "output/publish.py": 4,  # the stage's files (O_EXCL writes) and a copy from an fd the checked open returned
    "plan/registry.py": 1,  # registry.toml shipped with qola
    "store/prebuilt.py": 7,  # the archive written (O_EXCL), packed from OUT (O_NOFOLLOW), and the download verified
    "store/download.py": 1,  # a file of a local store (checked fd); the download is written by fsutil.atomic_stream
    "toolchain/host.py": 1,  # /proc/meminfo
    # the recorder's record (a write), the argv file qola wrote for it (qola.core.argfile) and each file the
    # generator opens for reading, hashed as it is opened (O_NONBLOCK, fstat: a regular file only), in the
    # generator's interpreter (standard library only: qola.core.inputs is not there)
    "templates/genwrap/record_reads.py": 3,
}
_RAW_OPEN = re.compile(
    r"(?<![\w.])open\(|\.read_bytes\(|\.read_text\(|os\.open\(|\bio\.open\(|tarfile\.open\(|os\.fdopen\("
)


def test_input_is_opened_only_through_the_checked_open() -> None:
    """(a) of issue 33: what qola reads from a tree, a service, a cache, an output dir or a patches
    dir is checked for type and size (owner where it matters) before it is opened, hashed or trusted,
    by one primitive, qola.core.inputs (os.open once, O_NONBLOCK, fstat on the descriptor). Every
    other open in the package is listed above with its reason; a new one fails here."""
    found: dict[str, list[str]] = {}
    for path in sorted(SRC.rglob("*.py")):
        rel = str(path.relative_to(SRC))
        if rel == "core/inputs.py":
            continue
        for i, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if _RAW_OPEN.search(code) and '"""' not in code and "``" not in code:
                found.setdefault(rel, []).append(f"{i}: {line.strip()}")
    counts = {rel: len(lines) for rel, lines in found.items()}
    assert counts == OTHER_OPENS, "\n".join(f"{r}:{x}" for r, xs in found.items() for x in xs)
    assert (SRC / "core" / "inputs.py").read_text().count("os.open(") == 1  # the one open


def test_the_checked_open_refuses_before_reading(tmp_path: Path) -> None:
    from qola.core import inputs
    from qola.core.errors import QolaError

    fifo = tmp_path / "f.py"
    os.mkfifo(fifo)
    big = tmp_path / "big"
    with open(big, "wb") as f:
        f.truncate(2 << 40)  # sparse: 2 TB
    (tmp_path / "link").symlink_to(big)
    (tmp_path / "d").mkdir()
    for path, needle, kw in (
        (fifo, "a FIFO", {}),
        (big, "bytes; at most", {}),
        (tmp_path / "link", "symlink", {"follow": False}),
        (tmp_path / "d", "a directory", {}),
    ):
        opts: dict[str, Any] = kw
        with pytest.raises(QolaError, match=needle):
            inputs.read_checked(path, limit=1 << 20, what="input", **opts)
        with pytest.raises(QolaError, match=needle):
            inputs.sha256_checked(path, limit=1 << 20, what="input", **opts)
    group_writable = tmp_path / "gw"
    group_writable.write_bytes(b"x")
    group_writable.chmod(0o664)
    with pytest.raises(QolaError, match="writable by group"):
        inputs.read_checked(group_writable, limit=10, what="cache file", trusted=True)
    assert inputs.read_checked(group_writable, limit=10, what="tree file") == b"x"
