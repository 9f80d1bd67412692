"""Generators have depfiles (issue 41): a generator's listing (``--list_blobs``, cached across plans)
and its generation (skipped by its stamp) are keyed by what the generator actually read, recorded by
qola's wrapper (qola.plan.genread): a helper module imported from another directory, a data file it
opens, the real directory of a symlinked generator, a variable it looks up. A generator that starts
another program is never reused; files beside it that it never reads (an editor's dangling
``.#gen.py``, a FIFO) are no input. The listing runs under the environment the generation gets.

Each fixture generator appends one line per run to ``$GEN_CALLS``."""

from __future__ import annotations

import json
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from support.common import KERNELS, run_qola

from qola.compile.codegen import GenJob, run_generators
from qola.plan.genrules import aiter_env
from qola.plan.listing import list_blobs
from qola.plan.model import Generator

GEN = """
import os, pathlib, sys
{prelude}
args = sys.argv[1:]
with open(os.environ["GEN_CALLS"], "a") as fh:
    fh.write(" ".join(args) + "\\n")
names = list(helper.NAMES)
{more}
names = [n + os.environ.get("GEN_SUFFIX", "") for n in names]
if "--list_blobs" in args:
    pathlib.Path(args[args.index("--list_blobs") + 1]).write_text("".join(f"x/{{n}}.cpp\\n" for n in names))
else:
    out = pathlib.Path(args[args.index("--output_dir") + 1])
    out.mkdir(parents=True, exist_ok=True)
    for n in names:
        (out / f"{{n}}.cpp").write_text("int x;\\n")
"""


@dataclass(frozen=True)
class Fixture:
    root: Path
    gen: Generator
    env: dict[str, str]

    def runs(self) -> tuple[int, int]:
        """(listing runs, generation runs) so far."""
        calls = self.root / "calls"
        lines = calls.read_text().splitlines() if calls.exists() else []
        listed = sum("--list_blobs" in ln for ln in lines)
        return listed, len(lines) - listed

    def both(self, env: dict[str, str] | None = None) -> tuple[list[str], list[str], bool]:
        """(the listing's stems, the generated files' stems, whether generation was skipped)."""
        e = env or self.env
        listed = list_blobs(self.gen, e)
        done = run_generators(GenJob("m", (self.gen,)), self.root / "build", env=e)
        return sorted(listed), sorted(Path(s).stem for s in done.sources), done.skipped


def fixture(tmp: Path, prelude: str, more: str = "", script: Path | None = None) -> Fixture:
    """A generator ``script`` (default ``tmp/gen/gen.py``) whose helper module lies in ``tmp/lib``."""
    lib = tmp / "lib"
    lib.mkdir(exist_ok=True)
    (lib / "helper.py").write_text("NAMES = ['k_a', 'k_b']\n")
    script = script or tmp / "gen" / "gen.py"
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(GEN.format(prelude=prelude, more=more))
    env = {"PATH": os.environ["PATH"], "XDG_CACHE_HOME": str(tmp / "cache"), "GEN_CALLS": str(tmp / "calls")}
    return Fixture(tmp, Generator(f"{script} --output_dir {{}}"), env)


def imports_from(lib: Path) -> str:
    return f"sys.path.insert(0, {str(lib)!r})\nimport helper"


def test_a_helper_imported_from_another_directory_reruns_listing_and_generation(tmp_path: Path) -> None:
    """AITER's mha_fwd_generate.py: sys.path.insert(0, AITER_CORE_DIR), then `from chip_info import …`."""
    fx = fixture(tmp_path, imports_from(tmp_path / "lib"))
    assert fx.both() == (["k_a", "k_b"], ["k_a", "k_b"], False) and fx.runs() == (1, 1)
    assert fx.both() == (["k_a", "k_b"], ["k_a", "k_b"], True) and fx.runs() == (1, 1)  # both reused
    # another size: Python itself reuses a module's .pyc while the source's size and mtime second match
    (tmp_path / "lib" / "helper.py").write_text("NAMES = ['k_a', 'k_cc']\n")
    assert fx.both() == (["k_a", "k_cc"], ["k_a", "k_cc"], False) and fx.runs() == (2, 2)
    assert fx.both()[2] and fx.runs() == (2, 2)


def test_a_data_file_the_generator_reads_reruns_it_and_so_does_an_optional_one_appearing(tmp_path: Path) -> None:
    data, optional = tmp_path / "data" / "names.txt", tmp_path / "data" / "extra.txt"
    data.parent.mkdir()
    data.write_text("k_d\n")
    more = (
        f"names += pathlib.Path({str(data)!r}).read_text().split()\n"
        f"try:\n    names += open({str(optional)!r}).read().split()\nexcept FileNotFoundError:\n    pass\n"
    )
    fx = fixture(tmp_path, imports_from(tmp_path / "lib"), more)
    assert fx.both() == (["k_a", "k_b", "k_d"], ["k_a", "k_b", "k_d"], False)
    data.write_text("k_e\n")
    assert fx.both() == (["k_a", "k_b", "k_e"], ["k_a", "k_b", "k_e"], False) and fx.runs() == (2, 2)
    optional.write_text("k_f\n")  # absent when read: its appearance counts
    assert fx.both() == (["k_a", "k_b", "k_e", "k_f"], ["k_a", "k_b", "k_e", "k_f"], False)
    assert fx.both()[2] and fx.runs() == (3, 3)


def test_a_symlinked_generator_whose_real_directory_holds_its_helper(tmp_path: Path) -> None:
    """`python link/gen.py` puts the link's real directory on sys.path: `import helper` finds it there."""
    real = tmp_path / "real"
    fx = fixture(tmp_path, "import helper", script=real / "gen.py")
    shutil.copy(tmp_path / "lib" / "helper.py", real / "helper.py")
    link = tmp_path / "tree" / "gen.py"
    link.parent.mkdir()
    link.symlink_to(real / "gen.py")
    fx = Fixture(tmp_path, Generator(f"{link} --output_dir {{}}"), fx.env)
    assert fx.both() == (["k_a", "k_b"], ["k_a", "k_b"], False)
    assert fx.both()[2] and fx.runs() == (1, 1)
    (real / "helper.py").write_text("NAMES = ['k_z']\n")
    assert fx.both() == (["k_z"], ["k_z"], False) and fx.runs() == (2, 2)


def test_a_variable_the_generator_looks_up_reruns_it_and_one_it_does_not_read_is_no_input(tmp_path: Path) -> None:
    fx = fixture(tmp_path, imports_from(tmp_path / "lib"))
    fx.both()
    assert fx.both(fx.env | {"UNREAD_BY_GEN": "1"})[2] and fx.runs() == (1, 1)  # neither runs
    assert fx.both(fx.env | {"GEN_SUFFIX": "_x"}) == (["k_a_x", "k_b_x"], ["k_a_x", "k_b_x"], False)
    assert fx.runs() == (2, 2)
    assert fx.both(fx.env | {"GEN_SUFFIX": "_x"})[2] and fx.runs() == (2, 2)
    assert fx.both() == (["k_a", "k_b"], ["k_a", "k_b"], False)  # unset again: absent was recorded too


def test_a_generator_that_starts_a_program_is_never_reused(tmp_path: Path) -> None:
    more = f"import subprocess\nsubprocess.run([{sys.executable!r}, '-c', 'pass'], check=True)\n"
    fx = fixture(tmp_path, imports_from(tmp_path / "lib"), more)
    for n in (1, 2, 3):
        assert fx.both() == (["k_a", "k_b"], ["k_a", "k_b"], False) and fx.runs() == (n, n)


def test_a_toolchain_probe_is_an_input_not_an_unknown_program(tmp_path: Path) -> None:
    """AITER's cpp_extension runs `hipconfig --version` at import (shutil.which, then subprocess): that
    probe is recorded as an input (the file that ran), so AITER's API generators are still reused;
    another hipconfig reruns them."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    probe = bin_dir / "hipconfig"
    probe.write_text("#!/bin/sh\nprintf 6.4.1\n")
    probe.chmod(0o755)
    more = "import shutil, subprocess\nnames.append('v' + subprocess.check_output([shutil.which('hipconfig'), '--version'], text=True).replace('.', '_'))\n"
    fx = fixture(tmp_path, imports_from(tmp_path / "lib"), more)
    env = fx.env | {"PATH": f"{bin_dir}:{fx.env['PATH']}"}
    assert fx.both(env) == (["k_a", "k_b", "v6_4_1"], ["k_a", "k_b", "v6_4_1"], False)
    assert fx.both(env)[2] and fx.runs() == (1, 1)
    probe.write_text("#!/bin/sh\nprintf 7.2.0\n")
    assert fx.both(env) == (["k_a", "k_b", "v7_2_0"], ["k_a", "k_b", "v7_2_0"], False) and fx.runs() == (2, 2)


def test_unreadable_neighbours_it_never_reads_are_ignored(tmp_path: Path) -> None:
    """An editor's dangling `.#gen.py` and a FIFO named *.py beside the generator: never opened by it,
    so neither fails the module nor keeps listing and generation from being reused."""
    fx = fixture(tmp_path, imports_from(tmp_path / "lib"))
    gen_dir = tmp_path / "gen"
    (gen_dir / ".#gen.py").symlink_to("user@host.4242:1700000000")
    os.mkfifo(gen_dir / "pipe.py")
    assert fx.both() == (["k_a", "k_b"], ["k_a", "k_b"], False)
    assert fx.both()[2] and fx.runs() == (1, 1)


ARCH_GEN = """
import fnmatch, os, pathlib, sys
args = sys.argv[1:]
archs = os.environ.get("GPU_ARCHS", "gfx90a;gfx942;gfx950").split(";")  # chip_info's: else ask the GPU
names = [f"k_{a}" for a in archs]
if "--filter" in args:
    pats = args[args.index("--filter") + 1].split(",")
    names = [n for n in names if any(fnmatch.fnmatch(n, p) for p in pats)]
if "--list_blobs" in args:
    pathlib.Path(args[args.index("--list_blobs") + 1]).write_text("".join(f"{n}.cpp\\n" for n in names))
else:
    out = pathlib.Path(args[args.index("--output_dir") + 1])
    for n in names:
        (out / f"{n}.cpp").write_text("int x;\\n")
"""


def test_the_listing_gets_the_environment_the_generation_gets(tmp_path: Path) -> None:
    """`qola variants` listed 48 instances where the build wrote 32: the listing ran without GPU_ARCHS."""
    tree = tmp_path / "tree"
    shutil.copytree(KERNELS, tree, ignore=shutil.ignore_patterns("__pycache__", "*.co"))
    (tree / "csrc" / "archgen.py").write_text(ARCH_GEN)
    m = tmp_path / "q.toml"
    m.write_text(
        '[qola]\nnamespace = "qk"\n[build]\narchitectures = ["gfx942"]\n'
        '[[modules]]\nname = "libarch"\nblob_gen_cmd = ["csrc/archgen.py --output_dir {}"]\n'
        '[[variants]]\nmodule = "libarch"\npattern = "k_*"\n'
    )
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    proc = run_qola("variants", "-m", str(m), "--aiter-root", str(tree), "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    listed = {n for row in json.loads(proc.stdout)["variants"] for n in row["instances"]}
    gen = Generator(f"{tree / 'csrc' / 'archgen.py'} --output_dir {{}}")
    genv = {"PATH": os.environ["PATH"], **aiter_env(("gfx942",), tree)}  # what the build's generation gets
    done = run_generators(GenJob("m", (gen,)), tmp_path / "build", env=genv)
    assert listed == {Path(s).stem for s in done.sources} == {"k_gfx942"}


SAVED_DURING_RUN = """
read = pathlib.Path({data!r}).read_text().split()
names += read
if read == ["k_d"]:  # an editor's save while the generator runs: a new file renamed over the one it read
    pathlib.Path({tmp!r}).write_text("k_ee\\n")
    os.replace({tmp!r}, {data!r})
"""


def test_an_input_saved_while_the_generator_runs_is_recorded_as_read_and_reruns_it(tmp_path: Path) -> None:
    """The record hashed each file when the run ended: the next build and plan reused a run (and a
    listing) that read the old content. The digest is taken when the generator opens the file."""
    data = tmp_path / "data" / "names.txt"
    data.parent.mkdir()
    data.write_text("k_d\n")
    more = SAVED_DURING_RUN.format(data=str(data), tmp=str(data.with_suffix(".tmp")))
    fx = fixture(tmp_path, imports_from(tmp_path / "lib"), more)
    listed = list_blobs(fx.gen, fx.env)  # read k_d, then saved k_ee
    assert sorted(listed) == ["k_a", "k_b", "k_d"] and data.read_text() == "k_ee\n"
    assert sorted(list_blobs(fx.gen, fx.env)) == ["k_a", "k_b", "k_ee"] and fx.runs() == (2, 0)
    data.write_text("k_d\n")
    first = run_generators(GenJob("m", (fx.gen,)), tmp_path / "build", env=fx.env)
    assert sorted(Path(s).stem for s in first.sources) == ["k_a", "k_b", "k_d"]
    assert fx.both() == (["k_a", "k_b", "k_ee"], ["k_a", "k_b", "k_ee"], False) and fx.runs() == (2, 2)
    assert fx.both()[2] and fx.runs() == (2, 2)


def test_a_path_looked_at_and_skipped_reruns_it_when_it_appears(tmp_path: Path) -> None:
    """AITER's generators open an optional input only `if os.path.exists(…)`: its appearance counts,
    as does a path `pathlib`'s `is_file()` found absent."""
    optional, other = tmp_path / "data" / "extra.txt", tmp_path / "data" / "more.txt"
    more = (
        f"if os.path.exists({str(optional)!r}):\n    names += open({str(optional)!r}).read().split()\n"
        f"if pathlib.Path({str(other)!r}).is_file():\n    names += pathlib.Path({str(other)!r}).read_text().split()\n"
    )
    fx = fixture(tmp_path, imports_from(tmp_path / "lib"), more)
    assert fx.both() == (["k_a", "k_b"], ["k_a", "k_b"], False)
    assert fx.both()[2] and fx.runs() == (1, 1)
    optional.parent.mkdir()
    optional.write_text("k_f\n")
    assert fx.both() == (["k_a", "k_b", "k_f"], ["k_a", "k_b", "k_f"], False) and fx.runs() == (2, 2)
    other.write_text("k_g\n")
    assert fx.both() == (["k_a", "k_b", "k_f", "k_g"], ["k_a", "k_b", "k_f", "k_g"], False)
    assert fx.both()[2] and fx.runs() == (3, 3)


def test_a_variable_read_through_environb_reruns_it(tmp_path: Path) -> None:
    more = 'names = [n + os.environb.get(b"GEN_B_SUFFIX", b"").decode() for n in names]\n'
    fx = fixture(tmp_path, imports_from(tmp_path / "lib"), more)
    assert fx.both() == (["k_a", "k_b"], ["k_a", "k_b"], False)
    assert fx.both()[2] and fx.runs() == (1, 1)
    assert fx.both(fx.env | {"GEN_B_SUFFIX": "_y"}) == (["k_a_y", "k_b_y"], ["k_a_y", "k_b_y"], False)
    assert fx.runs() == (2, 2)
