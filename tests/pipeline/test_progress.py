"""Issue 32, item 1: progress that works everywhere. Without a terminal (a CI log, CMake's
execute_process) a build prints a plain line at each module's end and at least every 30 s (done/total,
the phase, the unit running longest, the time since it began); ``--quiet`` silences it; a terminal's
bar names the real phase (never "generating" for a module without a generator).

The 30 s rule is driven by a fake clock: no test sleeps or depends on timing.
"""

from __future__ import annotations

import io
import os
import subprocess
from pathlib import Path
from subprocess import CompletedProcess
from typing import cast

from support.common import run_qola
from support.fake_nvcc import fake_nvcc, make_tree

from qola.commands.build import RichReporter
from qola.pipeline.progress import EVERY, PlainProgress, running_units


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_plain_lines_every_30_s_and_at_each_module_end() -> None:
    clock, lines = Clock(), cast(list[str], [])
    running = [("fmha_fwd_d128-0123.o", 25.0), ("tiny-4567.o", 3.0)]
    p = PlainProgress(lines.append, clock=clock, running=lambda: running)
    p.phase("compiling")
    assert lines == ["qola: compiling, 0 s"]
    p.status(1, 40, "CC module_a x.cu")
    clock.now += EVERY - 1
    p.tick()
    assert len(lines) == 1  # not yet 30 s of silence
    clock.now += 1
    p.tick()
    assert lines[-1] == "qola: [1/40] compiling, 2 running, longest running: fmha_fwd_d128-0123.o (25 s), 30 s"
    p.tick()
    assert len(lines) == 2  # said once per 30 s
    clock.now += 5
    p.status(7, 40, "LINK module_a lib/qk_module_a.so")
    assert lines[-1] == "qola: [7/40] module_a done, 35 s"
    clock.now += EVERY
    p.status(8, 40, "CC module_b y.cu")  # a status line after 30 s of no line also says where it is
    assert lines[-1].startswith("qola: [8/40] compiling, 2 running")


def test_running_units_reads_the_compiles_of_this_process_children(tmp_path: Path) -> None:
    obj = tmp_path / "unit-abc.o"
    # a child that waits on its stdin with `-o <obj>` on its command line (Popen returns after its exec)
    child = subprocess.Popen(["sh", "-c", "read x", "sh", "-o", str(obj)], stdin=subprocess.PIPE)
    try:
        names = dict(running_units())
        assert "unit-abc.o" in names and names["unit-abc.o"] >= 0
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait()
    assert "unit-abc.o" not in dict(running_units())


def test_terminal_bar_names_the_phase_not_generating() -> None:
    from rich.console import Console

    console = Console(file=io.StringIO(), force_terminal=True)
    r = RichReporter(False, console=console)
    with r.running(False):
        assert r.progress.tasks[0].description == "starting"
        r.phase("compiling")
        assert r.progress.tasks[0].description == "compiling"


def _build(tmp_path: Path, *extra: str) -> CompletedProcess[str]:
    tree = make_tree(tmp_path / "tree")
    m = tmp_path / "q.toml"
    m.write_text(
        '[qola]\nnamespace = "qk"\n[build]\narchitectures = ["sm_90"]\n'
        '[[modules]]\nname = "module_tiny"\nsrcs = ["csrc/tiny/tiny.cu"]\nis_python_module = false\n'
    )
    env = {"CUDACXX": str(fake_nvcc(tmp_path / "nvcc"))}
    args = ["build", "-m", str(m), "-a", str(tree), "-o", str(tmp_path / "out"), *extra]
    return run_qola(*args, env=env, cwd=tmp_path)


def test_piped_build_prints_plain_progress_lines(tmp_path: Path) -> None:
    proc = _build(tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "qola: compiling, " in proc.stderr  # the phase, said when it starts
    assert "module_tiny done" in proc.stderr  # the module's end, with done/total
    assert "generating" not in proc.stderr  # no generator: never said


def test_quiet_silences_progress(tmp_path: Path) -> None:
    proc = _build(tmp_path, "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert "module_tiny done" not in proc.stderr and "qola: compiling" not in proc.stderr
    assert (tmp_path / "out" / "lib").is_dir()
    assert os.path.exists(tmp_path / "out" / "manifest.json")
