"""Generation is reused per generator command (issue 41): in a module with several generators
writing into one output dir, each reruns only when what it read (its own depfile), its command or
its variables changed; the others keep their files (same inode, same mtime: nothing recompiles) and
their attribution (``GenResult.groups``). A removed generator's files go. Before, a changed input
reran every generator of the module.

Each fixture generator appends its name to ``$GEN_CALLS`` when it runs."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from support.module_table import entry
from support.pythons import other_python

from qola.compile.codegen import GenJob, GenResult, run_generators, run_keys
from qola.plan.model import Generator

GEN = """
import os, pathlib, sys
{prelude}
args = sys.argv[1:]
out = pathlib.Path(args[args.index("--output_dir") + 1])
out.mkdir(parents=True, exist_ok=True)
with open(os.environ["GEN_CALLS"], "a") as fh:
    fh.write("{name}\\n")
for n in {names}:
    (out / f"{{n}}.cpp").write_text(f"int {{n}} = {{VALUE}};\\n")
"""


def _fixture(tmp_path: Path) -> tuple[Path, Path, dict[str, str]]:
    src, lib = tmp_path / "src", tmp_path / "lib"
    src.mkdir()
    lib.mkdir()
    (lib / "helper.py").write_text("VALUE = 1\n")
    (src / "gen_a.py").write_text(
        GEN.format(
            prelude=f"sys.path.insert(0, {str(lib)!r})\nfrom helper import VALUE", name="a", names='["a1", "a2"]'
        )
    )
    (src / "gen_b.py").write_text(GEN.format(prelude="VALUE = 7", name="b", names='["b1"]'))
    (src / "gen_c.py").write_text(
        GEN.format(prelude='VALUE = os.environ.get("MY_KNOB", "0")', name="c", names='["c1"]')
    )
    env = {"GEN_CALLS": str(tmp_path / "calls"), "PATH": os.environ["PATH"]}
    return src, lib, env


def _job(src: Path, names: list[str]) -> GenJob:
    gens = tuple(Generator(f"{src}/gen_{n}.py --output_dir {{}}") for n in names)
    return GenJob("m", gens)


def _calls(env: dict[str, str]) -> list[str]:
    p = Path(env["GEN_CALLS"])
    calls = p.read_text().split() if p.exists() else []
    p.unlink(missing_ok=True)
    return calls


def _ids(blob: Path) -> dict[str, tuple[int, int]]:
    return {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in blob.iterdir()}


def _gen(job: GenJob, tmp_path: Path, env: dict[str, str]) -> GenResult:
    return run_generators(job, tmp_path / "gen", env=env, python=sys.executable)


def test_a_changed_helper_reruns_only_the_generator_that_imported_it(tmp_path: Path) -> None:
    src, lib, env = _fixture(tmp_path)
    job = _job(src, ["a", "b", "c"])
    first = _gen(job, tmp_path, env)
    assert _calls(env) == ["a", "b", "c"] and not first.skipped
    blob = first.blob_dir
    ids = _ids(blob)
    assert _gen(job, tmp_path, env).skipped and _calls(env) == []
    (lib / "helper.py").write_text("VALUE = 22\n")  # only gen_a imports it (another size: .pyc by mtime in s)
    again = _gen(job, tmp_path, env)
    assert _calls(env) == ["a"]  # b and c are reused
    assert not again.skipped and len(again.reused) == 2 and len(again.commands) == 1
    assert (blob / "a1.cpp").read_text() == "int a1 = 22;\n" and (blob / "b1.cpp").read_text() == "int b1 = 7;\n"
    now = _ids(blob)
    assert now["b1.cpp"] == ids["b1.cpp"] and now["c1.cpp"] == ids["c1.cpp"]  # kept: nothing recompiles
    assert now["a1.cpp"] != ids["a1.cpp"]
    groups = [sorted(Path(p).name for p in g) for g in again.groups]
    assert groups == [["a1.cpp", "a2.cpp"], ["b1.cpp"], ["c1.cpp"]]  # each reused run's files still its own
    kept = _gen(job, tmp_path, env)  # and the stamp says so
    assert kept.skipped and _calls(env) == [] and [sorted(Path(p).name for p in g) for g in kept.groups] == groups


def test_a_variable_reruns_only_the_generator_that_read_it(tmp_path: Path) -> None:
    src, _, env = _fixture(tmp_path)
    job = _job(src, ["a", "b", "c"])
    blob = _gen(job, tmp_path, env).blob_dir
    _calls(env)
    assert not _gen(job, tmp_path, {**env, "MY_KNOB": "5"}).skipped
    assert _calls(env) == ["c"] and (blob / "c1.cpp").read_text() == "int c1 = 5;\n"
    stamp = (blob.parent / "stamp.json").read_text()
    assert '"MY_KNOB"' in stamp and '"5"' not in stamp  # its value is kept as a hash, never in clear


def test_a_removed_generator_takes_its_files_and_the_others_are_reused(tmp_path: Path) -> None:
    src, _, env = _fixture(tmp_path)
    blob = _gen(_job(src, ["a", "b", "c"]), tmp_path, env).blob_dir
    _calls(env)
    res = _gen(_job(src, ["a", "c"]), tmp_path, env)
    assert _calls(env) == [] and sorted(p.name for p in blob.iterdir()) == ["a1.cpp", "a2.cpp", "c1.cpp"]
    assert [sorted(Path(p).name for p in g) for g in res.groups] == [["a1.cpp", "a2.cpp"], ["c1.cpp"]]


def test_generators_writing_one_file_rerun_together(tmp_path: Path) -> None:
    src, lib, env = _fixture(tmp_path)
    (src / "gen_b.py").write_text(GEN.format(prelude="VALUE = 7", name="b", names='["b1", "a1"]'))  # overwrites a1
    job = _job(src, ["a", "b"])
    blob = _gen(job, tmp_path, env).blob_dir
    assert (blob / "a1.cpp").read_text() == "int a1 = 7;\n"
    _calls(env)
    (lib / "helper.py").write_text("VALUE = 33\n")
    _gen(job, tmp_path, env)
    assert _calls(env) == ["a", "b"]  # b's a1.cpp is the last write: b reruns with a
    assert (blob / "a1.cpp").read_text() == "int a1 = 7;\n" and (blob / "a2.cpp").read_text() == "int a2 = 33;\n"
    runs = json.loads((blob.parent / "stamp.json").read_text())["runs"]
    assert [r["wrote"] for r in runs] == [["a1.cpp", "a2.cpp"], ["a1.cpp", "b1.cpp"]]


def test_the_interpreter_a_python_link_names_is_part_of_each_run_key(tmp_path: Path) -> None:
    """`python3` re-pointed from 3.11 to 3.13 (the same argv): the generators were reused, the run key
    naming the link and the record the old interpreter's file, which had not changed."""
    src, _, env = _fixture(tmp_path)
    job = _job(src, ["b"])
    link = tmp_path / "bin" / "python3"
    link.parent.mkdir()
    link.symlink_to(sys.executable)
    before = run_keys(job, str(link))
    other = other_python()
    if other is None:  # no second interpreter here: the keys of two interpreter identities
        fake = tmp_path / "bin" / "python3.99"
        fake.write_text("#!/bin/sh\n")
        link.unlink()
        link.symlink_to(fake)
        assert run_keys(job, str(link)) != before
        return
    assert not run_generators(job, tmp_path / "gen", env=env, python=str(link)).skipped
    assert run_generators(job, tmp_path / "gen", env=env, python=str(link)).skipped and _calls(env) == ["b"]
    link.unlink()
    link.symlink_to(other)
    assert run_keys(job, str(link)) != before
    assert not run_generators(job, tmp_path / "gen", env=env, python=str(link)).skipped and _calls(env) == ["b"]


def test_a_generated_file_truncated_in_the_build_dir_reruns_its_generator(tmp_path: Path) -> None:
    """A generated source cut short in the build dir was reused for good: the library was built
    without its kernel and published with rc 0. Each run's files are checked against its record."""
    src, _, env = _fixture(tmp_path)
    job = _job(src, ["a", "b"])
    blob = _gen(job, tmp_path, env).blob_dir
    assert _calls(env) == ["a", "b"]
    with open(blob / "a2.cpp", "r+") as fh:
        fh.truncate(3)
    again = _gen(job, tmp_path, env)
    assert not again.skipped and _calls(env) == ["a"]  # b's files are whole: reused
    assert (blob / "a2.cpp").read_text() == "int a2 = 1;\n"
    assert _gen(job, tmp_path, env).skipped and _calls(env) == []


GEN_TABLE = {"module_gen": entry(blob_gen_cmd="f'{AITER_CSRC_DIR}/gen.py --output_dir {{}}'")}
GEN_SCRIPT = """import argparse, pathlib
p = argparse.ArgumentParser()
p.add_argument("--output_dir", required=True)
out = pathlib.Path(p.parse_args().output_dir)
out.mkdir(parents=True, exist_ok=True)
for i in (1, 2):
    (out / f"k{i}.cu").write_text(f'extern "C" int tg_k{i}() {{ return {i * 10}; }}\\nextern "C" int tg_k{i}b() {{ return {i}; }}\\n')
"""


def test_a_generated_source_cut_short_between_builds_is_generated_again(tmp_path: Path) -> None:
    """A generated source cut short in the build dir (a full disk, a stray editor) was compiled as it was
    by the next build's incremental path (ninja saw a newer file): the library lost a function and was
    published with rc 0. The incremental path checks each generated file changed since its stamp
    against the sha256 its run recorded: the build says so, generates it again, and the library is the
    first build's, byte for byte."""
    from support.common import run_qola

    tree = tmp_path / "tree"
    (tree / "aiter" / "jit").mkdir(parents=True)
    (tree / "aiter" / "jit" / "optCompilerConfig.json").write_text(json.dumps(GEN_TABLE))
    (tree / "csrc").mkdir()
    (tree / "csrc" / "gen.py").write_text(GEN_SCRIPT)
    m = tmp_path / "m.toml"
    m.write_text(
        '[qola]\nnamespace = "tg"\n[build]\narchitectures = ["sm_90"]\n'
        '[[modules]]\nname = "module_gen"\nis_python_module = false\n'
    )
    out = tmp_path / "out"
    argv = ("build", "-m", m, "-a", tree, "-o", out, "-j", "2")
    first = run_qola(*argv)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    lib = out / "lib" / "tg_module_gen.so"
    before = lib.read_bytes()
    (cut,) = list(Path(str(out) + ".build").rglob("k2.cu"))
    cut.write_text(cut.read_text().splitlines()[0] + "\n")  # its second function gone
    again = run_qola(*argv)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    assert "generated sources changed since their generator wrote them (module_gen: k2.cu)" in again.stderr
    assert "tg_k2b" in cut.read_text()
    assert lib.read_bytes() == before
    assert "up to date" in run_qola(*argv).stderr
