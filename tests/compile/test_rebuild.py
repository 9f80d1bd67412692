"""Issue 12, the cost of a rebuild: an unchanged artifact is republished by an in-kernel copy without
being read again, generated files keep their mtime when their bytes do not change, and a build
with only some ninja edges dirty runs ninja on the recorded graph and republishes what changed."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from subprocess import CompletedProcess

import pytest
from support.common import run_qola
from support.fake_nvcc import fake_nvcc
from support.fake_nvcc import pytestmark as needs_fake_nvcc  # g++ and a CUDA toolkit's cudart
from support.module_table import entry
from support.reports import fake_report

from qola.core.fsutil import copy_file
from qola.output import publish as publish_mod
from qola.output.publish import publish


def _fast_copies(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every source qola.output.publish copies without reading it (its stat as the last publish recorded)."""
    fast: list[str] = []
    real = copy_file

    def copy(src: Path, dst: Path, mode: int) -> None:
        fast.append(str(src))
        return real(src, dst, mode)

    monkeypatch.setattr(publish_mod, "copy_file", copy)
    return fast


def test_an_unchanged_artifact_is_copied_without_reading_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "out"
    lib = tmp_path / "b" / "lib"
    report = fake_report(tmp_path, [("a", "qk_a", "built", b"A1" * 1000), ("b", "qk_b", "built", b"B1" * 1000)])
    publish(report, out)
    fast = _fast_copies(monkeypatch)
    publish(report, out)  # nothing rebuilt: the build dir's libraries are as the last publish saw them
    assert sorted(fast) == [str(lib / "qk_a.so"), str(lib / "qk_b.so")]
    prev = out / ".qola" / "prev"
    for rel in ("lib/qk_a.so", "lib/qk_b.so"):  # a copy of its own, never a link to the previous version
        assert os.stat(out / rel).st_nlink == 1 and os.stat(out / rel).st_ino != os.stat(prev / rel).st_ino
        assert (out / rel).read_bytes() == (prev / rel).read_bytes()

    # b relinked with other bytes, a rewritten with the same bytes: both read (their stat moved)
    (lib / "qk_a.so").write_bytes(b"A1" * 1000)
    (lib / "qk_b.so").write_bytes(b"B2" * 1000)
    fast.clear()
    publish(report, out)
    assert fast == []
    assert (out / "lib" / "qk_b.so").read_bytes() == b"B2" * 1000
    mods = {m["name"]: m for m in json.loads((out / "manifest.json").read_text())["modules"]}
    assert mods["b"]["sha256"] == hashlib.sha256(b"B2" * 1000).hexdigest()
    assert mods["a"]["sha256"] == hashlib.sha256(b"A1" * 1000).hexdigest()
    fast.clear()
    publish(report, out)
    assert len(fast) == 2  # recorded again


def test_a_source_changed_with_its_size_and_mtime_kept_is_read_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    report = fake_report(tmp_path, [("a", "qk_a", "built", b"A1" * 1000)])
    publish(report, out)
    src = tmp_path / "b" / "lib" / "qk_a.so"
    st = src.stat()
    src.write_bytes(b"XX" * 1000)  # same size, other bytes, mtime put back: its ctime still moved
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns))
    fast = _fast_copies(monkeypatch)
    publish(report, out)
    assert fast == [] and (out / "lib" / "qk_a.so").read_bytes() == b"XX" * 1000
    data = json.loads((out / "manifest.json").read_text())
    assert data["files"]["lib/qk_a.so"]["sha256"] == hashlib.sha256(b"XX" * 1000).hexdigest()


def test_a_record_of_another_format_is_not_used(tmp_path: Path) -> None:
    report = fake_report(tmp_path, [("a", "qk_a", "built", b"A1" * 1000)])
    publish(report, tmp_path / "one")
    record = tmp_path / "b" / publish_mod.PUBLISHED
    assert publish_mod._seen(record) and json.loads(record.read_text())["format"] == 2
    record.write_text(json.dumps({"out": "x", "version": "v1", "files": {"lib/qk_a.so": {}}}))
    assert publish_mod._seen(record) == {}


def test_the_noop_record_reads_back_as_typed_values_in_its_format(tmp_path: Path) -> None:
    """The no-op record crosses from the full path (finish.remember) to the next build's no-op and
    incremental paths: it reads back as a NoopRecord whose run and key material are typed values,
    the file keeps its JSON form, and a damaged part refuses the whole record (None: a full build)."""
    from qola.compile.rebuild import Audited, Recipe, Run
    from qola.compile.results import ModuleResult
    from qola.store import fastpath
    from qola.store.key import Material

    build, out = tmp_path / "b", tmp_path / "o"
    build.mkdir()
    (build / "lib.so").write_bytes(b"x")
    run = Run(2, ("module_a",), {"HIP_PLATFORM": "amd"}, {"lib.so": "a"}, {}, "sccache")
    run = Run(2, run.targets, run.env, run.artifacts, {"a": Audited((1, 2, 3, 4, 5), ("qk_f",))}, run.launcher)
    material = Material({"tree": {"commit": None}, "qola": {"version": "v"}}, (("/t/a.cu", False),), ("/t",))
    fastpath.record(
        build, out, fastpath.Recorded(["qola", "build"], {"PATH": "/p"}, ["PATH"], [], rebuild=run, key=material)
    )
    data = json.loads((build / fastpath.RECORD).read_text())
    assert data["rebuild"]["state"] == {"a": {"key": [1, 2, 3, 4, 5], "exports": ["qk_f"]}}
    assert data["rebuild"]["targets"] == ["module_a"] and data["key"]["roots"] == [["/t/a.cu", False]]
    last = fastpath.load(build, ["qola", "build"])
    assert last is not None and last.rebuild == run and last.key == material
    assert last.env_keys == ("PATH",) and last.names() == ["PATH"] and last.rebuild.state["a"].exports == ("qk_f",)
    assert run.changed(build) == {"a"}  # the artifact is not the one audited
    data["rebuild"]["state"]["a"]["exports"] = "qk_f"  # damaged: not a list
    (build / fastpath.RECORD).write_text(json.dumps(data))
    assert fastpath.load(build, ["qola", "build"]) is None
    module = ModuleResult("a", "qk_a", "cpp_itfs", "shared", sources=3, log=("before",), artifact=build / "lib.so")
    recipe = Recipe({"p": 1}, {"t": 2}, (module,))
    back = Recipe.of(json.loads(json.dumps(recipe.to_json())))
    assert back == recipe and back.results(run)[0].exports == ("qk_f",)
    assert recipe.to_json()["modules"] == [
        {
            "name": "a",
            "md_name": "qk_a",
            "mode": "cpp_itfs",
            "link": "shared",
            "sources": 3,
            "generated": 0,
            "warnings": [],
            "instances": [],
            "log": ["before"],
            "artifact": str(build / "lib.so"),
        }
    ]


# ---- the incremental path, end to end (fake nvcc: g++) ---------------------------------------------

GEN = """import pathlib, sys
out = pathlib.Path(sys.argv[sys.argv.index("--output_dir") + 1])
for name, value in VALUES.items():
    (out / f"inst_{name}.cu").write_text(f"static int inst_{name}() {{ return {value}; }}\\n"
                                         f"int (*use_{name})() = inst_{name};\\n")
(out / "gen_api.cu").write_text('extern "C" __attribute__((visibility("default"))) int qk_gen_api() { return 1; }\\n')
"""
TABLE = {
    "libgen": entry(
        is_python_module="False",
        is_standalone="False",
        blob_gen_cmd=["f'{AITER_CSRC_DIR}/gen/gen.py --output_dir {{}}'"],
    )
}
GEN_MANIFEST = (
    '[qola]\nnamespace = "qk"\n[build]\narchitectures = ["sm_90"]\nmode = "cpp_itfs"\n[[modules]]\nname = "libgen"\n'
)


@pytest.fixture
def gen_setup(tmp_path: Path) -> tuple[Path, Callable[..., CompletedProcess[str]], Path, Path]:
    """(tmp, build(*extra) -> CompletedProcess, the generator script, blob dir) of a one-module tree
    whose generator writes three instances and an API file."""
    tree = tmp_path / "tree"
    (tree / "aiter" / "jit").mkdir(parents=True)
    (tree / "aiter" / "jit" / "core.py").write_text("import os\n")
    (tree / "aiter" / "jit" / "optCompilerConfig.json").write_text(json.dumps(TABLE))
    (tree / "csrc" / "gen").mkdir(parents=True)
    script = tree / "csrc" / "gen" / "gen.py"
    script.write_text("VALUES = {'a': 1, 'b': 2, 'c': 3}\n" + GEN)
    m = tmp_path / "q.toml"
    m.write_text(GEN_MANIFEST)
    env = {"CUDACXX": str(fake_nvcc(tmp_path / "nvcc"))}

    def build(*extra: str) -> CompletedProcess[str]:
        return run_qola(
            "build",
            "--manifest",
            str(m),
            "--aiter-root",
            str(tree),
            "-o",
            str(tmp_path / "out"),
            "-j",
            "2",
            *extra,
            env=env,
            cwd=tmp_path,
        )

    return tmp_path, build, script, tmp_path / "out.build" / "gen" / "libgen" / "blob"


def log_entries(build_dir: Path) -> list[str]:
    """Every output of ``.ninja_log``, one per edge run, oldest first (a host-only object's check edge,
    which runs after its compile, aside: qola.compile.hostonly)."""
    outs = [ln.split("\t")[3] for ln in (build_dir / ".ninja_log").read_text().splitlines()[1:]]
    return [o for o in outs if not o.endswith(".hostonly")]


def planned(res: CompletedProcess[str]) -> bool:
    """The full path ran (its one-line header names the modules and the toolchain)."""
    return "module(s), cuda" in res.stderr


def lib_of(tmp: Path) -> Path:
    return tmp / "out" / "lib" / "qk_libgen.so"


@needs_fake_nvcc
def test_touching_one_instance_recompiles_it_alone_without_replanning(
    gen_setup: tuple[Path, Callable[..., CompletedProcess[str]], Path, Path],
) -> None:
    tmp, build, _script, blob = gen_setup
    first = build()
    assert first.returncode == 0 and planned(first), first.stderr
    assert json.loads((tmp / "out.build" / ".qola-noop.json").read_text())["rebuild"]["targets"] == ["module_libgen"]
    lib, seen = lib_of(tmp).read_bytes(), len(log_entries(tmp / "out.build"))
    # touched: an mtime just past its object's (no sleep, and no mtime in the future)
    (obj,) = (tmp / "out.build" / "obj" / "libgen").glob("inst_b-*.o")
    newer = max(obj.stat().st_mtime_ns, (blob / "inst_b.cu").stat().st_mtime_ns) + 1_000_000
    os.utime(blob / "inst_b.cu", ns=(newer, newer))
    res = build()
    assert res.returncode == 0 and not planned(res) and "up to date" not in res.stderr, res.stderr
    ran = log_entries(tmp / "out.build")[seen:]
    assert [o for o in ran if o.endswith(".o")] == [o for o in ran if o.startswith("obj/libgen/inst_b-")]
    assert len(ran) == 2 and "lib/qk_libgen.so" in ran, ran  # that object and the link
    now = lib_of(tmp).read_bytes()
    assert now == lib  # the same bytes relinked and published again
    assert "up to date" in build().stderr

    # a real change to that instance's bytes (an edit, a file cut short) is not compiled as it is: its
    # generator wrote other bytes (its stamp's sha256), so the build says so and generates it again; the
    # library is the one the generator's sources make, as before
    (blob / "inst_b.cu").write_text(
        "static int inst_b() { return 22; }\n__attribute__((used, retain)) int (*use_b)() = inst_b;\n"
    )
    res = build()
    assert res.returncode == 0 and planned(res), res.stderr
    assert "generated sources changed since their generator wrote them (libgen: inst_b.cu)" in res.stderr
    assert "return 22" not in (blob / "inst_b.cu").read_text()
    assert lib_of(tmp).read_bytes() == now
    data = json.loads((tmp / "out" / "manifest.json").read_text())
    assert data["files"]["lib/qk_libgen.so"]["sha256"] == hashlib.sha256(now).hexdigest()
    (mod,) = data["modules"]
    assert mod["status"] == "built" and mod["exports"] == ["qk_gen_api"] and mod["instances"]["count"] == 4
    assert "up to date" in build().stderr


@needs_fake_nvcc
def test_a_generator_comment_edit_recompiles_nothing(
    gen_setup: tuple[Path, Callable[..., CompletedProcess[str]], Path, Path],
) -> None:
    tmp, build, script, _blob = gen_setup
    assert build().returncode == 0
    built = tmp / "out.build" / "lib" / "qk_libgen.so"
    lib, seen, mtime = lib_of(tmp).read_bytes(), len(log_entries(tmp / "out.build")), built.stat().st_mtime_ns
    script.write_text("# only a comment\n" + script.read_text())
    res = build()
    assert res.returncode == 0 and planned(res), res.stderr  # the generator changed: the full path
    assert log_entries(tmp / "out.build")[seen:] == [], "nothing to recompile or relink"
    assert lib_of(tmp).read_bytes() == lib and built.stat().st_mtime_ns == mtime
    assert "up to date" in build().stderr


@needs_fake_nvcc
def test_what_changes_the_plan_still_takes_the_full_path(
    gen_setup: tuple[Path, Callable[..., CompletedProcess[str]], Path, Path],
) -> None:
    tmp, build, script, blob = gen_setup
    assert build().returncode == 0
    # the generator writes a fourth instance: planned again, the new object compiled, nothing else
    script.write_text(script.read_text().replace("'c': 3}", "'c': 3, 'd': 4}"))
    seen = len(log_entries(tmp / "out.build"))
    res = build()
    assert res.returncode == 0 and planned(res), res.stderr
    ran = log_entries(tmp / "out.build")[seen:]
    assert sorted(o.split("/")[-1].split("-")[0] for o in ran) == ["inst_d", "qk_libgen.so"], ran
    assert json.loads((tmp / "out" / "manifest.json").read_text())["modules"][0]["instances"]["count"] == 5
    # a generated file removed behind qola's back: its dir listing changed, planned again
    (blob / "inst_a.cu").unlink()
    res = build()
    assert res.returncode == 0 and planned(res), res.stderr
    # a file stage 8 wrote (the version script) changed: planned again, rewritten
    vscript = tmp / "out.build" / "link" / "qk.version"
    text = vscript.read_text()
    vscript.write_text(text + "\n")
    res = build()
    assert res.returncode == 0 and planned(res) and vscript.read_text() == text, res.stderr
    # the manifest
    m = tmp / "q.toml"
    m.write_text(m.read_text() + "\n# edited\n")
    res = build()
    assert res.returncode == 0 and planned(res), res.stderr


@needs_fake_nvcc
def test_a_compile_error_on_the_incremental_path_fails_that_module_and_publishes_none_of_it(
    gen_setup: tuple[Path, Callable[..., CompletedProcess[str]], Path, Path],
) -> None:
    tmp, build, script, _blob = gen_setup
    # a source of the tree beside the generated ones (a generated file changed in the build dir is
    # generated again, never compiled as it is: test_touching_one_instance_…)
    table = {"libgen": {**TABLE["libgen"], "srcs": ["f'{AITER_CSRC_DIR}/gen/inst_tree.cu'"]}}
    (tmp / "tree" / "aiter" / "jit" / "optCompilerConfig.json").write_text(json.dumps(table))
    tree_src = script.parent / "inst_tree.cu"
    tree_src.write_text("static int inst_tree() { return 9; }\nint (*use_tree)() = inst_tree;\n")
    assert build().returncode == 0
    good = tree_src.read_text()
    tree_src.write_text("this is not C++\n")
    res = build()
    assert res.returncode == 1 and not planned(res), res.stderr
    assert "libgen failed" in res.stderr and "inst_tree" in res.stderr
    data = json.loads((tmp / "out" / "manifest.json").read_text())  # nothing published: OUT keeps its version
    assert data["modules"][0]["status"] == "built" and (tmp / "out" / "lib" / "qk_libgen.so").is_file()
    assert "nothing published: libgen failed" in res.stderr
    assert not (tmp / "out.build" / ".qola-noop.json").exists()
    tree_src.write_text(good)
    res = build()  # no record: the full path (the stamp keeps the generator from running again)
    assert res.returncode == 0 and planned(res) and (tmp / "out" / "lib" / "qk_libgen.so").is_file(), res.stderr
    assert "up to date" in build().stderr


def test_build_ninja_names_a_source_with_a_space_or_colon_once_escaped(tmp_path: Path) -> None:
    """The compile edges are written as ninja_syntax would, but each path escaped once (it was twice:
    a source under 'a b/' named 'a$ b/' to ninja); ninja itself finds the source."""
    from ninja import BIN_DIR

    from qola.compile import ninja

    src = tmp_path / "a b" / "c:d.cu"
    src.parent.mkdir()
    src.write_text("int x;\n")
    comp = ninja.Compile(str(src), "obj/m/c-1.o", "flags_m", ("-DX=1",))
    graph = ninja.Graph(
        rules={"cc": {"command": "cp $in $out"}, "link": {"command": "cat $in > $out"}},
        variables={"flags_m": "-O3"},
        targets=(ninja.Target("m", "lib/m.so", (comp,), "link"),),
    )
    ninja.write(graph, tmp_path / "build.ninja")
    text = (tmp_path / "build.ninja").read_text()
    assert f"build obj/m/c-1.o: cc {str(src.parent).replace(' ', '$ ')}/c$:d.cu\n  flags = $flags_m -DX=1\n" in text
    import subprocess

    done = subprocess.run([os.path.join(BIN_DIR, "ninja"), "-C", str(tmp_path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout
    assert (tmp_path / "obj" / "m" / "c-1.o").read_text() == "int x;\n"
