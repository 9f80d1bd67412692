"""qola's local compile cache (qola/compile/cache_launch.py, qola/store/ccache.py): an object is taken
from it only where every file its compile read is as it was, byte-identical to a fresh compile,
wherever the tree and the build dir lie; a damaged or planted entry is never taken; a cache dir
another user could write is refused. Each test has a cache dir of its own (cold)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from support.common import qola_command, run_qola

pytestmark = pytest.mark.slow

TABLE = {
    "module_tiny": {
        "srcs": ["f'{AITER_CSRC_DIR}/k/tiny.cu'", "f'{AITER_CSRC_DIR}/k/host.cpp'"],
        "flags_extra_cc": [],
        "flags_extra_hip": [],
        "extra_ldflags": "None",
        "extra_include": ["f'{AITER_CSRC_DIR}/include'"],
        "verbose": "False",
        "torch_exclude": "True",
        "blob_gen_cmd": "''",
    }
}
FILES = {
    "csrc/include/tiny.h": "#pragma once\n#define TINY_SCALE 3\n",
    "csrc/k/tiny.cu": '#include "tiny.h"\n__global__ void tiny_kernel(float* x) { x[threadIdx.x] *= TINY_SCALE; }\n'
    'extern "C" int tq_tiny_scale() { return TINY_SCALE; }\n',
    "csrc/k/host.cpp": '#include "tiny.h"\nextern "C" int tq_tiny_host() { return TINY_SCALE + 1; }\n',
}
MANIFEST = """[qola]
namespace = "tq"
[build]
architectures = ["sm_90"]
[[modules]]
name = "module_tiny"
is_python_module = false
"""
LIB = "lib/tq_module_tiny.so"


def _tree(where: Path) -> Path:
    for rel, text in {**FILES, "aiter/jit/optCompilerConfig.json": json.dumps(TABLE)}.items():
        (where / rel).parent.mkdir(parents=True, exist_ok=True)
        (where / rel).write_text(text)
    return where


def _build(at: Path, cache: Path, *extra: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    """The tiny tree's build from ``at`` (a tree of its own there unless one is), output ``at/out``."""
    tree = at / "tree" if (at / "tree").is_dir() else _tree(at / "tree")
    (at / "m.toml").write_text(MANIFEST)
    out = at / "out"
    proc = run_qola(
        "build", "-m", at / "m.toml", "-a", tree, "-o", out, "-j", "2", *extra, env={"QOLA_CACHE_DIR": str(cache)}
    )
    return proc, out


def _tally(out: Path) -> list[str]:
    return sorted(line.split()[0] for line in (Path(str(out) + ".build") / "cache" / "tally").read_text().splitlines())


def _returns(lib: Path, function: str) -> int:
    """The constant ``function`` returns, read from its code (the library exports nothing of the tree's:
    symbol isolation): ``mov $N,%eax; ret``."""
    dump = subprocess.run(["objdump", "-d", f"--disassemble={function}", lib], capture_output=True, text=True).stdout
    body = dump.split(f"<{function}>:", 1)[1]
    return int(body.split("mov    $", 1)[1].split(",%eax", 1)[0], 16)


def _objects(cache: Path) -> list[Path]:
    return sorted(p for p in (cache / "v1" / "o").rglob("*") if p.is_file())


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    return tmp_path / "cache"


def test_a_second_build_elsewhere_compiles_nothing_and_gives_the_same_bytes(tmp_path: Path, cache: Path) -> None:
    first, out1 = _build(tmp_path / "a", cache)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert _tally(out1) == ["miss", "miss"]
    text = first.stdout + first.stderr
    assert "compile cache (" in text and "2 compiled" in text, text[-2000:]
    again, out2 = _build(tmp_path / "elsewhere" / "b", cache)  # another tree copy, output and build dir
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert _tally(out2) == ["hit", "hit"]
    assert (out1 / LIB).read_bytes() == (out2 / LIB).read_bytes()
    record = (out2 / "manifest.json").read_text()
    assert "cache" not in json.loads(record).get("build", {}), "the output records nothing of the cache"


def test_a_header_edit_misses_and_the_library_holds_the_edit(tmp_path: Path, cache: Path) -> None:
    first, out1 = _build(tmp_path / "a", cache)
    assert first.returncode == 0, first.stderr[-3000:]
    edited = _tree(tmp_path / "b" / "tree")
    (edited / "csrc" / "include" / "tiny.h").write_text("#pragma once\n#define TINY_SCALE 5\n")
    again, out2 = _build(tmp_path / "b", cache)
    assert again.returncode == 0, again.stderr[-3000:]
    assert _tally(out2) == ["miss", "miss"]  # both units read the header
    assert _returns(out2 / LIB, "tq_tiny_host") == 6 and _returns(out1 / LIB, "tq_tiny_host") == 4


def test_a_flipped_byte_in_an_entry_is_caught_and_the_unit_compiled_again(tmp_path: Path, cache: Path) -> None:
    first, out1 = _build(tmp_path / "a", cache)
    assert first.returncode == 0, first.stderr[-3000:]
    objs = _objects(cache)
    assert len(objs) == 2
    for p in objs:
        data = bytearray(p.read_bytes())
        data[len(data) // 2] ^= 0xFF
        p.write_bytes(bytes(data))
    again, out2 = _build(tmp_path / "b", cache)
    assert again.returncode == 0, again.stderr[-3000:]
    assert _tally(out2) == ["corrupt", "corrupt"]
    assert (out1 / LIB).read_bytes() == (out2 / LIB).read_bytes()
    third, out3 = _build(tmp_path / "c", cache)  # the entries were replaced with good ones
    assert third.returncode == 0 and _tally(out3) == ["hit", "hit"]


def test_two_builds_at_once_over_one_cache_both_succeed(tmp_path: Path, cache: Path) -> None:
    procs = []
    for name in ("a", "b"):
        at = tmp_path / name
        _tree(at / "tree")
        (at / "m.toml").write_text(MANIFEST)
        argv = qola_command("build", "-m", at / "m.toml", "-a", at / "tree", "-o", at / "out", "-j", "2")
        env = {**os.environ, "QOLA_CACHE_DIR": str(cache)}
        procs.append(subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    for p in procs:
        stdout, stderr = p.communicate(timeout=900)
        assert p.returncode == 0, stdout[-2000:] + stderr[-2000:]
    assert (tmp_path / "a" / "out" / LIB).read_bytes() == (tmp_path / "b" / "out" / LIB).read_bytes()
    again, out = _build(tmp_path / "c", cache)
    assert again.returncode == 0 and _tally(out) == ["hit", "hit"]


@pytest.mark.parametrize("how", ["world-writable", "another owner", "a link"])
def test_a_cache_dir_others_could_write_is_refused(tmp_path: Path, cache: Path, how: str) -> None:
    if how == "a link":
        (tmp_path / "real").mkdir(mode=0o700)
        cache.symlink_to(tmp_path / "real")
    else:
        cache.mkdir(mode=0o700)
        if how == "world-writable":
            cache.chmod(0o777)
        elif os.geteuid() == 0:
            os.chown(cache, 65534, 65534)
        else:
            pytest.skip("changing a dir's owner needs root (the test command runs as root)")
    proc, out = _build(tmp_path / "a", cache)
    assert proc.returncode != 0
    assert f"refusing the compile cache dir {cache}" in proc.stderr, proc.stderr[-2000:]
    assert "--no-cache" in proc.stderr and "Traceback" not in proc.stderr
    assert not (out / LIB).exists()
    ok, out = _build(tmp_path / "a", cache, "--no-cache")  # the way out it names
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert not (Path(str(out) + ".build") / "cache").exists()


def test_a_planted_link_in_the_cache_is_never_followed(tmp_path: Path, cache: Path) -> None:
    first, out1 = _build(tmp_path / "a", cache)
    assert first.returncode == 0, first.stderr[-3000:]
    secret = tmp_path / "elsewhere.o"
    secret.write_bytes(b"not an object of this build")
    for p in _objects(cache):  # each object replaced by a link to another file
        p.unlink()
        p.symlink_to(secret)
    again, out2 = _build(tmp_path / "b", cache)
    assert again.returncode == 0, again.stderr[-3000:]
    assert _tally(out2) == ["corrupt", "corrupt"]
    assert (out1 / LIB).read_bytes() == (out2 / LIB).read_bytes()
    assert secret.read_bytes() == b"not an object of this build"


def test_no_cache_and_audit_reproduce_leave_the_cache_alone(tmp_path: Path, cache: Path) -> None:
    first, out1 = _build(tmp_path / "a", cache)
    assert first.returncode == 0, first.stderr[-3000:]
    before = {p: p.stat().st_mtime_ns for p in cache.rglob("*")}
    proc = run_qola("audit", "--reproduce", out1, env={"QOLA_CACHE_DIR": str(cache)})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert {p: p.stat().st_mtime_ns for p in cache.rglob("*")} == before  # nothing read (a hit touches) or added
    plain, out2 = _build(tmp_path / "b", cache, "--no-cache")
    assert plain.returncode == 0 and "compile cache" not in plain.stdout + plain.stderr
    assert {p: p.stat().st_mtime_ns for p in cache.rglob("*")} == before
    assert (out1 / LIB).read_bytes() == (out2 / LIB).read_bytes()


def test_qola_cache_shows_and_cleans_it(tmp_path: Path, cache: Path) -> None:
    first, _ = _build(tmp_path / "a", cache)
    assert first.returncode == 0, first.stderr[-3000:]
    shown = run_qola("cache", "show", "--json", env={"QOLA_CACHE_DIR": str(cache)})
    assert shown.returncode == 0, shown.stderr
    data = json.loads(shown.stdout)
    assert data["dir"] == str(cache) and data["objects"] == 2 and data["actions"] == 2 and data["bytes"] > 0
    cleaned = run_qola("cache", "clean", env={"QOLA_CACHE_DIR": str(cache)})
    assert cleaned.returncode == 0 and "2 object(s)" in cleaned.stdout, cleaned.stdout + cleaned.stderr
    assert _objects(cache) == []
    shutil.rmtree(cache)
    assert run_qola("cache", "show", env={"QOLA_CACHE_DIR": str(cache)}).returncode == 0


def test_the_key_names_the_tree_the_build_dir_and_qolas_own_dir_by_root() -> None:
    """A HIP line names qola's runtime headers (``-I<qola>/runtime``): qola installed or checked out
    elsewhere (another venv, a second worktree) is the same action, as the tree and the build dir
    elsewhere are; a path outside those roots is not."""
    from qola.compile.cache_launch import Roots, action_key

    def key(tree: str, build: str, pkg: str, extra: str = "/opt/rocm/include") -> str:
        roots = Roots.of({"tree": [tree], "build": [build], "qola": [pkg]})
        argv = ["hipcc", f"-I{pkg}/runtime", f"-I{tree}/csrc/include", f"-I{extra}", "-c", f"{tree}/a.cu", "-o", "a.o"]
        return action_key({"compiler_id": "c", "env": []}, roots, argv, build, {})

    one = key("/w1/tree", "/w1/out.build", "/w1/qola/qola")
    assert key("/w2/aiter", "/tmp/b.build", "/venv/lib/python3.11/site-packages/qola") == one
    assert key("/w1/tree", "/w1/out.build", "/w1/qola/qola", extra="/opt/rocm-7/include") != one
