"""A generator in CK's style that records the argv it was given (issue 51 item 2): ``--filter`` is an
fnmatch pattern (``,``-separated any-of, as a plain generator; ``|`` any-of under qola's shim),
``--list_blobs FILE`` lists, ``--output_dir DIR`` writes one source per kernel that passes."""

from __future__ import annotations

import os
from pathlib import Path

from qola.plan.model import Generator

ONE_ARG_MAX = 128 * 1024  # Linux's MAX_ARG_STRLEN: one argument, its NUL included

GEN = """
import fnmatch, json, os, pathlib, sys
args = sys.argv[1:]
pathlib.Path(os.environ["GEN_ARGV"]).write_text(json.dumps(args))
names = ["k_a", "k_b", "k_c"]
if "--filter" in args:
    pats = args[args.index("--filter") + 1].split(",")
    names = [n for n in names if any(fnmatch.fnmatch(n, p) for p in pats)]
if "--list_blobs" in args:
    pathlib.Path(args[args.index("--list_blobs") + 1]).write_text("".join(f"x/{n}.cpp\\n" for n in names))
else:
    out = pathlib.Path(args[args.index("--output_dir") + 1])
    out.mkdir(parents=True, exist_ok=True)
    for n in names:
        (out / f"{n}.cpp").write_text("int x;\\n")
"""


def argv_generator(tmp: Path) -> tuple[Generator, dict[str, str], Path]:
    """(the generator, the environment its runs take, the file its last run's argv goes to)."""
    script = tmp / "gen" / "gen.py"
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(GEN)
    seen = tmp / "argv.json"
    env = {"PATH": os.environ["PATH"], "XDG_CACHE_HOME": str(tmp / "cache"), "GEN_ARGV": str(seen)}
    return Generator(f"{script} --output_dir {{}}"), env, seen


def huge_filter(kept: str, sep: str, size: int = 10 * ONE_ARG_MAX) -> str:
    """A filter of ``size`` bytes or more (10× the one-argument limit by default): many patterns
    that match nothing, and ``kept``, joined by ``sep``."""
    pad = [f"k_none_{i:05d}_{'x' * 1000}*" for i in range(size // 1000 + 1)]  # few, long: fnmatch is slow per pattern
    return sep.join([*pad, kept])


ARG_MAX = 2 * 1024 * 1024  # Linux's limit on a whole command line (argv and environment): a quarter of an 8 MiB stack


def many_names(prefix: str, size: int = 10 * ARG_MAX, length: int = 200) -> list[str]:
    """Distinct names of about ``length`` bytes each (within a file name's 255), ``size`` bytes or
    more together: a list as long as 10× the whole command line's limit by default."""
    return [f"{prefix}{i:07d}_{'x' * length}" for i in range(size // length + 1)]
