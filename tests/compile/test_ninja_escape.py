"""Issue 51: every path written into ``build.ninja`` is escaped by ninja's rules (``$`` as ``$$``; in a
build line also space and colon), qola's own paths too: the interpreter, the package dir a check or
archive step imports qola from, the wrapper and runtime sources it compiles. Unescaped, ``$x`` in
``/opt/q$x/`` is read as a ninja variable (empty) and the path silently names another file."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from ninja import BIN_DIR
from support.common import KERNELS, REPO, qola_command

from qola.compile import ninja

ODD = "q$x $y-z:w"  # a ninja variable, a '$' before a non-name, a space and a colon


def _ninja(build_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [os.path.join(BIN_DIR, "ninja"), "-C", str(build_dir), *args], capture_output=True, text=True, timeout=60
    )


def test_rule_commands_build_lines_and_command_variables_keep_a_dollar_path(tmp_path: Path) -> None:
    odd = tmp_path / ODD
    odd.mkdir()
    tool = odd / "copy"  # a program under the odd dir, as sys.executable or a compiler may be
    tool.write_text('#!/bin/sh\ncat "$1" > "$2"\n')
    tool.chmod(0o755)
    src = odd / "a.cu"
    src.write_text("int x;\n")
    graph = ninja.Graph(
        rules={
            "cc": {"command": ninja.command_template([str(tool), "$in", "$out"])},
            "archive": {"command": "$archive_cmd"},
        },
        variables={"flags_m": "-O3"},
        targets=(
            ninja.Target(
                "m",
                "lib/m.a",
                (ninja.Compile(str(src), "obj/m/a.o", "flags_m"),),
                "archive",
                variables=(("archive_cmd", ninja.command_variable([[str(tool), "obj/m/a.o", str(odd / "m.a")]])),),
            ),
        ),
    )
    ninja.write(graph, tmp_path / "build.ninja")
    done = _ninja(tmp_path)
    assert done.returncode == 0, done.stdout
    assert (tmp_path / "obj" / "m" / "a.o").read_text() == "int x;\n"
    assert (odd / "m.a").read_text() == "int x;\n"


def test_qola_installed_under_a_dollar_path_writes_its_own_paths_escaped(tmp_path: Path) -> None:
    """qola's package and its interpreter under ``q$x $y-z``: the static archive step that runs
    ``python -c '…sys.path.insert(0, <qola dir>)…'`` and the wrapper source from qola's templates reach
    ninja as they are (ninja -n finds every input; ``ninja -t commands`` shows the real paths)."""
    home = tmp_path / ODD.replace(":", "")  # PYTHONPATH splits at ':'
    shutil.copytree(REPO / "qola", home / "qola", ignore=shutil.ignore_patterns("__pycache__"))
    python = home / "bin" / "python"
    python.parent.mkdir()
    python.symlink_to(sys.executable)
    m = tmp_path / "q.toml"
    m.write_text(
        '[qola]\nnamespace = "qk"\n[build]\narchitectures = ["sm_90"]\nlink = "static"\nmode = "cpp_itfs"\n'
        '[[modules]]\nname = "libattn_fwd"\n'
    )
    argv = qola_command("build", "--manifest", m, "--aiter-root", KERNELS, "-o", tmp_path / "out", "--dry-run")
    env = {**os.environ, "PYTHONPATH": str(home)}
    done = subprocess.run([str(python), *argv[1:]], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert done.returncode == 0 and "ninja: error" not in done.stderr, done.stderr
    build = tmp_path / "out.build"
    assert _ninja(build, "-n").returncode == 0
    commands = _ninja(build, "-t", "commands", "lib/qk_libattn_fwd.a").stdout
    archive = shlex.split(commands.splitlines()[-1])  # the archive step, as the shell reads it
    assert str(python) in archive and f"sys.path.insert(0, {str(home)!r})" in " ".join(archive), archive
    assert str(home / "qola" / "templates") in commands  # the wrapper, compiled from qola's own dir
