"""manifest.json's module records are one typed value (issue 43 item 4): the publish writes a
:class:`~qola.output.record.ModuleRecord` in the JSON form it always had, and every reader parses
it back the same way: a damaged entry is a problem the audit names (never skipped, never a path read
outside the output)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from qola.compile.results import ModuleResult, Status
from qola.core.errors import QolaError
from qola.output.checks import audit_output
from qola.output.record import FileRecord, ModuleRecord

SHA = "ab" * 32
NAMES = {"count": 2, "sha256": hashlib.sha256(b"a\nb").hexdigest(), "names": ["a", "b"]}


def test_a_record_keeps_its_json_form() -> None:
    r = ModuleResult("m", "md_m", "cpp_itfs", "shared", Status.BUILT, 3, 2, ("b", "a"), Path("/b/md_m.so"),
                     1.23456, exports=("qola::te::f",), warnings=("w",))  # fmt: skip
    got = ModuleRecord.of(r, {"lib/md_m.so": FileRecord(SHA, 7)}, {"jit": {"dir": "jit/md_m"}}).to_json()
    assert got == {
        "name": "m", "md_name": "md_m", "mode": "cpp_itfs", "link": "shared", "status": "built", "sources": 3,
        "generated": 2, "duration_s": 1.235, "log": "logs/m.log", "warnings": ["w"], "artifact": "lib/md_m.so",
        "size": 7, "sha256": SHA, "exports": ["qola::te::f"], "success": True, "so_path": "lib/md_m.so", "error": "",
        "jit": {"dir": "jit/md_m"}, "instances": NAMES,
    }  # fmt: skip
    failed = ModuleRecord.of(ModuleResult("m", "md_m", "cpp_itfs", "shared", Status.FAILED, error="boom"), {})
    assert {k: v for k, v in failed.to_json().items() if k != "instances"} == {
        "name": "m", "md_name": "md_m", "mode": "cpp_itfs", "link": "shared", "status": "failed", "sources": 0,
        "generated": 0, "duration_s": 0.0, "log": "logs/m.log", "warnings": [], "artifact": None,
        "success": False, "so_path": None, "error": "boom",
    }  # fmt: skip
    back = ModuleRecord.parse(json.loads(json.dumps(got)))
    assert back.artifact == "lib/md_m.so" and back.exports == ("qola::te::f",) and back.jit_dir() == "jit/md_m"
    old = ModuleRecord.parse({"name": "m", "status": "built", "artifact": "lib/m.so"})  # an older qola's
    assert old.success and old.exports is None and old.size is None


@pytest.mark.parametrize(
    ("entry", "problem"),
    [
        ({"exports": "qola::te::f"}, "exports is 'qola::te::f', not a list"),
        ({"artifact": "/etc/passwd"}, "artifact '/etc/passwd' is not inside the output"),
        ({"artifact": "lib/../../x.so"}, "is not inside the output"),
        ({"size": "7"}, "size is '7', not a int"),
    ],
)
def test_the_audit_names_a_damaged_module_record(tmp_path: Path, entry: dict[str, object], problem: str) -> None:
    out = tmp_path / "out"
    (out / "lib").mkdir(parents=True)
    module = {"name": "m", "status": "built", "artifact": "lib/m.so", "sha256": SHA, "exports": []} | entry
    (out / "manifest.json").write_text(json.dumps({"namespace": "te", "modules": [module]}))
    _, problems, _ = audit_output(out)
    assert any(problem in p and "'m'" in p for p in problems), problems
    with pytest.raises(QolaError, match="not an object"):
        ModuleRecord.parse(["m"])
