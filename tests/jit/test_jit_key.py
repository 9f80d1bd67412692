"""JIT keys: they change with the source, a bundled header, a flag, the arch or the compiler,
and with nothing else (not the file names, not where things live, not the time)."""

from __future__ import annotations

import json
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest
from support.jit_lib import API_H, UNIT, fake_compiler

from qola.core.errors import QolaError
from qola.jit import key as jkey
from qola.jit import layout
from qola.jit.layout import JitModuleSpec


def build(
    root: Path,
    *,
    unit: str | None = None,
    api: str = API_H,
    extra_header: str = "// other\n",
    flags: tuple[str, ...] = ("-O1",),
    arch: str = "host",
    compiler: jkey.JitCompiler | None = None,
    out: Path | None = None,
) -> dict[str, Any]:
    """Write a module with units u1 (includes api.h) and u2 (includes api.h + other.h); return
    unit name -> (content_key, key)."""
    src = root / "src"
    (src / "inc").mkdir(parents=True, exist_ok=True)
    (src / "inc" / "api.h").write_text(api)
    (src / "inc" / "other.h").write_text(extra_header)
    (src / "u1.cpp").write_text(unit or UNIT.format(n=1))
    (src / "u2.cpp").write_text('#include "other.h"\n' + UNIT.format(n=2))
    (src / "inc" / "unused.h").write_text(f"// never included {root}\n")
    if compiler is None:
        compiler = jkey.JitCompiler(path="/usr/bin/g++", identity="c" * 64, version="g++")
    spec = layout.JitModuleSpec(
        module="m",
        lang="cxx",
        arch=arch,
        compiler=compiler,
        flags=(*layout.shared_object_flags("cxx", []), *flags),
        include_dirs=(src / "inc",),
    )
    res = layout.write_jit_module(
        spec,
        [("u1", src / "u1.cpp"), ("u2", src / "u2.cpp")],
        out_jit=out or root / "out" / "jit",
        stub_dir=root / "stubs",
    )
    index = json.loads(res.index.read_text())
    return {u["name"]: (u["content_key"], u["key"]) for u in index["units"]}


def test_same_inputs_same_keys_anywhere(tmp_path: Path) -> None:
    a = build(tmp_path / "a")
    b = build(tmp_path / "b" / "deeper")  # other paths, other time
    assert a == b
    assert a["u1"] != a["u2"]


def test_key_changes_with_source(tmp_path: Path) -> None:
    a = build(tmp_path / "a")
    b = build(tmp_path / "b", unit=UNIT.format(n=1) + "// a comment is a change\n")
    assert a["u1"][0] != b["u1"][0] and a["u2"] == b["u2"]


def test_key_changes_with_a_bundled_header_only_for_its_includers(tmp_path: Path) -> None:
    a = build(tmp_path / "a")
    b = build(tmp_path / "b", api=API_H.replace("7", "8"))
    assert a["u1"] != b["u1"] and a["u2"] != b["u2"]
    c = build(tmp_path / "c", extra_header="// other, edited\n")
    assert a["u1"] == c["u1"] and a["u2"] != c["u2"]  # only u2 includes other.h


def test_key_changes_with_flags_arch_and_compiler(tmp_path: Path) -> None:
    a = build(tmp_path / "a")
    assert build(tmp_path / "b", flags=("-O2",))["u1"][0] != a["u1"][0]
    assert build(tmp_path / "c", arch="gfx942")["u1"][0] != a["u1"][0]
    other = jkey.JitCompiler(path="/usr/bin/g++", identity="d" * 64, version="g++ 13")
    d = build(tmp_path / "d", compiler=other)
    assert d["u1"][0] == a["u1"][0]  # content is compiler-independent ...
    assert d["u1"][1] != a["u1"][1]  # ... the entry key is not


def test_compiler_identity_is_path_and_version_output(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin"}
    cc = fake_compiler(tmp_path)
    a = jkey.probe_compiler(str(cc), env)
    version = subprocess.run(["g++", "--version"], capture_output=True).stdout
    assert a.identity == jkey.compiler_identity(str(cc), version)
    copy = tmp_path / "copy"
    copy.mkdir()
    b = jkey.probe_compiler(str(fake_compiler(copy)), env)
    assert a.identity != b.identity  # same version, other path
    cc.write_text(cc.read_text().replace("exec g++ --version; fi", 'echo "fake 2"; exit 0; fi'))
    assert jkey.probe_compiler(str(cc), env).identity != a.identity
    assert jkey.probe_compiler("g++", env).path == "/usr/bin/g++"


def test_key_definition_is_pinned() -> None:
    """The runtime (qola_jit.cpp) computes the same strings: keep both in sync."""
    ck = jkey.content_key(
        source=b"x", headers=jkey.headers_digest([("inc0/a.h", b"y")]), flags=["-O1"], arch="gfx942", lang="hip"
    )
    assert ck == jkey.sha256_hex(
        b"qola-jit-content-v1\nlang hip\narch gfx942\nflags 1\n-O1\n"
        + f"source {jkey.sha256_hex(b'x')}\nheaders {jkey.headers_digest([('inc0/a.h', b'y')])}\n".encode()
    )
    assert jkey.entry_key(ck, "c" * 64) == jkey.sha256_hex(f"qola-jit-key-v1\n{ck}\n{'c' * 64}\n".encode())


def test_bundle_is_deterministic_and_holds_the_closure(tmp_path: Path) -> None:
    build(tmp_path / "a")
    build(tmp_path / "b")
    a = (tmp_path / "a/out/jit/m/headers.tar.gz").read_bytes()
    assert a == (tmp_path / "b/out/jit/m/headers.tar.gz").read_bytes()
    with tarfile.open(tmp_path / "a/out/jit/m/headers.tar.gz") as tf:
        assert tf.getnames() == ["inc0/api.h", "inc0/other.h"]  # not unused.h


def _spec(*include_dirs: Path) -> JitModuleSpec:
    cc = jkey.JitCompiler(path="/usr/bin/g++", identity="c" * 64, version="g++")
    return layout.JitModuleSpec(
        module="m", lang="cxx", arch="host", compiler=cc, flags=("-O1",), include_dirs=include_dirs
    )


def test_headers_beside_the_source_are_bundled(tmp_path: Path) -> None:
    (tmp_path / "inc").mkdir()
    (tmp_path / "inc" / "api.h").write_text(API_H)
    (tmp_path / "gen").mkdir()
    (tmp_path / "gen" / "local.h").write_text("// generated beside the instance\n")
    (tmp_path / "gen" / "u.cpp").write_text('#include "local.h"\n' + UNIT.format(n=1))
    res = layout.write_jit_module(
        _spec(tmp_path / "inc"),
        [("u", tmp_path / "gen" / "u.cpp")],
        out_jit=tmp_path / "jit",
        stub_dir=tmp_path / "stubs",
    )
    index = json.loads(res.index.read_text())
    assert index["flags"][:2] == ["-I@QOLA_JIT_HEADERS@/srcdir", "-I@QOLA_JIT_HEADERS@/inc0"]
    with tarfile.open(res.jit_dir / "headers.tar.gz") as tf:
        assert tf.getnames() == ["inc0/api.h", "srcdir/local.h"]


def test_unusable_units_are_user_errors(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "api.h").write_text(API_H)
    (tmp_path / "u.cpp").write_text('#include "../a/api.h"\n' + UNIT.format(n=1))
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "v.cpp").write_text('#include "../a/api.h"\n' + UNIT.format(n=1))
    with pytest.raises(QolaError, match="outside the bundled include dirs"):
        layout.write_jit_module(
            _spec(), [("v", tmp_path / "sub" / "v.cpp")], out_jit=tmp_path / "j", stub_dir=tmp_path / "s"
        )
    (tmp_path / "w.cpp").write_text("int plain() { return 1; }\n")
    with pytest.raises(QolaError, match="no `template <>` function specialisation"):
        layout.write_jit_module(_spec(), [("w", tmp_path / "w.cpp")], out_jit=tmp_path / "j", stub_dir=tmp_path / "s")
    with pytest.raises(QolaError, match="duplicate JIT unit names"):
        layout.write_jit_module(
            _spec(), [("u", tmp_path / "u.cpp")] * 2, out_jit=tmp_path / "j", stub_dir=tmp_path / "s"
        )
