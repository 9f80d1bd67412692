"""The portable-line rule (issue 39, qola/toolchain/portable.py): a compile line names no file the
compiler writes or reads by name in or relative to the build dir, so a client that records its flags
(ck-jit) can run them later from another directory; the graph writer refuses any line that does."""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path

import pytest
from support.common import EXAMPLES, KERNELS, run_qola

from qola.compile import ninja
from qola.core.errors import QolaError
from qola.toolchain import portable

BUILD = "/w/out.build"
CC = {"command": "hipcc $flags -MD -c $in -o $out", "depfile": ninja.DEPFILE, "deps": "gcc"}  # a compile rule


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["-MD", "-MF", "obj/m/a-1.o.d"], "-MF obj/m/a-1.o.d"),  # qola's line before issue 39
        (["-MD", "-MF", "$out.d"], "-MF $out.d"),  # the same, as a rule template
        (["-MF/w/out.build/obj/a.d"], "-MF/w/out.build/obj/a.d"),
        (["-MT", "obj/a.o"], "-MT"),
        (["-MJ", "cc.json"], "-MJ cc.json"),
        (["-Wa,--MD,obj/a.d"], "-Wa,--MD,obj/a.d"),
        (["-Wp,-MD,/w/out.build/a.d"], "-Wp,-MD,/w/out.build/a.d"),
        (["-include", "qola_config.h"], "-include qola_config.h"),
        (["-include", "/w/out.build/include/qola_config.h"], "-include /w/out.build/include/qola_config.h"),
        (["-imacros/w/out.build/m.h"], "-imacros/w/out.build/m.h"),
        (["@flags.rsp"], "@flags.rsp"),
        (["-fprofile-use=a.prof"], "-fprofile-use=a.prof"),
        (["-Iinclude"], "-Iinclude"),
        (["-isystem", "gen"], "-isystem gen"),
    ],
)
def test_a_flag_naming_the_build_dir_is_a_violation(argv: list[str], flag: str) -> None:
    found = portable.violations(["hipcc", *argv, "-c", "$in", "-o", "$out"], BUILD)
    assert [v.flag for v in found] == [flag], found


def test_what_replays_anywhere_passes() -> None:
    line = ["hipcc", "-O3", "-MD", "-I/tree/csrc/include", "-isystem", "/opt/rocm/include", "-I/w/out.build/include",
            "-include", "/tree/pre.h", "-ffile-prefix-map=/w/out.build=/qola/build", "-fprofile-use", "-O2",
            "-Wa,-mno-x86-used-note", "--offload-arch=gfx942", "-x", "hip", "-c", "$in", "-o", "$out"]  # fmt: skip
    assert portable.violations(line, BUILD) == []
    assert (
        portable.depfile_of("obj/m/a-0f.o") == "obj/m/a-0f.d" and portable.depfile_of(".qola-out/o") == ".qola-out/o.d"
    )


def test_the_graph_writer_refuses_a_line_that_would_not_replay(tmp_path: Path) -> None:
    target = ninja.Target("m", "lib/m.so", (ninja.Compile("/t/a.cu", "obj/m/a.o", "flags_m"),), "link")
    bad = ninja.Graph({"cc": CC}, {"flags_m": ninja.escape_flags(["-O3", "-include", "gen/m/pre.h"])}, (target,))
    with pytest.raises(QolaError) as info:
        ninja.write(bad, tmp_path / "build.ninja")
    assert "flags_m: '-include gen/m/pre.h'" in str(info.value) and "docs/design-notes.md" in str(info.value)
    assert not (tmp_path / "build.ninja").exists()
    good = ninja.Graph({"cc": CC}, {"flags_m": ninja.escape_flags(["-O3", "-I/t/include"])}, (target,))
    ninja.write(good, tmp_path / "build.ninja")
    assert "dep = obj/m/a.d" in (tmp_path / "build.ninja").read_text()


@pytest.mark.cli
def test_every_compile_line_of_a_real_graph_is_portable(tmp_path: Path) -> None:
    """The example tree's whole graph (pybind modules, cpp_itfs, embedding, JIT runtime) as ninja
    expands it: no line names a depfile or another file of the build dir; ninja's header tracking
    still works (each edge's depfile is the one the compiler writes beside the object)."""
    out = tmp_path / "out"
    proc = run_qola("build", "-m", str(EXAMPLES / "quickstart.toml"), "-a", str(KERNELS), "-o", str(out), "--dry-run")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    build = Path(str(out) + ".build")
    compdb = subprocess.run(["ninja", "-C", str(build), "-t", "compdb"], capture_output=True, text=True, check=True)
    units = [u for u in json.loads(compdb.stdout) if " -c " in u["command"]]
    assert len(units) > 20
    for u in units:
        argv = shlex.split(u["command"])
        assert portable.violations(argv, str(build)) == [], u["command"]
        assert "-MF" not in argv and "-MT" not in argv, u["command"]
    text = (build / "build.ninja").read_text()
    assert "depfile = $dep" in text and "$out.d" not in text


def test_the_switch_probe_is_the_one_build_dir_read_a_line_may_name(tmp_path: Path) -> None:
    """qola's switch probe (qola/output/kernels.py) is force-included from the build dir into a library's
    entry-point source only; the graph names it (``Target.entry_reads``) and the writer lets that exact
    file pass. The same flag naming any other build-dir file is refused."""
    probe = f"{tmp_path}/obj/m/qola_switches_0.h"
    compiles = (ninja.Compile("/t/mha_fwd.cu", "obj/m/mha_fwd.o", "flags_m", ("-include", probe)),)
    variables = {"flags_m": ninja.escape_flags(["-O3"])}
    named = ninja.Target("m", "lib/m.so", compiles, "link", entry_reads=(probe,))
    ninja.write(ninja.Graph({"cc": CC}, variables, (named,)), tmp_path / "build.ninja")
    unnamed = ninja.Target("m", "lib/m.so", compiles, "link")
    with pytest.raises(QolaError, match=r"qola_switches_0\.h"):
        ninja.write(ninja.Graph({"cc": CC}, variables, (unnamed,)), tmp_path / "other.ninja")
