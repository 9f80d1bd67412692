"""Staged codegen: stamps skip unchanged runs, a new filter never keeps an old filter's instances,
a failing generator leaves the last good output in place."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from support.common import KERNELS

from qola.compile.codegen import GenJob, GenResult, run_generators
from qola.core.errors import FailedProcessError
from qola.plan.planner import Generator

GEN = Generator(f"{KERNELS}/csrc/attn/generate.py -d fwd --receipt 0 --output_dir {{}}", "fwd", "0")


def names(res: GenResult) -> set[str]:
    return {p.rsplit("/", 1)[1].removesuffix(".cu") for p in res.sources}


def test_stamp_skips_and_filters_never_leak(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin"}
    a = run_generators(GenJob("m", (GEN,), (("--filter", "*_d64_fp16_batch_*"),)), tmp_path, env=env)
    assert not a.skipped and names(a) == {n for n in names(a) if "_d64_fp16_batch_" in n} | {"attn_fwd_api"}
    assert len(names(a)) == 5
    again = run_generators(GenJob("m", (GEN,), (("--filter", "*_d64_fp16_batch_*"),)), tmp_path, env=env)
    assert again.skipped and names(again) == names(a)
    b = run_generators(GenJob("m", (GEN,), (("--filter", "*_d128_bf16_group_*"),)), tmp_path, env=env)
    assert not b.skipped
    assert names(b) & names(a) == {"attn_fwd_api"}  # nothing of the earlier filter survives
    assert not [p for p in (tmp_path / "m").iterdir() if p.name.startswith(".staging")]


def test_failing_generator_keeps_the_last_good_output(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin"}
    good = run_generators(GenJob("m", (GEN,), (("--filter", "*_d64_fp32_*"),)), tmp_path, env=env)
    bad = Generator(f"{KERNELS}/csrc/attn/generate.py -d nope --output_dir {{}}", "nope")
    with pytest.raises(FailedProcessError) as info:
        run_generators(GenJob("m", (bad,)), tmp_path, env=env, python=sys.executable)
    assert "exit code" in info.value.message and "generate.py" in info.value.message
    assert {p.rsplit("/", 1)[1] for p in good.sources} == {p.name for p in (tmp_path / "m" / "blob").iterdir()}


def test_a_file_named_in_the_command_decides_a_rerun(tmp_path: Path) -> None:
    """A tuned-config CSV passed by path (not through {qola_configs}) is hashed into the stamp: editing it
    reruns the generator, an untouched one still skips."""
    script = tmp_path / "gen.py"
    script.write_text(
        "import sys, pathlib\nsrc, out = sys.argv[1], sys.argv[2]\n"
        "rows = pathlib.Path(src).read_text().split()\n"
        "for r in rows:\n    (pathlib.Path(out) / f'k_{r}.cpp').write_text('int x;\\n')\n"
    )
    csv = tmp_path / "tuned.csv"
    csv.write_text("a\nb\n")
    gen = Generator(f"{script} {csv} {{}}", "csv")
    env = {"PATH": "/usr/bin:/bin"}
    first = run_generators(GenJob("m", (gen,)), tmp_path / "gen", env=env)
    assert {p.rsplit("/", 1)[1] for p in first.sources} == {"k_a.cpp", "k_b.cpp"}
    assert run_generators(GenJob("m", (gen,)), tmp_path / "gen", env=env).skipped
    csv.write_text("a\nc\n")
    edited = run_generators(GenJob("m", (gen,)), tmp_path / "gen", env=env)
    assert not edited.skipped and {p.rsplit("/", 1)[1] for p in edited.sources} == {"k_a.cpp", "k_c.cpp"}


def test_a_rerun_generator_keeps_unchanged_files_untouched(tmp_path: Path) -> None:
    """Issue 12 (rebuild cost): a generator that reruns (an edited comment changes its stamp) but writes
    the same bytes leaves those files as they were (same inode and mtime: ninja recompiles nothing);
    a changed file is replaced, one no longer generated is removed, a new one appears."""
    script = tmp_path / "gen.py"
    body = (
        "import pathlib, sys\nout = pathlib.Path(sys.argv[1])\n"
        "for n in {names}:\n    (out / f'k_{{n}}.cpp').write_text('int k_' + n + ' = {value};\\n')\n"
        "(out / 'sub').mkdir()\n(out / 'sub' / 'api.cpp').write_text('int api;\\n')\n"
    )
    script.write_text(body.format(names="'abc'", value=1))
    gen = Generator(f"{script} {{}}", "k")
    env = {"PATH": "/usr/bin:/bin"}
    blob = tmp_path / "gen" / "m" / "blob"
    first = run_generators(GenJob("m", (gen,)), tmp_path / "gen", env=env)
    before = {p.relative_to(blob).as_posix(): (p.stat().st_ino, p.stat().st_mtime_ns) for p in blob.rglob("*.cpp")}
    assert set(before) == {"k_a.cpp", "k_b.cpp", "k_c.cpp", "sub/api.cpp"} and len(first.sources) == 4

    script.write_text("# a comment: the output does not change\n" + body.format(names="'abc'", value=1))
    again = run_generators(GenJob("m", (gen,)), tmp_path / "gen", env=env)
    assert not again.skipped, "the edited generator must rerun"
    after = {p.relative_to(blob).as_posix(): (p.stat().st_ino, p.stat().st_mtime_ns) for p in blob.rglob("*.cpp")}
    assert after == before, "byte-identical output must keep every file's inode and mtime"

    changed = body.format(names="'abd'", value=1)
    script.write_text(changed.replace("'int k_' + n", "('long k_' if n == 'b' else 'int k_') + n"))
    third = run_generators(GenJob("m", (gen,)), tmp_path / "gen", env=env)
    now = {p.relative_to(blob).as_posix(): (p.stat().st_ino, p.stat().st_mtime_ns) for p in blob.rglob("*.cpp")}
    assert set(now) == {"k_a.cpp", "k_b.cpp", "k_d.cpp", "sub/api.cpp"}  # k_c gone, k_d new
    assert now["k_a.cpp"] == before["k_a.cpp"] and now["sub/api.cpp"] == before["sub/api.cpp"]
    assert now["k_b.cpp"] != before["k_b.cpp"] and (blob / "k_b.cpp").read_text() == "long k_b = 1;\n"
    assert {p.rsplit("/", 1)[1] for p in third.sources} == {"k_a.cpp", "k_b.cpp", "k_d.cpp", "api.cpp"}
    assert not [p for p in (tmp_path / "gen" / "m").iterdir() if p.name.startswith(".")]


@pytest.mark.parametrize("special", ["fifo", "dir", "socket"])
def test_a_special_file_named_py_beside_a_generator_is_ignored_not_waited_on(tmp_path: Path, special: str) -> None:
    """A FIFO named ``*.py`` beside a generator script: the old stamp opened it for reading and
    waited for a writer forever (SIGTERM could not end that build); the guessed digest then refused
    it and failed the module. The generator never reads it, so it is no input (issue 41, depfiles):
    the module generates, and a second run is up to date. A directory or a socket likewise. Run in
    a child, with a hang guard."""
    import os
    import socket
    import subprocess

    gen = tmp_path / "gen"
    gen.mkdir()
    (gen / "generate.py").write_text(
        "import sys, pathlib\nout = pathlib.Path(sys.argv[sys.argv.index('--output_dir') + 1])\n"
        "out.mkdir(parents=True, exist_ok=True)\n(out / 'a.cu').write_text('int a;\\n')\n"
    )
    odd = gen / "odd.py"
    if special == "fifo":
        os.mkfifo(odd)
    elif special == "dir":
        odd.mkdir()
        (odd / "x.txt").write_text("")
    else:
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(odd))
    code = (
        "import os, sys\n"
        "from qola.compile.codegen import GenJob, GenResult, run_generators\n"
        "from qola.core.errors import QolaError\n"
        "from qola.plan.planner import Generator\n"
        f"job = GenJob('m', (Generator({str(gen / 'generate.py')!r} + ' --output_dir {{}}'),))\n"
        f"out = __import__('pathlib').Path({str(tmp_path / 'out')!r})\n"
        "try:\n"
        "    runs = [run_generators(job, out, env={'PATH': os.environ['PATH']}) for _ in range(2)]\n"
        "except QolaError as exc:\n"
        "    print(exc.message); sys.exit(2)\n"
        "print('ran', [r.skipped for r in runs], [os.path.basename(s) for s in runs[1].sources]); sys.exit(0)\n"
    )
    try:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail("the generator stage waited on a special file named *.py (hung)")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip() == "ran [False, True] ['a.cu']", proc.stdout


def test_a_patch_left_half_applied_beside_a_generator_is_said(tmp_path: Path) -> None:
    """ck-jit's ``full`` patches CK's generator with its codegen hints and reverts it afterwards; a hunk
    that does not apply or revert leaves ``*.rej``/``*.orig`` beside the file (issue 39). qola names
    them when it runs that generator, and says nothing for a clean tree."""
    gen_dir = tmp_path / "01_fmha"
    (gen_dir / "codegen" / "ops").mkdir(parents=True)
    script = gen_dir / "generate.py"
    script.write_text("import sys, pathlib\n(pathlib.Path(sys.argv[1]) / 'k.cpp').write_text('int k;\\n')\n")
    env = {"PATH": "/usr/bin:/bin"}
    clean = run_generators(GenJob("m", (Generator(f"{script} {{}}"),)), tmp_path / "gen", env=env)
    assert clean.warnings == ()
    (gen_dir / "codegen" / "ops" / "fmha_fwd.py.rej").write_text("@@ -1 +1 @@\n")
    (gen_dir / "codegen" / "ops" / "fmha_fwd.py.orig").write_text("x = 1\n")
    left = run_generators(GenJob("m", (Generator(f"{script} {{}}"),)), tmp_path / "gen", env=env, force=True)
    (w,) = left.warnings
    assert "codegen/ops/fmha_fwd.py.orig, codegen/ops/fmha_fwd.py.rej" in w and str(script) in w, w


def test_an_editors_dangling_lock_file_beside_a_generator_is_ignored(tmp_path: Path) -> None:
    """An editor leaves ``.#generate.py`` (a dangling link) beside the file being edited: every ``*.py``
    beside a generator is hashed, and the old hash failed the module ("cannot run its generators:
    No such file or directory", issue 41). The generator never reads it: it is no input, dangling or
    not (the generators' depfiles, issue 41)."""
    gen_dir = tmp_path / "gen_dir"
    gen_dir.mkdir()
    script = gen_dir / "generate.py"
    script.write_text("import sys, pathlib\n(pathlib.Path(sys.argv[1]) / 'k.cpp').write_text('int k;\\n')\n")
    (gen_dir / ".#generate.py").symlink_to("user@host.4242:1700000000")
    env = {"PATH": "/usr/bin:/bin"}
    done = run_generators(GenJob("m", (Generator(f"{script} {{}}"),)), tmp_path / "gen", env=env)
    assert [Path(s).name for s in done.sources] == ["k.cpp"]
    (gen_dir / "user@host.4242:1700000000").write_text("x = 1\n")  # the link now names a file
    again = run_generators(GenJob("m", (Generator(f"{script} {{}}"),)), tmp_path / "gen", env=env)
    assert again.skipped  # a file the generator does not read
