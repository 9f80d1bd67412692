"""ninja's targets past the OS's limit on a whole command line (issue 51 item 2): qola names one target
per module (``module_<name>``), and a plan of tens of thousands of modules made ``ninja -C … module_a
module_b …`` fail with "Argument list too long". Past :data:`qola.core.argfile.THRESHOLD` the targets
go by file: a manifest that includes ``build.ninja`` and names them as one phony target (ninja reads
no target list from a file)."""

from __future__ import annotations

import os
from pathlib import Path

from support.argv_gen import ARG_MAX, many_names

from qola.compile import ninja


def test_ninja_builds_targets_ten_times_the_command_line_limit(tmp_path: Path) -> None:
    names = many_names("module_")
    assert sum(len(n) + 1 for n in names) >= 10 * ARG_MAX
    real = [f"out_{i}" for i in range(3)]
    lines = ["rule touch", "  command = touch $out", "  description = GEN m $out"]
    lines += [f"build {o}: touch" for o in real]
    lines += [f"build {n}: phony {real[i % len(real)]}" for i, n in enumerate(names)]
    (tmp_path / "build.ninja").write_text("\n".join(lines) + "\n")
    seen: list[int] = []
    how = ninja.RunOptions(
        jobs=2, env=dict(os.environ), owner=lambda o: "m", targets=names, on_status=lambda d, t, s: seen.append(t)
    )
    done = ninja.run(tmp_path, how)
    assert done.returncode == 0, done.log[-5:]
    assert all((tmp_path / o).is_file() for o in real) and seen == [3, 3, 3]
