"""Issue 36 item 1, the setting added to show the mechanism: how long a build waits for another one
holding its build or output dir is one declaration (qola.core.settings.WAIT): ``--wait [SECONDS]``,
else ``QOLA_WAIT`` (for builds whose command line CMake writes: QoLA's clients, Transformer Engine),
else none: refused at once."""

from __future__ import annotations

from pathlib import Path

from support.common import KERNELS, run_qola

from qola.compile.layout import BuildLayout
from qola.core import lock


def test_qola_wait_waits_for_the_build_holding_the_dirs(tmp_path: Path) -> None:
    m = tmp_path / "q.toml"
    m.write_text('[qola]\nnamespace = "qk"\n[build]\narchitectures = ["sm_90"]\n[[modules]]\nname = "module_rmsnorm"\n')
    layout = BuildLayout(tmp_path / "out.build", tmp_path / "out")
    layout.root.mkdir()
    args = ("build", "--manifest", str(m), "--aiter-root", str(KERNELS), "-o", str(layout.out))
    with lock.acquire({layout.build_lock: f"the build dir {layout.root}"}, ["qola", "build", "(the test)"]):
        at_once = run_qola(*args, cwd=tmp_path)
        waited = run_qola(*args, cwd=tmp_path, env={"QOLA_WAIT": "0.3"})
        flag = run_qola(*args, "--wait", "0.2", cwd=tmp_path, env={"QOLA_WAIT": "0.3"})
        bad = run_qola(*args, cwd=tmp_path, env={"QOLA_WAIT": "soon"})
    assert at_once.returncode == 2 and "another qola build is using" in at_once.stderr, at_once.stderr
    assert "waited" not in at_once.stderr
    assert waited.returncode == 2 and "(waited 0.3 s)" in waited.stderr, waited.stderr
    assert flag.returncode == 2 and "(waited 0.2 s)" in flag.stderr, flag.stderr  # the command line beats it
    assert bad.returncode == 2 and "environment variable QOLA_WAIT: takes seconds, got 'soon'" in bad.stderr
    assert "Traceback" not in bad.stderr
