"""Issue 51: a kernel tree that is not there is refused naming the setting that gave its path (an
environment variable, the manifest's key) and how to change that one."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.common import run_qola


@pytest.mark.parametrize(
    ("given", "named"),
    [
        ({"NVTE_AITER_SOURCE_DIR": "{gone}"}, "NVTE_AITER_SOURCE_DIR"),
        ({"QOLA_AITER_SOURCE_DIR": "{gone}"}, "QOLA_AITER_SOURCE_DIR"),
        ({}, "[qola].aiter_root"),
    ],
)
def test_a_missing_tree_is_refused_naming_the_setting_that_named_it(
    tmp_path: Path, given: dict[str, str], named: str
) -> None:
    """Issue 51: the refusal names where the path came from (a variable, the manifest's key) and how
    to change that, not only "pass --aiter-root"."""
    gone = tmp_path / "nope"
    m = tmp_path / "q.toml"
    root = "" if given else 'aiter_root = "nope"\n'
    m.write_text(
        f'[qola]\nnamespace = "qk"\n{root}[build]\narchitectures = ["sm_90"]\n[[modules]]\nname = "module_softmax"\n'
    )
    env = {k: v.format(gone=gone) for k, v in given.items()}
    env = {"QOLA_AITER_SOURCE_DIR": "", "NVTE_AITER_SOURCE_DIR": "", **env}
    proc = run_qola("plan", "--manifest", str(m), env=env)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert f"kernel tree '{gone}' (from {named}) does not exist or is not a directory" in proc.stderr, proc.stderr
    assert f"hint: {'set' if given else 'fix'} {named}" in proc.stderr, proc.stderr
