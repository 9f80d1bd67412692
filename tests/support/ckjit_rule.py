"""How ROCm/ck-jit reads a compile or link line (its ``ck_build_interceptor.py`` and
``ck_post_build.py`` at 617a89b), restated from the facts of its code — none of its code is here.

ck-jit puts its interceptor at ``$ROCM_PATH/bin/hipcc`` and ``$CXX`` and decides per call:

* a call with exactly one argument among ``-v -V --version --help`` goes to the real compiler;
* a call without ``-c`` is a link: when the basename of the value of ``-o`` is
  ``[<prefix>_]libmha_(fwd|bwd)[_<suffix>].so`` its post-build takes it over (objects are the
  ``.o`` arguments and the whitespace-separated tokens of ``@file`` arguments, kept when the file
  is not empty; every argument holding ``--version-script`` or ``--exclude-libs`` is carried over;
  ``--offload-arch`` from the link line, else from the first recorded compile that has one);
  any other link goes to the real compiler;
* a call with ``-c``: the source is the first argument that does not start with ``-`` and does
  not follow a flag in :data:`VALUE_FLAGS`; the output is the value of ``-o`` (``-o X`` or
  ``-o=X``). Without both it is handled as a link (above). A source whose basename is
  ``fmha_(fwd|bwd|batch_prefill)*_api.(cu|cpp)`` is rewritten and compiled; a source whose absolute
  path holds ``/blob/`` is recorded (one NDJSON line) and its output becomes a zero-byte stub;
  anything else compiles for real.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

# flags ck-jit's interceptor knows to take their value as the next argument
VALUE_FLAGS = frozenset(
    {
        "-o",
        "-x",
        "-I",
        "-D",
        "-U",
        "-include",
        "-isystem",
        "--offload-arch",
        "--amdgpu-target",
        "-MF",
        "-arch",
        "-ccbin",
        "--compiler-bindir",
        "-Xcompiler",
        "-Xlinker",
    }
)
INFO_FLAGS = frozenset({"-v", "-V", "--version", "--help"})
LIB_RE = re.compile(r"^(?:.+_)?libmha_(fwd|bwd)(?:_.+)?\.so$")
API_RE = re.compile(r"fmha_(fwd|bwd|batch_prefill).*_api\.(cu|cpp)$")


def value_of(argv: Sequence[str], flag: str) -> str | None:
    """The value of ``flag`` as the interceptor finds it: the next argument, or after ``flag=``."""
    for i, a in enumerate(argv):
        if a == flag and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith(flag + "="):
            return a[len(flag) + 1 :]
    return None


def compile_parts(argv: Sequence[str]) -> tuple[str | None, str | None]:
    """(source, output) of a compile call (``argv[0]`` is the compiler); (None, None) without ``-c``."""
    if "-c" not in argv:
        return None, None
    positionals = []
    i = 1
    while i < len(argv):
        a = argv[i]
        if a in VALUE_FLAGS:
            i += 2
            continue
        if not a.startswith("-"):
            positionals.append(a)
        i += 1
    return (positionals[0] if positionals else None), value_of(argv, "-o")


@dataclass(frozen=True)
class Call:
    """What ck-jit makes of one call: ``kind`` is info, blob, api, compile, post_build or link."""

    kind: str
    source: str | None = None
    output: str | None = None


def as_the_compiler_sees(argv: Sequence[str]) -> list[str]:
    """A compile line of qola's graph as the compiler (ck-jit's interceptor) receives it: qola's compile
    cache, in front of every local compile (``<build>/cache/cc <compiler> <args>``), runs the compiler
    with the rest of the line unchanged."""
    first = Path(argv[0]) if argv else None
    if first is not None and first.name == "cc" and first.parent.name == "cache":
        return list(argv[1:])
    return list(argv)


def classify(argv: Sequence[str], cwd: str | os.PathLike[str]) -> Call:
    if len(argv) == 2 and argv[1] in INFO_FLAGS:
        return Call("info")
    source, output = compile_parts(argv)
    if source is None or output is None:
        out = value_of(argv, "-o")
        if out and LIB_RE.match(os.path.basename(out)):
            return Call("post_build", output=out)
        return Call("link", output=out)
    src = os.path.abspath(os.path.join(cwd, source))
    if API_RE.match(os.path.basename(src)):
        return Call("api", src, output)
    if "/blob/" in src.replace("\\", "/"):
        return Call("blob", src, output)
    return Call("compile", src, output)


def link_tokens(argv: Sequence[str], cwd: str | os.PathLike[str]) -> Iterator[str]:
    """The link's arguments with each ``@file`` replaced by its whitespace-separated tokens."""
    for a in argv:
        rsp = Path(cwd, a[1:])
        if a.startswith("@") and rsp.exists():
            yield from rsp.read_text().split()
        else:
            yield a


def link_objects(argv: Sequence[str], cwd: str | os.PathLike[str]) -> list[str]:
    """The objects the post-build links: every ``.o`` token naming an existing, non-empty file."""
    out = []
    for tok in link_tokens(argv, cwd):
        p = Path(cwd, tok)
        if tok.endswith(".o") and p.exists() and p.stat().st_size > 0:
            out.append(tok)
    return out


def ld_flags(argv: Sequence[str]) -> list[str]:
    """The link flags the post-build carries over to its own link (a ``…--version-script`` that
    ends there brings the next argument, its two-token form)."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        a = argv[i]
        if "--version-script" in a or "--exclude-libs" in a:
            out.append(a)
            if a.endswith("--version-script") and i + 1 < len(argv):
                out.append(argv[i + 1])
                i += 1
        i += 1
    return out


def arch_flags(argv: Sequence[str]) -> list[str]:
    return list(dict.fromkeys(a for a in argv if a.startswith("--offload-arch")))


# ---- what it records, and how it is replayed later ------------------------------------------------
# The interceptor records each blob compile's flags (``_extract_flags``): argv[1:] less every argument
# equal (as a string) to the source or the output as written or made absolute, ``-o`` and its value,
# ``-c``, ``-fvisibility=hidden`` and ``-fvisibility-inlines-hidden``; ``-I<p>`` / ``-isystem<p>`` (joined
# forms only) with ``p`` made relative to ``CK_JIT_AITER_DIR`` when it starts with it. Every other flag
# is kept verbatim. Its install (``_install_artifacts``) copies each blob source flat to
# ``ck_jit/blobs/<basename>`` and each relative ``-I`` dir from the AITER dir into ``ck_jit/``, and keeps
# of a blob's ``--offload-arch`` flags those of the arch family its file name ends with
# (``filter_offload_arch_flags``). Later, elsewhere, with qola's build dir gone:
# * the runtime (``ck_jit_compile.sh --blob-source <name> --blob-flags "<flags joined by spaces>"``)
#   runs ``cd <root> && hipcc -shared -fPIC $FLAGS <root>/blobs/<name> -L<rocm>/lib -lamdhip64
#   -Wl,--allow-shlib-undefined -Wl,-soname,<out name> -o <tmp beside out>``, the flags word-split;
# * TE's CI prebuild (``ck_jit_prebuild.py build``) runs, from wherever it was started, ``hipcc -shared
#   -fPIC <flags but the first (it skips argv[0], the compiler the entry no longer has), each -I/-isystem
#   made absolute against --root> <root>/blobs/<name> [-L<rocm>/lib]
#   -lamdhip64 -Wl,--allow-shlib-undefined -Wl,-soname,<stem>.so -o <cache>/tmpXXXX.so.tmp``.
# The runtime then resolves the first defined function whose name starts with the prefix of its kind.
DROP_FLAGS = frozenset({"-c", "-fvisibility=hidden", "-fvisibility-inlines-hidden"})
SYMBOL_PREFIX = {"fwd": "_Z9fmha_fwd_I", "bwd_dq_dk_dv": "_Z18fmha_bwd_dq_dk_dv_I", "bwd_dot": "_Z18fmha_bwd_dot_do_o_I",
                 "bwd_convert": "_Z20fmha_bwd_convert_dq_I"}  # fmt: skip


def _gfx950(arch: str) -> bool:
    return arch.startswith("gfx950")


def _gfx9(arch: str) -> bool:
    return arch.startswith("gfx9") and not arch.startswith("gfx950")


# the arch families of CK's file-name suffixes qola's tests meet (ck-jit's _family_matches knows more)
FAMILIES: dict[str, Callable[[str], bool]] = {"gfx950": _gfx950, "gfx9": _gfx9}


def _rel(path: str, aiter_dir: str) -> str:
    return os.path.relpath(path, aiter_dir) if aiter_dir and path.startswith(aiter_dir) else path


def extract_flags(argv: Sequence[str], source: str, output: str, cwd: str, aiter_dir: str) -> list[str]:
    """The flags the interceptor records for a compile line (the rule above)."""
    gone = {source, os.path.abspath(os.path.join(cwd, source)), output, os.path.abspath(os.path.join(cwd, output))}
    out: list[str] = []
    i = 1
    while i < len(argv):
        a = argv[i]
        if a == "-o" and i + 1 < len(argv):
            i += 2
            continue
        if a in gone or a in DROP_FLAGS:
            pass
        elif a.startswith("-isystem"):
            out.append("-isystem" + _rel(a[len("-isystem") :], aiter_dir))
        elif a.startswith("-I"):
            out.append("-I" + _rel(a[2:], aiter_dir))
        else:
            out.append(a)
        i += 1
    return out


def family_flags(argv: Sequence[str], name: str) -> list[str]:
    """``argv`` with its ``--offload-arch`` flags (``=x`` or two-token) kept to the family the blob's
    name ends with (all of them when it names no known family or none match), as the install writes
    each entry."""
    suffix = Path(name).stem.rsplit("_", 1)[-1]
    match = FAMILIES.get(suffix)
    if match is None:
        return list(argv)
    out: list[str] = []
    kept = False
    i = 0
    while i < len(argv):
        a = argv[i]
        two = a == "--offload-arch" and i + 1 < len(argv)
        if two or a.startswith("--offload-arch="):
            arch = argv[i + 1] if two else a.split("=", 1)[1]
            if match(arch):
                out += [a, argv[i + 1]] if two else [a]
                kept = True
            i += 2 if two else 1
            continue
        out.append(a)
        i += 1
    return out if kept else list(argv)
