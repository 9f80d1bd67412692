"""The toolchain's hints name only what `qola build` accepts (issue 11 item 6, moved from
tests/pipeline/test_refused_before_work.py)."""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path

import pytest
from support.fake_nvcc import fake_nvcc

from qola import cli
from qola.core.errors import QolaError
from qola.toolchain import cuda, hip
from qola.toolchain.versions import check_accepted


def _build_options() -> set[str]:
    parser = cli._parser(("build",))
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {o for a in sub.choices["build"]._actions for o in a.option_strings}


def test_toolchain_hints_name_only_options_qola_build_takes(tmp_path: Path) -> None:
    hints = [cuda.INSTALL_HINT, hip.INSTALL_HINT]
    for kind in ("cuda", "hip"):
        with pytest.raises(QolaError) as info:
            check_accepted(kind, "/opt/x/bin/cc", ["12.4"], ["13.0"])
        hints.append(info.value.hint or "")
    with pytest.raises(QolaError) as info:  # the compiler cannot target the arch
        cuda.find_cuda(
            ["sm_120"],
            env={"PATH": os.environ["PATH"]},
            accepted_versions=None,
            cache_dir=tmp_path,
            compiler=str(fake_nvcc(tmp_path / "nvcc")),
        )
    hints.append(info.value.hint or "")
    accepted = _build_options()
    for hint in hints:
        for opt in re.findall(r"(?<![\w-])--?[a-z][a-z-]*", hint):
            assert opt in accepted, f"hint suggests {opt}, which qola build does not take: {hint}"
    assert "CUDACXX" in cuda.INSTALL_HINT and "HIPCC" in hip.INSTALL_HINT
