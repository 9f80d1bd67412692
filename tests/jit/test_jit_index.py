"""``OUT/jit/<module>/index.json`` is read back as one typed value (issue 43 item 4):
:func:`qola.jit.layout.read_index` gives a :class:`qola.jit.schema.JitIndex` the checks read by
attribute; a damaged file is one QolaError naming the key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qola.core.errors import QolaError
from qola.jit import format as fmt
from qola.jit.layout import read_index
from qola.jit.schema import IndexUnit, JitIndex

HEX = "0" * 64
UNIT = {"name": "u1", "source": "src/u1.cu", "source_sha256": HEX, "entry_symbol": "qola_u1", "content_key": HEX,
        "functions": ["void f()"], "key": HEX}  # fmt: skip
INDEX = {
    "format": fmt.INDEX_FORMAT, "version": fmt.INDEX_VERSION, "module": "m", "lang": "hip", "arch": "gfx942",
    "style": "generic", "compiler": {"path": "/opt/rocm/bin/hipcc", "identity": HEX, "version": "6"},
    "headers": {"bundle": fmt.BUNDLE, "sha256": HEX, "digest": HEX, "files": 1}, "flags": ["-O3"], "units": [UNIT],
}  # fmt: skip


def write(tmp: Path, data: object) -> Path:
    (tmp / fmt.INDEX).write_text(json.dumps(data))
    return tmp


def test_the_index_reads_back_typed(tmp_path: Path) -> None:
    got = read_index(write(tmp_path, INDEX))
    assert got == JitIndex("m", "hip", "gfx942", "/opt/rocm/bin/hipcc", HEX, fmt.BUNDLE, HEX, ("-O3",),
                           {"u1": IndexUnit("u1", "src/u1.cu", HEX, "qola_u1", HEX)})  # fmt: skip


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        ({"units": [UNIT, UNIT]}, "unit u1 is listed twice"),
        ({"units": [{**UNIT, "source": "../x.cu"}]}, "units[0].source"),
        ({"compiler": {"path": "/cc"}}, "missing key compiler.identity"),
    ],
)
def test_a_damaged_index_is_one_error(tmp_path: Path, damage: dict[str, object], message: str) -> None:
    with pytest.raises(QolaError, match=message.replace("[", r"\[").replace(".", r"\.")):
        read_index(write(tmp_path, {**INDEX, **damage}))
