"""A static archive's objects past the OS's limits (issue 51 item 2): ninja runs every command as one
argument (``/bin/sh -c``), so a module's object list on the archive line would end at 128 KiB
(``MAX_ARG_STRLEN``). The objects go by response file (``ld -r @objs.rsp``, :func:`qola.compile.link.archive_steps`,
the command isolation's archive edge runs): here 10× that limit of object paths, through ninja."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from support.argv_gen import ONE_ARG_MAX, many_names

from qola.compile import link, ninja
from qola.hooks.isolation import RULES

CXX = shutil.which("g++") or shutil.which("c++") or ""
pytestmark = pytest.mark.skipif(not (CXX and shutil.which("ld") and shutil.which("ar")), reason="needs binutils, g++")


def test_an_archive_of_objects_ten_times_the_one_argument_limit(tmp_path: Path) -> None:
    (tmp_path / "a.cpp").write_text('extern "C" int qk_answer() { return 42; }\nint hidden_helper() { return 1; }\n')
    (tmp_path / "b.cpp").write_text("static int only_here() { return 1; }\nint (*const keep)() = only_here;\n")
    for name in ("a", "b"):
        subprocess.run([CXX, "-fPIC", "-c", f"{name}.cpp", "-o", f"{name}.o"], cwd=tmp_path, check=True)
    (tmp_path / "objs").mkdir()
    copies = [tmp_path / "objs" / f"{n}.o" for n in many_names("b_", size=10 * ONE_ARG_MAX)]
    for c in copies:  # the same object (no global symbol) linked thousands of times
        os.link(tmp_path / "b.o", c)
    objs = [tmp_path / "a.o", *copies]
    assert sum(len(os.fsencode(o)) + 1 for o in objs) >= 10 * ONE_ARG_MAX
    out = tmp_path / "lib" / "libm.a"
    steps, rsp, text = link.archive_steps(objs, out, "qk", tmp_path / "work")
    (tmp_path / "work").mkdir()
    rsp.write_text(text)
    cmd = (("archive_cmd", ninja.command_variable(steps)),)
    target = ninja.Target("m", str(out), (), "archive", extra_inputs=tuple(map(str, objs)), variables=cmd)
    ninja.write(ninja.Graph(rules=RULES, variables={}, targets=(target,)), tmp_path / "build.ninja")
    how = ninja.RunOptions(jobs=1, env=dict(os.environ), owner=lambda o: "m", targets=["module_m"])
    done = ninja.run(tmp_path, how)
    assert done.returncode == 0, done.log[-5:]
    symbols = subprocess.run(["nm", str(out)], capture_output=True, text=True, check=True).stdout
    assert " T qk_answer" in symbols and " t _Z13hidden_helperv" in symbols  # exported; made local
    assert symbols.count(" t _ZL9only_herev") == len(copies)  # every copy is in the member
