"""Compile lines that replay anywhere: the rule every compile line qola writes obeys.

A compiler wrapper may record a compile line and run its flags again later, from another directory,
on another machine, after qola's build dir is gone: ROCm/ck-jit's interceptor keeps every flag of a
CK kernel's line verbatim (less the source, ``-o``, ``-c`` and the visibility flags) for its runtime
(``ck_jit_compile.sh``, at a kernel's first use) and for TE's CI prebuild (``ck_jit_prebuild.py``).
So a line's flags may name no file that the compiler **writes** (``-MF``, ``-MJ``, ``-Wa,--MD,…``)
or **reads** by name (``-include``, ``-imacros``, ``@file``, a profile or ignore list) in or
relative to the build dir (ninja runs every command there). Only the source and ``-o`` are the
line's own; ninja's header dependencies come from ``-MD`` alone, which writes the depfile the
compiler derives from ``-o`` (:func:`depfile_of`: clang, gcc and nvcc alike), beside the object.

A search dir (``-I``, ``-isystem``, …) is a place to look, not a file: a missing one is skipped, so an
absolute one inside the build dir leaves the line replayable as long as what the unit includes is
found elsewhere (tests/clients/test_ckjit_replay.py compiles kernels that way with the build dir moved
away). A relative one is refused: it names a different place from every other directory.

One build-dir read is allowed by name: qola's switch probe (``-include <build>/obj/<module>/
qola_switches_<i>.h``, :mod:`qola.output.kernels`), force-included only into a source that gates a
library's kernel paths on a registry switch — AITER's ``mha_fwd``/``mha_bwd``, the library's entry
point. A client that deferred that unit would leave the library without its entry point, which qola's
unresolved-symbol check refuses (the module fails), so no successful build hands such a line to a
replay. The graph names these files (``Target.entry_reads``); any other build-dir read is refused.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass

# flags whose value (the next argument, or joined: ``-MFx``, ``-MF=x``) is a file the compiler writes
WRITES = ("-MF", "-MJ", "-dependency-file", "--dependency-output")
# ... or reads by name
READS = ("-include", "--include", "-imacros", "-include-pch", "--options-file", "-optf")
# ... and those that take it only after ``=`` (alone they take none)
READS_EQ = ("-fprofile-use=", "-fprofile-instr-use=", "-fprofile-sample-use=", "-fsanitize-ignorelist=",
            "-fsanitize-blacklist=")  # fmt: skip
# target names for the depfile: nothing to do with where the line runs, but a wrapper that does not
# know them reads their value as the source (ck-jit did, issue 31); the target is -o's
NEVER = frozenset({"-MT", "-MQ"})
SEARCH = ("-I", "-isystem", "-iquote", "-idirafter", "-iprefix")


def depfile_of(obj: str) -> str:
    """The depfile ``-MD`` writes for ``-o obj`` (clang, gcc, nvcc): ``obj`` with its suffix replaced
    by ``.d`` (``obj/m/a-1f.o`` -> ``obj/m/a-1f.d``)."""
    stem, ext = posixpath.splitext(obj)
    return (stem if ext else obj) + ".d"


def split_depfile(text: str) -> list[str]:
    """The prerequisites of a Makefile depfile (backslash-newlines joined, escaped spaces kept)."""
    text = text.replace("\\\r\n", " ").replace("\\\n", " ")
    out: list[str] = []
    for line in text.splitlines():
        _, sep, rest = line.partition(": ")
        if not sep:
            continue
        tok, i = "", 0
        while i < len(rest):
            c = rest[i]
            if c == "\\" and i + 1 < len(rest) and rest[i + 1] == " ":
                tok += " "
                i += 2
                continue
            if c.isspace():
                if tok:
                    out.append(tok)
                tok = ""
            else:
                tok += c
            i += 1
        if tok:
            out.append(tok)
    return out


def option(argv: Sequence[str], name: str) -> str | None:
    """The value after the first ``name`` in ``argv`` (None: not there)."""
    for i, a in enumerate(argv[:-1]):
        if a == name:
            return argv[i + 1]
    return None


def depfile_named(argv: Sequence[str]) -> str | None:
    """Where compile ``argv`` writes its depfile: ``-MF``'s value, else the one ``-MD``/``-MMD`` names
    after ``-o`` (qola's lines: :func:`depfile_of`); None without either."""
    named = option(argv, "-MF")
    if named is not None or not ({"-MD", "-MMD"} & set(argv)):
        return named
    obj = option(argv, "-o")
    return depfile_of(obj) if obj is not None else None


@dataclass(frozen=True)
class Violation:
    flag: str  # the flag as written (with its value)
    why: str

    def __str__(self) -> str:
        return f"{self.flag!r}: {self.why}"


def _in(path: str, build_dir: str) -> str | None:
    """Why ``path`` is not a place a replayed line can name (None: it is)."""
    if path.startswith("$"):
        return f"names {path!r}, a path ninja makes relative to the build dir"
    if not os.path.isabs(path):
        return f"names {path!r} relative to the build dir, where ninja runs it"
    root = os.path.normpath(build_dir)
    if os.path.normpath(path) == root or os.path.normpath(path).startswith(root + os.sep):
        return f"names {path!r} in the build dir, which is gone when the line is replayed"
    return None


def _valued(argv: Sequence[str], names: Sequence[str]) -> Iterator[tuple[str, str]]:
    """(flag as written, its value) for each of ``names`` in ``argv``, in any spelling:
    ``-F v``, ``-Fv``, ``-F=v``."""
    i = 0
    while i < len(argv):
        a = argv[i]
        for n in names:
            if a == n and i + 1 < len(argv):
                yield f"{a} {argv[i + 1]}", argv[i + 1]
                i += 1
                break
            if a.startswith(n) and a != n and not _longer_flag(a, n, names):
                yield a, a[len(n) :].removeprefix("=")
                break
        i += 1


def _longer_flag(a: str, n: str, names: Sequence[str]) -> bool:
    """``a`` is a longer flag of ``names`` that starts with ``n`` (``-include-pch`` vs ``-include``)."""
    return any(m != n and m.startswith(n) and a.startswith(m) for m in names)


def _passed_through(a: str) -> list[str]:
    """The sub-tool arguments of ``-Wp,-MD,f`` / ``-Wa,--MD,f`` / ``-Wp,-MF,f`` (comma-separated), which
    the driver passes to the preprocessor or the assembler."""
    for p in ("-Wp,", "-Wa,"):
        if a.startswith(p):
            return a[len(p) :].split(",")
    return []


def violations(argv: Sequence[str], build_dir: str, entry_reads: Collection[str] = ()) -> list[Violation]:
    """What in the compile line ``argv`` (a command template or a flag list) would not replay from
    another directory once ``build_dir`` is gone; [] when it is portable. ``entry_reads``: build-dir
    files the line may read all the same (qola's switch probe, force-included only into a library's
    entry-point source: no client can defer that unit and still link, see the module's text)."""
    out: list[Violation] = []
    for a in argv:
        if a in NEVER or any(a.startswith(n) and a != n for n in NEVER):
            out.append(
                Violation(a, "a depfile target flag: the target is -o's (and a wrapper reads its value as the source)")
            )
        elif a.startswith("@") and len(a) > 1:
            why = _in(a[1:], build_dir)
            if why:
                out.append(Violation(a, f"a response file that {why}"))
        sub = _passed_through(a)
        for _flag, value in _valued(sub, ("-MD", "-MMD", "--MD", *WRITES)):
            why = _in(value, build_dir)
            if why:
                out.append(Violation(a, f"a file written through the driver that {why}"))
    for flag, value in _valued(argv, WRITES):
        why = _in(value, build_dir)
        if why:
            out.append(Violation(flag, f"a file the compiler writes that {why}"))
    eq = [(a, a.split("=", 1)[1]) for a in argv if a.startswith(READS_EQ)]
    for flag, value in [*_valued(argv, READS), *eq]:
        why = None if value in entry_reads else _in(value, build_dir)
        if why:
            out.append(Violation(flag, f"a file the compiler reads that {why}"))
    for flag, value in _valued(argv, SEARCH):
        if value and not value.startswith("$") and not os.path.isabs(value):
            out.append(Violation(flag, f"a search dir relative to the build dir ({value!r})"))
    return out
