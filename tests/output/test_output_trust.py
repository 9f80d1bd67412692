"""What an output says about itself widens no check and runs nothing (issue 23): a manifest.json
key cannot whitelist an export, and ``qola audit --reproduce`` never runs a recorded compiler nor
passes on a recorded variable that makes a program run something (LD_PRELOAD, NVCC_PREPEND_FLAGS,
a CK_DIR whose generate.py would run); data-only variables (SOURCE_DATE_EPOCH, AITER's tuned-config
paths, what the tree's own table reads) are set again as recorded."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from support.repro import recorded_build

from qola.output.checks import check_module
from qola.output.record import ModuleRecord
from qola.pipeline.reproduce import rebuild_env

LIB = """\
namespace qola { namespace te { int f() { return 1; } } }
extern "C" __attribute__((visibility("default"))) void* evil_malloc(unsigned long n) { return nullptr; }
"""


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_a_record_cannot_whitelist_an_export(tmp_path: Path) -> None:
    src = tmp_path / "lib.cpp"
    src.write_text(LIB)
    so = tmp_path / "lib" / "te_libx.so"
    so.parent.mkdir()
    subprocess.run(["g++", "-shared", "-fPIC", "-o", str(so), str(src)], check=True)
    digest = hashlib.sha256(so.read_bytes()).hexdigest()
    module = {
        "name": "libx",
        "artifact": "lib/te_libx.so",
        "sha256": digest,
        "size": so.stat().st_size,
        "mode": "cpp_itfs",
        "allowed_extra": ["evil_malloc"],
    }
    problems = check_module(tmp_path, ModuleRecord.parse(module), "te")
    assert any("evil_malloc" in p and "leak" in p for p in problems), problems


def tree(tmp: Path) -> Path:
    root = tmp / "tree"
    (root / "aiter" / "jit").mkdir(parents=True, exist_ok=True)
    (root / "aiter" / "jit" / "optCompilerConfig.json").write_text(
        json.dumps({"m": {"flags_extra_hip": ['f\'-DX={os.environ.get("QK_TILE", "64")}\'']}})
    )
    return root


def test_reproduce_sets_data_only_variables_and_names_the_rest(tmp_path: Path) -> None:
    settings: dict[str, Any] = {
        "env_keys": [
            "LD_PRELOAD",
            "NVCC_PREPEND_FLAGS",
            "CK_DIR",
            "QK_TILE",
            "SOURCE_DATE_EPOCH",
            "AITER_CONFIG_GEMM",
            "PYTHONSTARTUP",
            "HIPCC",
        ],
        "env": {
            "LD_PRELOAD": "/tmp/evil.so",
            "NVCC_PREPEND_FLAGS": "-Xcompiler -fplugin=/tmp/evil.so",
            "CK_DIR": "/tmp/evil-ck",
            "QK_TILE": "128",
            "SOURCE_DATE_EPOCH": "1700000000",
            "AITER_CONFIG_GEMM": "/data/gemm.csv",
            "PYTHONSTARTUP": "/tmp/evil.py",
            "HIPCC": "/tmp/evil-hipcc",
        },
    }
    data = {"toolchain": {"kind": "hip", "compiler": "/tmp/evil-hipcc"}}
    here = {"PATH": "/usr/bin:/bin", "AITER_CONFIG_OTHER": "/x.csv", "SOURCE_DATE_EPOCH": "1"}
    env, notes = rebuild_env(data, recorded_build(settings), here, str(tree(tmp_path)))
    # data: as recorded
    assert env["SOURCE_DATE_EPOCH"] == "1700000000" and env["QK_TILE"] == "128"
    assert env["AITER_CONFIG_GEMM"] == "/data/gemm.csv" and "AITER_CONFIG_OTHER" not in env
    # what runs something: never from the record, each named in a note
    for key in ("LD_PRELOAD", "NVCC_PREPEND_FLAGS", "CK_DIR", "PYTHONSTARTUP", "HIPCC"):
        assert key not in env, key
        assert any(n.startswith(f"manifest.json records {key}=") and "not applied" in n for n in notes), (key, notes)
    assert env["PATH"] == "/usr/bin:/bin" and "CUDACXX" not in env  # the compiler is found as for any build
    # a SOURCE_DATE_EPOCH that is not a plain number is not data
    settings["env"]["SOURCE_DATE_EPOCH"] = "$(touch /tmp/x)"
    env, notes = rebuild_env(data, recorded_build(settings), {}, str(tree(tmp_path)))
    assert "SOURCE_DATE_EPOCH" not in env and any("SOURCE_DATE_EPOCH" in n for n in notes)


def test_reproduce_reads_the_build_entry_back_leniently() -> None:
    """The ``build`` entry written (:class:`qola.pipeline.record.BuildRecord`) is what ``--reproduce``
    reads back; an older or damaged one is read as it always was: a value of another type is absent."""
    from qola.pipeline.record import BuildRecord, CommandRecord

    rec = BuildRecord(CommandRecord(False, True, ("g",), False, ("/u.json",)), ("QK_TILE",), {"QK_TILE": "64"})
    assert BuildRecord.parse(json.loads(json.dumps(rec.to_json()))) == rec
    assert BuildRecord.parse(None) is None and BuildRecord.parse(["isolate"]) is None
    damaged = recorded_build({"env": ["QK_TILE=1"], "env_keys": "QK", "groups": [1, "g"], "isolate": 0})
    assert damaged == BuildRecord(CommandRecord(isolate=False, groups=("g",)), (), {})
    env, notes = rebuild_env({}, damaged, {"PATH": "/bin"}, None)
    assert env == {"PATH": "/bin"} and notes == []
