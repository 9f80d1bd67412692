"""qola's own modules run by its ninja edges import the qola that wrote the graph, whatever the
edge's cwd and environment (qola.core.selfrun). ck-jit runs ``python -m qola.cli build`` with the
qola checkout as its cwd and no PYTHONPATH, from an interpreter where qola is not installed: every
host-only check edge (``python -m qola.compile.hostonly``, run by ninja from the build dir) failed
with "No module named 'qola'" and the build with it (found running ck-jit 617a89b's whole life)."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from pathlib import Path

from qola.compile import hostonly


def _no_qola_env() -> dict[str, str]:
    """An interpreter that finds qola's dependencies but not qola: ``-S`` skips site-packages' .pth
    files (the editable install), PYTHONPATH gives the packages back."""
    return {"PYTHONPATH": sysconfig.get_paths()["purelib"], "PATH": "/usr/bin:/bin"}


def test_the_host_only_check_edge_runs_from_the_build_dir_without_qola_installed(tmp_path: Path) -> None:
    wrapper = tmp_path / "python"
    wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} -S "$@"\n')
    wrapper.chmod(0o755)
    probe = subprocess.run([str(wrapper), "-c", "import qola"], cwd=tmp_path, env=_no_qola_env(), capture_output=True)
    assert probe.returncode != 0  # the premise: this interpreter, from this dir, has no qola
    (tmp_path / "unit.o").write_bytes(b"")  # a compiler wrapper's stub: no device code
    command = hostonly.rule(str(wrapper))["command"]
    command = command.replace("$module", "libm").replace("$in", "unit.o unit.cpp").replace("$out", "unit.o.hostonly")
    proc = subprocess.run(["/bin/sh", "-c", command], cwd=tmp_path, env=_no_qola_env(), capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "unit.o.hostonly").read_text() == "no device code\n"
