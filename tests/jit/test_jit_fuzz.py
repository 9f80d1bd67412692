"""Fuzz ``qola jit`` and the runtime with hostile ``index.json`` and cache ``.meta`` contents:
never a traceback (exit 0, 1 or 2 with a message), never a hang, nothing written outside the
output and cache dirs."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.jit_lib import build_runtime, make_lib

from qola import cli
from qola.jit import key as jkey

FASTCC = """#!/bin/sh
# a compiler that answers at once: --version, else a tiny "shared object" at -o
if [ "$1" = "--version" ]; then echo "fastcc 1"; exit 0; fi
out=""
while [ $# -gt 0 ]; do if [ "$1" = "-o" ]; then out="$2"; shift; fi; shift; done
printf '\\177ELF fake' > "$out"
"""
FUZZ = settings(
    max_examples=30,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict[Any, Any]:
    root = tmp_path_factory.mktemp("jit-fuzz")
    lib = make_lib(root / "lib", build_runtime(root / "rt"))
    fastcc = root / "fastcc"
    fastcc.write_text(FASTCC)
    fastcc.chmod(0o755)
    index = json.loads((lib.root / "out/jit/tm/index.json").read_text())
    runtime_id = jkey.probe_compiler(str(lib.compiler), lib.env).identity
    unit = index["units"][0]
    keys = [
        jkey.entry_key(unit["content_key"], runtime_id),
        jkey.entry_key(unit["content_key"], jkey.probe_compiler(str(fastcc), lib.env).identity),
    ]
    scratch = root / "scratch"
    scratch.mkdir()
    return {
        "lib": lib,
        "fastcc": fastcc,
        "index": index,
        "unit": unit,
        "keys": keys,
        "scratch": scratch,
        "runtime_id": runtime_id,
    }


def snapshot(top: Path, skip: tuple[Path, ...]) -> dict[str, tuple[int, int]]:
    """Every file and dir below ``top`` but ``skip``: a file by (mtime, size), a dir by its presence
    alone (its entries are in the snapshot themselves; its mtime changes when a command creates a
    ``skip`` dir in it, the cache, which is allowed)."""
    seen = {}
    for dirpath, dirs, files in os.walk(top):
        dirs[:] = [d for d in dirs if Path(dirpath, d) not in skip]
        for n in files + dirs:
            p = Path(dirpath, n)
            if p not in skip:
                st_ = p.lstat()
                seen[str(p)] = (0, 0) if stat.S_ISDIR(st_.st_mode) else (st_.st_mtime_ns, st_.st_size)
    return seen


def run_cli(argv: list[str], env: dict[str, str]) -> tuple[int, str]:
    err = io.StringIO()
    with mock.patch.dict(os.environ, env), contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        rc = cli.main(argv)
    return rc, err.getvalue()


def exercise(world: dict[Any, Any], index_bytes: bytes | None = None, meta: bytes | None = None) -> None:
    """One hostile example: a fresh OUT copy and cache, every jit command, and (for .meta) the runtime."""
    lib = world["lib"]
    ex = Path(tempfile.mkdtemp(dir=world["scratch"]))
    out, cache = ex / "out", ex / "cache"
    shutil.copytree(lib.root / "out", out, symlinks=True)
    (ex / "sentinel").write_text("outside")
    if index_bytes is not None:
        (out / "jit/tm/index.json").write_bytes(index_bytes)
    if meta is not None:
        cache.mkdir(mode=0o700)
        for k in world["keys"]:
            (cache / f"{k}.so").write_bytes(b"\x7fELF fake")
            (cache / f"{k}.meta").write_bytes(meta)
    before = snapshot(world["scratch"].parent, (out, cache))
    env = {
        "QOLA_JIT_COMPILER": str(world["fastcc"]),
        "QOLA_JIT_CACHE_DIR": str(cache),
        "QOLA_JIT_PREBUILT_DIR": "",
        "PATH": lib.env["PATH"],
    }
    for argv in (
        ["ls", str(out)],
        ["verify", str(out)],
        ["verify"],
        ["ls"],
        ["prebuild", str(out), "-j", "1"],
        ["ls"],
        ["clean"],
    ):
        rc, err = run_cli(["jit", *argv], env)
        assert rc in (0, 1, 2), (argv, rc, err)
        assert "Traceback" not in err and "rerun with --debug" not in err, (argv, err)
        if rc == 2:
            assert err.startswith("error: "), (argv, err)
    if meta is not None:  # the same bytes as the entry's .meta and as the compiler's identity memo
        (cache / f"{world['keys'][0]}.meta").write_bytes(meta)
        memo = cache / "compilers" / (jkey.sha256_hex(str(lib.compiler).encode())[:32] + ".id")
        memo.parent.mkdir(mode=0o700, exist_ok=True)
        memo.write_bytes(meta)
        proc = subprocess.run(
            [str(lib.caller), "1", "5"],
            capture_output=True,
            text=True,
            timeout=30,
            env={**lib.env, "QOLA_JIT_CACHE_DIR": str(cache), "QOLA_JIT": "0"},
        )
        assert proc.returncode in (0, 3), proc.stdout + proc.stderr  # a result, or QOLA_JIT=0's refusal
    assert snapshot(world["scratch"].parent, (out, cache)) == before
    shutil.rmtree(ex)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=16,
)


def paths(value: Any, prefix: tuple[str | int, ...] = ()) -> Iterator[tuple[str | int, ...]]:
    yield prefix
    if isinstance(value, dict):
        for k, v in value.items():
            yield from paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from paths(v, (*prefix, i))


@st.composite
def hostile_index(draw: st.DrawFn, valid: dict[str, Any]) -> bytes:
    kind = draw(st.sampled_from(["mutate", "mutate", "mutate", "json", "bytes", "deep"]))
    if kind == "json":
        return json.dumps(draw(JSON)).encode()
    if kind == "bytes":
        return draw(st.binary(max_size=300))
    if kind == "deep":
        n = draw(st.integers(1, 200_000))
        return ('{"format": "qola-jit-index", "version": 1, "units": ' + "[" * n + "]" * n + "}").encode()
    data = json.loads(json.dumps(valid))
    for _ in range(draw(st.integers(1, 3))):
        where = draw(st.sampled_from([p for p in paths(data) if p]))
        parent = data
        for k in where[:-1]:
            parent = parent[k]
        if draw(st.booleans()):
            parent[where[-1]] = draw(JSON)
        elif isinstance(parent, dict):
            del parent[where[-1]]
        else:
            parent.pop(where[-1])
    return json.dumps(data).encode()


@given(data=st.data())
@FUZZ
def test_hostile_index_json_never_tracebacks(world: dict[Any, Any], data: st.DataObject) -> None:
    exercise(world, index_bytes=data.draw(hostile_index(world["index"])))


@st.composite
def hostile_meta(draw: st.DrawFn, world: dict[Any, Any]) -> bytes:
    kind = draw(st.sampled_from(["mutate", "mutate", "bytes", "text"]))
    if kind == "bytes":
        return draw(st.binary(max_size=400))
    if kind == "text":
        return draw(st.text(max_size=400)).encode("utf-8", "surrogatepass")
    fake = b"\x7fELF fake"
    fields = {
        "key": world["keys"][0],
        "size": str(len(fake)),
        "sha256": jkey.sha256_hex(fake),
        "unit": "unit_1",
        "module": "tm",
        "compiler": "cc",
        "compiler_id": world["runtime_id"],
        "content_key": world["unit"]["content_key"],
        "source_sha256": world["unit"]["source_sha256"],
        "headers_sha256": world["index"]["headers"]["sha256"],
        "created": "0",
    }
    for _ in range(draw(st.integers(1, 3))):
        name = draw(st.sampled_from(sorted(fields)))
        if draw(st.booleans()):
            del fields[name]
        else:
            odd = st.sampled_from(["", " ", "\n", "0" * 64, "99999999999999999999"])
            fields[name] = draw(st.text(max_size=80) | odd)
    head = draw(st.sampled_from(["qola-jit-entry 1\n", "qola-jit-entry 2\n", ""]))
    return (head + "".join(f"{k} {v}\n" for k, v in fields.items())).encode("utf-8", "surrogatepass")


@given(data=st.data())
@FUZZ
def test_hostile_cache_meta_never_tracebacks_or_hangs(world: dict[Any, Any], data: st.DataObject) -> None:
    exercise(world, meta=data.draw(hostile_meta(world)))
