"""Issue 12, the cost of a rebuild: an unchanged artifact is republished by a hard link without
being read again, generated files keep their mtime when their bytes do not change, and a build
with only some ninja edges dirty runs ninja on the recorded graph and republishes what changed."""

from __future__ import annotations

import json
import os
from pathlib import Path

from test_harden_publish import fake_report

from qola import publish as publish_mod
from qola.publish import publish


def _counting_hashes(monkeypatch) -> list[str]:
    """Every path qola.publish hashes from now on."""
    read: list[str] = []
    sha, regular = publish_mod.file_sha256, publish_mod.regular_file_sha256

    def file_sha(p):
        read.append(str(p))
        return sha(p)

    def regular_sha(p):
        read.append(str(p))
        return regular(p)

    monkeypatch.setattr(publish_mod, "file_sha256", file_sha)
    monkeypatch.setattr(publish_mod, "regular_file_sha256", regular_sha)
    return read


def test_an_unchanged_artifact_is_linked_without_reading_it(tmp_path, monkeypatch):
    out = tmp_path / "out"
    report = fake_report(tmp_path, [("a", "qk_a", "built", b"A1" * 1000), ("b", "qk_b", "built", b"B1" * 1000)])
    publish(report, out)
    first = (out / "current").resolve()
    read = _counting_hashes(monkeypatch)
    publish(report, out)  # nothing rebuilt: the build dir's libraries are as the last publish saw them
    second = (out / "current").resolve()
    assert second != first
    for lib in ("qk_a.so", "qk_b.so"):
        assert os.stat(first / "lib" / lib).st_ino == os.stat(second / "lib" / lib).st_ino
    assert not [p for p in read if p.endswith(".so")], read

    # b relinked with other bytes, a rewritten with the same bytes: b copied, a hashed once and linked
    (tmp_path / "b" / "lib" / "qk_a.so").write_bytes(b"A1" * 1000)
    (tmp_path / "b" / "lib" / "qk_b.so").write_bytes(b"B2" * 1000)
    read.clear()
    publish(report, out)
    third = (out / "current").resolve()
    assert os.stat(third / "lib" / "qk_a.so").st_ino == os.stat(second / "lib" / "qk_a.so").st_ino
    assert os.stat(third / "lib" / "qk_b.so").st_ino != os.stat(second / "lib" / "qk_b.so").st_ino
    assert (third / "lib" / "qk_b.so").read_bytes() == b"B2" * 1000
    assert read.count(str(tmp_path / "b" / "lib" / "qk_a.so")) == 1  # its own bytes, never the published copy's
    assert not [p for p in read if str(out) in p]
    mods = {m["name"]: m for m in json.loads((out / "manifest.json").read_text())["modules"]}
    assert mods["b"]["sha256"] == publish_mod.hashlib.sha256(b"B2" * 1000).hexdigest()


def test_a_published_file_changed_behind_qolas_back_is_not_linked(tmp_path):
    out = tmp_path / "out"
    report = fake_report(tmp_path, [("a", "qk_a", "built", b"A1" * 1000)])
    publish(report, out)
    first = (out / "current").resolve()
    lib = first / "lib" / "qk_a.so"
    os.chmod(lib, 0o755)
    lib.write_bytes(b"XX" * 1000)  # same size, other bytes: only its stat says so
    publish(report, out)
    now = out / "lib" / "qk_a.so"
    assert now.read_bytes() == b"A1" * 1000 and os.stat(now).st_ino != os.stat(lib).st_ino


def test_a_record_of_another_output_dir_is_not_used(tmp_path):
    report = fake_report(tmp_path, [("a", "qk_a", "built", b"A1" * 1000)])
    publish(report, tmp_path / "one")
    record = json.loads((tmp_path / "b" / publish_mod.PUBLISHED).read_text())
    assert record["out"] == os.path.realpath(tmp_path / "one") and record["version"] == "v1"
    assert publish_mod._seen(tmp_path / "b" / publish_mod.PUBLISHED, tmp_path / "two", Path("v1")) == {}
