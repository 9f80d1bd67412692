"""A write that fails for want of space names the file (issue 51, 5): ENOSPC from write or fsync came
out as "[Errno 28] No space left on device" with no path."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from qola.core import fsutil


def test_enospc_while_writing_names_the_path_and_leaves_no_temp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    target = tmp_path / "out" / "manifest.json"
    with pytest.raises(OSError) as got:
        fsutil.atomic_write(target, b"{}")
    assert got.value.errno == errno.ENOSPC and got.value.filename == str(target) and str(target) in str(got.value)
    assert os.listdir(target.parent) == []
