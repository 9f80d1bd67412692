"""Every child process and every wait has a deadline and ends on SIGTERM; a child's output is never
held whole (issue 23: hangs, a generator printing gigabytes, ``doctor`` with an empty PATH).

Nothing here sleeps to wait: a hung tool is ended by the deadline the test sets through the knob
(``QOLA_*_TIMEOUT``) and the test waits on the process ending; a waiting qola is signalled only once
it said it waits."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from support.common import KERNELS, qola_command, run_qola
from support.procs import default_dispositions

from qola.compile.codegen import GenJob
from qola.core import deadlines, lock, proc
from qola.core.errors import FailedProcessError, QolaError

GENEROUS = 120  # seconds the test waits for a process that should end in about one


def hanging_tool(path: Path, how: str = "sleep") -> tuple[Path, Path]:
    """A program that never answers: it writes its pid, then sleeps or blocks opening a FIFO
    nobody writes. (its path, its pid file)"""
    path.parent.mkdir(parents=True, exist_ok=True)
    pid = path.with_name(path.name + ".pid")
    if how == "fifo":
        fifo = path.with_name(path.name + ".fifo")
        os.mkfifo(fifo)
        body = f"read line < {fifo}\n"
    else:
        body = "exec sleep 1000\n"
    path.write_text(f"#!/bin/sh\necho $$ > {pid}\n{body}")
    path.chmod(0o755)
    return path, pid


def gone(pid_file: Path) -> bool:
    """The hung tool's process is no longer running (it was ended, not left behind)."""
    return proc.wait_gone([int(pid_file.read_text())], GENEROUS) == []


def mini_manifest(path: Path, archs: str, extra: str = "") -> Path:
    path.write_text(
        f'[qola]\nnamespace = "qk"\n[build]\narchitectures = ["{archs}"]\n'
        '\n[[modules]]\nname = "module_rmsnorm"\n' + extra
    )
    return path


# ---- knobs ----------------------------------------------------------------------------------------


def test_knobs_read_seconds_and_refuse_anything_else() -> None:
    assert deadlines.seconds(deadlines.PROBE, {}) == 120.0
    assert deadlines.seconds(deadlines.PROBE, {"QOLA_PROBE_TIMEOUT": " 2.5 "}) == 2.5
    assert deadlines.timeout(deadlines.LOCK, {}) is None
    assert deadlines.timeout(deadlines.PROBE, {"QOLA_PROBE_TIMEOUT": "inf"}) is None
    assert (
        deadlines.seconds(deadlines.GIT_NETWORK, {}) == 3600.0 and deadlines.seconds(deadlines.GIT_LOCAL, {}) == 600.0
    )
    for bad in ("0", "-1", "nan", "soon", "1e99"):
        with pytest.raises(QolaError) as info:
            deadlines.seconds(deadlines.GENERATOR, {"QOLA_GENERATOR_TIMEOUT": bad})
        assert "QOLA_GENERATOR_TIMEOUT" in info.value.message
    proc_ = run_qola("doctor", env={"QOLA_PROBE_TIMEOUT": "never"}, timeout=GENEROUS)
    assert proc_.returncode == 2 and "QOLA_PROBE_TIMEOUT='never'" in proc_.stderr and "Traceback" not in proc_.stderr


# ---- toolchain probes: build and doctor ---------------------------------------------------------


@pytest.mark.parametrize(("name", "variable", "how"), [("nvcc", "CUDACXX", "sleep"), ("hipcc", "HIPCC", "fifo")])
def test_doctor_reports_a_compiler_that_hangs_and_fails(tmp_path: Path, name: str, variable: str, how: str) -> None:
    tool, pid = hanging_tool(tmp_path / "bin" / name, how)
    done = run_qola("doctor", env={variable: str(tool), "QOLA_PROBE_TIMEOUT": "1"}, timeout=GENEROUS)
    assert done.returncode == 1, done.stdout + done.stderr
    line = next(ln for ln in done.stdout.splitlines() if str(tool) in ln or ("compiler" in ln and "broken" in ln))
    assert "broken" in line, done.stdout
    assert f"{tool} --version" in done.stdout and "no answer within 1 s" in done.stdout
    assert "QOLA_PROBE_TIMEOUT" in done.stdout and "broken" in done.stderr
    assert gone(pid)


def test_build_ends_a_hanging_compiler_probe_naming_it(tmp_path: Path) -> None:
    tool, pid = hanging_tool(tmp_path / "bin" / "nvcc")
    m = mini_manifest(tmp_path / "q.toml", "sm_90")
    out = tmp_path / "out"
    done = run_qola(
        "build",
        "--manifest",
        str(m),
        "--aiter-root",
        str(KERNELS),
        "-o",
        str(out),
        env={"CUDACXX": str(tool), "QOLA_PROBE_TIMEOUT": "1"},
        timeout=GENEROUS,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"{tool} --version" in done.stderr and "no answer within 1 s" in done.stderr
    assert "QOLA_PROBE_TIMEOUT" in done.stderr and "Traceback" not in done.stderr
    assert not (out / "manifest.json").exists()
    assert gone(pid)


def test_a_flag_probe_that_hangs_is_ended_too(tmp_path: Path) -> None:
    from qola.toolchain import host

    tool, pid = hanging_tool(tmp_path / "cc", "fifo")
    with pytest.raises(FailedProcessError) as info:
        host.run_capture([str(tool), "-fsome-flag"], {"PATH": "/usr/bin:/bin", "QOLA_PROBE_TIMEOUT": "1"})
    assert info.value.returncode == 124 and "no answer within 1 s" in info.value.message
    assert gone(pid)


# ---- doctor with an empty PATH ------------------------------------------------------------------


def test_doctor_with_an_empty_path_fails_with_a_clear_report() -> None:
    cxx = "/usr/bin/c++"
    if os.path.exists(cxx):
        alone = subprocess.run(
            [cxx, "-x", "c++", "-", "-o", os.devnull],
            input="int main(){}\n",
            env={"PATH": ""},
            capture_output=True,
            text=True,
            check=False,
        )
        if alone.returncode == 0:
            pytest.skip("this host's c++ builds a program without PATH")
    env = {k: v for k, v in os.environ.items() if k not in ("CXX", "PATH")}
    done = run_qola("doctor", env={**env, "PATH": ""}, whole_env=True, timeout=GENEROUS)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "PATH is empty" in done.stdout and "cannot build: " in done.stderr and "host C++" in done.stderr
    host = next(ln for ln in done.stdout.splitlines() if "host C++" in ln)
    assert host.split()[0] in ("broken", "missing"), done.stdout


def test_doctor_fails_when_the_host_compiler_cannot_link(tmp_path: Path) -> None:
    bad = tmp_path / "c++"
    bad.write_text("#!/bin/sh\necho \"c++: fatal error: cannot execute 'as'\" >&2\nexit 1\n")
    bad.chmod(0o755)
    done = run_qola("doctor", env={"CXX": str(bad)}, timeout=GENEROUS)
    assert done.returncode == 1
    assert "broken   host C++" in done.stdout and "cannot execute 'as'" in done.stdout
    assert "host C++ broken" in done.stderr


# ---- git ----------------------------------------------------------------------------------------


def test_a_git_that_hangs_is_ended_at_the_knob_deadline(tmp_path: Path) -> None:
    from qola.checkout import git

    tool, pid = hanging_tool(tmp_path / "bin" / "git")
    env = {"PATH": f"{tool.parent}{os.pathsep}/usr/bin:/bin", "QOLA_GIT_TIMEOUT": "1"}
    with pytest.raises(QolaError) as info:
        git.run(tmp_path, "status", env=env)
    assert "no answer within 1 s" in info.value.message and "QOLA_GIT_TIMEOUT" in (info.value.hint or "")
    assert gone(pid)


# ---- generators: a deadline, and output never held whole ---------------------------------------


def _job(tmp_path: Path, body: str) -> GenJob:
    from qola.compile.codegen import GenJob
    from qola.plan.planner import Generator

    script = tmp_path / "gen.py"
    script.write_text("import os, sys\nout = sys.argv[sys.argv.index('--output_dir') + 1]\n" + body)
    return GenJob("m", (Generator(f"{script} --output_dir {{}}"),))


def test_a_generator_past_its_deadline_is_ended_and_fails_its_module(tmp_path: Path) -> None:
    from qola.compile.codegen import run_generators

    pid = tmp_path / "gen.pid"
    job = _job(tmp_path, f"open({str(pid)!r}, 'w').write(str(os.getpid()))\nos.execvp('sleep', ['sleep', '1000'])\n")
    with pytest.raises(FailedProcessError) as info:
        run_generators(job, tmp_path / "gen", env={"PATH": os.environ["PATH"], "QOLA_GENERATOR_TIMEOUT": "1"})
    assert info.value.returncode == 124 and "no answer within 1 s" in info.value.message
    assert "QOLA_GENERATOR_TIMEOUT" in (info.value.hint or "")
    assert gone(pid)
    assert not (tmp_path / "gen" / "m" / "blob").exists()  # nothing half-generated


LOUD = (
    "chunk = ('x' * 1023 + '\\n') * 1024\n"
    "sys.stdout.write('HEAD-MARK\\n')\n"
    "for _ in range({mib}):\n    sys.stdout.write(chunk)\n"
    "sys.stdout.write('TAIL-MARK\\n')\nsys.stdout.flush()\n"
)


def test_a_generator_printing_200_mb_keeps_memory_bounded(tmp_path: Path) -> None:
    """Peak RSS of a process running one generator that prints 200 MiB (holding it whole took
    more than twice that). The peak is the process's own memory's (VmHWM), not ``ru_maxrss``: that
    one keeps the parent's peak across fork and exec, so inside a long pytest run it reported the
    test runner's 322 MiB, not the child's."""
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    body = LOUD.format(mib=200) + "open(os.path.join(out, 'k.cpp'), 'w').write('int k;\\n')\n"
    (job_dir / "gen.py").write_text("import os, sys\nout = sys.argv[sys.argv.index('--output_dir') + 1]\n" + body)
    child = (
        "import os, resource, sys\n"
        "from qola.compile.codegen import GenJob, run_generators\n"
        "from qola.plan.planner import Generator\n"
        f"job = GenJob('m', (Generator({str(job_dir / 'gen.py')!r} + ' --output_dir {{}}'),))\n"
        f"res = run_generators(job, __import__('pathlib').Path({str(tmp_path / 'gen')!r}), env=dict(os.environ))\n"
        "hwm = [ln for ln in open('/proc/self/status') if ln.startswith('VmHWM:')][0].split()[1]\n"
        "print(hwm, len(res.sources), flush=True)\n"
        "print(len(res.output), 'HEAD-MARK' in res.output[:4096], 'TAIL-MARK' in res.output[-4096:],\n"
        "      'qola cut' in res.output)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", child],
        capture_output=True,
        text=True,
        check=False,
        timeout=GENEROUS,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )
    rss_kib, sources = (int(x) for x in done.stdout.split("\n", 1)[0].split())
    assert sources == 1
    assert rss_kib < 150 * 1024, f"peak RSS {rss_kib >> 10} MiB while a generator printed 200 MiB"
    assert done.returncode == 0, done.stderr
    kept, *marks = done.stdout.split("\n")[1].split()
    assert int(kept) <= proc.LOG_KEEP + 4096
    assert marks == ["True", "True", "True"]  # head, tail, and a note of the cut


def test_a_loud_failing_generator_publishes_a_capped_log_with_head_and_tail(tmp_path: Path) -> None:
    import shutil

    tree = tmp_path / "kernels"
    shutil.copytree(KERNELS, tree, ignore=shutil.ignore_patterns("hsa"))
    (tree / "csrc" / "gen_loud.py").write_text("import sys\n" + LOUD.format(mib=64) + "sys.exit(3)\n")
    extra = (
        '\n[[modules]]\nname = "module_gen"\nsrcs = []\nblob_gen_cmd = ["csrc/gen_loud.py --output_dir {}"]\n'
        "is_python_module = false\n"
    )
    m = tmp_path / "q.toml"
    m.write_text('[qola]\nnamespace = "qk"\n[build]\narchitectures = ["sm_90"]\n' + extra)
    out = tmp_path / "out"
    done = run_qola(
        "build", "--manifest", str(m), "--aiter-root", str(tree), "-o", str(out), "--keep-going", timeout=GENEROUS
    )
    assert done.returncode == 1, done.stdout + done.stderr
    log = out / "logs" / "module_gen.log"
    assert 0 < log.stat().st_size < proc.LOG_KEEP + (1 << 20)
    text = log.read_text()
    assert "HEAD-MARK" in text and "TAIL-MARK" in text and "exit code 3" in text
    assert "qola cut" in text and "bytes" in text and "Traceback" not in done.stderr


def test_run_refuses_to_hold_more_than_its_capture_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(proc, "MAX_CAPTURE", 1 << 20)
    pid = tmp_path / "pid"
    argv = ["sh", "-c", f"echo $$ > {pid}; exec yes qola"]
    with pytest.raises(FailedProcessError) as info:
        proc.run_checked(argv)
    assert "printed more than 1 MiB; ended" in info.value.message
    assert gone(pid)
    done = proc.run(
        ["sh", "-c", "head -c 3000000 /dev/zero | tr '\\0' y; echo; echo END"], out=proc.Output(keep=1 << 20)
    )
    assert len(done.stdout) < (1 << 20) + 200 and done.stdout.startswith("yyy") and done.stdout.endswith("END\n")
    assert "qola cut" in done.stdout
    fed = proc.run(["cat"], input="z" * 300_000)  # input larger than a pipe, fed while output is read
    assert fed.stdout == "z" * 300_000


# ---- waits for locks: messages, deadlines, SIGTERM ---------------------------------------------


class Waiter:
    """A qola subprocess whose stderr lines arrive in a queue (read by a thread)."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.p = subprocess.Popen(
            qola_command(*argv),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **env},
            preexec_fn=default_dispositions,  # the signal it is sent is not one the test run ignores
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.p.stderr is not None
        for line in self.p.stderr:
            self.lines.put(line)
        self.lines.put(None)

    def wait_for(self, text: str) -> str:
        while True:
            line = self.lines.get(timeout=GENEROUS)
            assert line is not None, f"qola ended without saying {text!r}: {''.join(self.seen)}"
            self.seen.append(line)
            if text in line:
                return line

    def end(self, sig: int = signal.SIGTERM) -> int:
        self.p.send_signal(sig)
        try:
            return self.p.wait(GENEROUS)
        finally:
            if self.p.poll() is None:
                self.p.kill()


def test_build_waiting_for_a_held_build_dir_says_so_and_ends_on_sigterm(tmp_path: Path) -> None:
    m = mini_manifest(tmp_path / "q.toml", "sm_90")
    bdir, out = tmp_path / "bld", tmp_path / "out"
    bdir.mkdir()
    with lock.acquire({lock.build_lock_path(bdir): "the build dir"}, ["test", "holder"]):
        w = Waiter(
            [
                "build",
                "--manifest",
                str(m),
                "--aiter-root",
                str(KERNELS),
                "-o",
                str(out),
                "--build-dir",
                str(bdir),
                "--wait",
            ],
            {},
        )
        line = w.wait_for("waiting for the build dir")
        assert "test holder" in line and "SIGTERM" in line
        assert w.end() == 128 + signal.SIGTERM
    w.wait_for("terminated (signal 15)")
    assert not (out / "manifest.json").exists() and not (bdir / "build.ninja").exists()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_jit_prebuild_waiting_for_a_held_cache_lock_ends_on_a_signal(
    tmp_path: Path, jit_runtime: list[Path], sig: signal.Signals
) -> None:
    from support.jit_lib import make_lib

    from qola.jit import prebuild as pb
    from qola.jit.cache import JitCache

    lib = make_lib(tmp_path / "lib", jit_runtime)
    out = lib.root / "out"
    units = pb.select_units(pb.find_jit_dirs(out), lib.env)
    cache = JitCache(lib.cache)
    with cache.lock(units[0].key):
        w = Waiter(["jit", "prebuild", str(out), "-j", "2"], lib.env)
        w.wait_for("waiting for the JIT cache lock")
        assert w.end(sig) == 128 + sig
        w.wait_for(f"terminated (signal {int(sig)})")
    assert cache.entry(units[0].key).problem is not None  # the held unit was never built
    assert not [p for p in lib.cache.iterdir() if p.name.startswith(".") and p.is_file()], "temp files left"


def test_jit_prebuild_lock_wait_has_a_deadline(tmp_path: Path, jit_runtime: list[Path]) -> None:
    from support.jit_lib import make_lib

    from qola.jit import prebuild as pb
    from qola.jit.cache import JitCache

    lib = make_lib(tmp_path / "lib", jit_runtime)
    out = lib.root / "out"
    units = pb.select_units(pb.find_jit_dirs(out), lib.env)
    with JitCache(lib.cache).lock(units[0].key):
        done = run_qola("jit", "prebuild", str(out), env={**lib.env, "QOLA_LOCK_TIMEOUT": "1"}, timeout=GENEROUS)
    assert done.returncode != 0 and "waited 1 s for the JIT cache lock" in done.stdout + done.stderr
    assert "1 built" in done.stdout, done.stdout  # the other unit was not held up


@pytest.fixture(scope="module")
def jit_runtime(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    from support.jit_lib import build_runtime

    return build_runtime(tmp_path_factory.mktemp("jit-runtime-limits"))


def test_ninja_output_of_a_loud_compile_is_kept_bounded_per_module(tmp_path: Path) -> None:
    """A compile printing 48 MiB (and one endless line): the module's lines keep head and tail."""
    from qola.compile import ninja

    loud = tmp_path / "loud.py"
    loud.write_text(
        "import sys\nsys.stdout.write('HEAD-MARK\\n')\nchunk = ('w' * 1023 + '\\n') * 1024\n"
        "for _ in range(48):\n    sys.stdout.write(chunk)\nsys.stdout.write('v' * (8 << 20))\n"
        "sys.stdout.write('\\nTAIL-MARK\\n')\nsys.exit(1)\n"
    )
    (tmp_path / "build.ninja").write_text(
        f"rule cc\n  command = {sys.executable} {loud} $out\n  description = CC m $out\nbuild x.o: cc\n"
    )
    done = ninja.run(tmp_path, ninja.RunOptions(jobs=1, env=dict(os.environ), owner=lambda o: "m", targets=["x.o"]))
    assert done.returncode != 0 and done.failed_outputs == ["x.o"]
    lines = done.lines_by_module["m"]
    assert sum(len(x) + 1 for x in lines) < proc.LOG_KEEP + 4096
    assert any("HEAD-MARK" in x for x in lines[:5]) and "TAIL-MARK" in lines[-3:] + lines[-6:]
    assert any("qola cut" in x for x in lines)
    assert all(len(x) <= 1 << 16 for x in done.log)


def test_build_waiting_for_a_reader_of_its_output_dir_ends_on_sigterm(tmp_path: Path) -> None:
    """A publish waits for qola's readers of OUT (audit, package): said, and ended by SIGTERM with OUT
    as it was."""
    import shutil

    from qola.output import outdir

    tree = tmp_path / "kernels"
    shutil.copytree(KERNELS, tree, ignore=shutil.ignore_patterns("hsa"))
    (tree / "csrc" / "gen_fail.py").write_text("import sys\nprint('no recipe')\nsys.exit(3)\n")
    m = tmp_path / "q.toml"
    m.write_text(
        '[qola]\nnamespace = "qk"\n[build]\narchitectures = ["sm_90"]\n\n[[modules]]\nname = "module_gen"\n'
        'srcs = []\nblob_gen_cmd = ["csrc/gen_fail.py --output_dir {}"]\nis_python_module = false\n'
    )
    out = tmp_path / "out"
    argv = ["build", "--manifest", str(m), "--aiter-root", str(tree), "-o", str(out), "--keep-going"]
    assert run_qola(*argv, timeout=GENEROUS).returncode == 1  # a first published version (its module failed)
    before = (out / "manifest.json").read_bytes()
    with outdir.reading(out):
        w = Waiter(argv, {})
        w.wait_for(f"waiting for the output dir {out}")
        assert w.end() == 128 + signal.SIGTERM
    assert (out / "manifest.json").read_bytes() == before and not outdir.interrupted(out)


def test_a_hanging_hipconfig_beside_amdclang_is_ended(tmp_path: Path) -> None:
    """amdclang++ prints no HIP version: qola asks the hipconfig beside it, which hangs."""
    from qola.toolchain import hip

    root = tmp_path / "rocm"
    clang = root / "bin" / "amdclang++"
    clang.parent.mkdir(parents=True)
    clang.write_text("#!/bin/sh\necho 'AMD clang version 19.0.0'\n")
    clang.chmod(0o755)
    _, pid = hanging_tool(root / "bin" / "hipconfig", "fifo")
    with pytest.raises(FailedProcessError) as info:
        hip.read_version(str(clang), str(root), {"PATH": "/usr/bin:/bin", "QOLA_PROBE_TIMEOUT": "1"})
    assert "hipconfig --version" in info.value.message and "no answer within 1 s" in info.value.message
    assert gone(pid)


def test_a_generator_listing_its_instances_is_ended_at_the_deadline(tmp_path: Path) -> None:
    from qola.plan.planner import Generator
    from qola.plan.variants import list_blobs

    pid = tmp_path / "gen.pid"
    script = tmp_path / "gen.py"
    script.write_text(
        f"import os\nopen({str(pid)!r}, 'w').write(str(os.getpid()))\nos.execvp('sleep', ['sleep', '1000'])\n"
    )
    with pytest.raises(QolaError) as info:
        list_blobs(
            Generator(f"{script} --output_dir {{}}"), {"PATH": os.environ["PATH"], "QOLA_GENERATOR_TIMEOUT": "1"}
        )
    assert "no answer within 1 s" in info.value.message and "QOLA_GENERATOR_TIMEOUT" in (info.value.hint or "")
    assert gone(pid)
