"""A generator run at build time with a ``--filter`` 10× the OS's one-argument limit (issue 51 item
2; a ``[usage]`` set of thousands of kernels): its argv goes by file past a threshold
(:func:`qola.core.argfile.passed`), read back by qola's recorder, and the run writes what the filter
selects; a second run is skipped (the stamp does not depend on the file's temporary path)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from support.argv_gen import ONE_ARG_MAX, argv_generator, huge_filter

from qola.compile.codegen import GenJob, run_generators
from qola.plan.listing import shim


def test_a_generator_run_with_a_filter_ten_times_the_limit(tmp_path: Path) -> None:
    gen, env, seen = argv_generator(tmp_path)
    for kept, sep, wrapper in (("k_a", ",", None), ("k_c", "|", str(shim()))):
        filt = huge_filter(kept, sep)
        assert len(filt) >= 10 * ONE_ARG_MAX
        job = GenJob("m", (dataclasses.replace(gen, filter=filt, wrapper=wrapper),))
        done = run_generators(job, tmp_path / f"build{sep}", env=env)
        assert sorted(Path(s).stem for s in done.sources) == [kept] and not done.skipped
        args = json.loads(seen.read_text())
        assert args[args.index("--filter") + 1] == filt
        assert run_generators(job, tmp_path / f"build{sep}", env=env).skipped
