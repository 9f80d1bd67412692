"""Syntax rules for the names qola turns into C identifiers, file names and ninja targets.

One home for them: the manifest (namespace, module names, ``md_name``, architectures, commit
pins, versions, ``drop_srcs`` patterns) and the kernel tree's module table (module keys, table
``md_name``) are checked here, so a name from the tree passes exactly the checks a name from the
manifest passes. Every pattern ends in ``\\Z`` (``$`` also matches before a trailing newline, so
``"x\\n"`` would pass): ``.match`` and ``.fullmatch`` both test the whole string.

Lengths are bounded so that every file named after a module fits the file system's 255-byte
limit: ``<namespace>_<md_name>`` plus qola's suffixes and temporary-file prefixes stays well under
it (a 300-character namespace used to fail with ENAMETOOLONG after compiling).

Pure functions, no state; each ``*_problem`` returns ``None`` for a good value, else what is wrong
with it as a phrase ("contains a space") for the caller's message (:func:`check_name` and
:func:`check_namespace` raise it as a QolaError). Keywords are rejected here only, for every
namespace qola is given (manifest, ``qola embed``/``audit``, output files, link steps).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Collection, Iterable

from qola.core.errors import QolaError
from qola.core.secret import UnsplittableURL, split_url

C_IDENT_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
# AMD target IDs: a processor and the target features LLVM allows in them (xnack, sramecc)
GFX_RE = re.compile(r"gfx[0-9]{2,4}[a-z]?(?::(?:xnack|sramecc)[+-])*\Z")
SM_RE = re.compile(r"sm_([0-9]{2,3})([af]?)\Z")  # groups: compute capability digits, a/f suffix
SHA_RE = re.compile(r"[0-9a-f]{4,40}\Z")
VERSION_RE = re.compile(r"[0-9]+(?:\.[0-9]+){0,2}\Z")

MAX_NAMESPACE = 64  # [qola].namespace
MAX_NAME = 96  # a module key, a module's md_name
MAX_LIBRARY_NAME = MAX_NAMESPACE + 1 + MAX_NAME  # "<namespace>_<md_name>", the stem of its files

# C (C23) and C++ (C++23) keywords and alternative tokens: a namespace becomes `namespace <ns>` and
# the `<ns>_` prefix, so it must be none of them
C_KEYWORDS = frozenset(
    "alignas alignof and and_eq asm auto bitand bitor bool break case catch char char8_t char16_t char32_t "  # noqa: SIM905 (a word table)
    "class co_await co_return co_yield compl concept const const_cast consteval constexpr constinit continue "
    "decltype default delete do double dynamic_cast else enum explicit export extern false float for friend "
    "goto if inline int long mutable namespace new noexcept not not_eq nullptr operator or or_eq private "
    "protected public register reinterpret_cast requires restrict return short signed sizeof static "
    "static_assert static_cast struct switch template this thread_local throw true try typedef typeid "
    "typename typeof typeof_unqual union unsigned using virtual void volatile wchar_t while xor xor_eq "
    "_Alignas _Alignof _Atomic _BitInt _Bool _Complex _Decimal32 _Decimal64 _Decimal128 _Generic _Imaginary "
    "_Noreturn _Static_assert _Thread_local".split()
)


def is_c_ident(value: object) -> bool:
    return isinstance(value, str) and C_IDENT_RE.match(value) is not None


def vendor(arch: object) -> str | None:
    """``"hip"`` for a gfx target ID, ``"cuda"`` for ``sm_XX``, else None."""
    if not isinstance(arch, str):
        return None
    if GFX_RE.match(arch):
        return "hip"
    if SM_RE.match(arch):
        return "cuda"
    return None


def processor(arch: str) -> str:
    """The processor without target features: ``gfx90a:xnack-`` -> ``gfx90a``."""
    return arch.split(":", 1)[0]


# LLVM's AMDGPU processors (clang 21, `--offload-arch=`): a gfx name outside it is a typo that the
# build's compiler probe refuses; a dry run and `qola plan`, which probe nothing, refuse it by this table
AMDGPU_PROCESSORS = frozenset(
    "gfx600 gfx601 gfx602 gfx700 gfx701 gfx702 gfx703 gfx704 gfx705 gfx801 gfx802 gfx803 gfx805 gfx810 "  # noqa: SIM905 (LLVM's table)
    "gfx900 gfx902 gfx904 gfx906 gfx908 gfx909 gfx90a gfx90c gfx940 gfx941 gfx942 gfx950 "
    "gfx1010 gfx1011 gfx1012 gfx1013 gfx1030 gfx1031 gfx1032 gfx1033 gfx1034 gfx1035 gfx1036 "
    "gfx1100 gfx1101 gfx1102 gfx1103 gfx1150 gfx1151 gfx1152 gfx1153 gfx1200 gfx1201 gfx1250 gfx1251".split()
)


def archs_problem(archs: list[str] | tuple[str, ...]) -> str | None:
    """What is wrong with a list of architectures (each known, one vendor, one target ID per
    processor), or None. Whether an exact repeat is an error is the caller's policy."""
    for arch in archs:
        if vendor(arch) is None:
            return f"unknown architecture {arch!r}: expected gfx… (HIP, e.g. gfx942) or sm_… (CUDA, e.g. sm_90)"
        if vendor(arch) == "hip" and processor(arch) not in AMDGPU_PROCESSORS:
            return (
                f"unknown AMD GPU processor {processor(arch)!r}: not one of LLVM's AMDGPU processors "
                "(e.g. gfx90a, gfx942, gfx950, gfx1100)"
            )
    if len({vendor(a) for a in archs}) > 1:
        return f"architectures mix HIP and CUDA targets ({', '.join(archs)})"
    seen: dict[str, str] = {}
    for arch in archs:
        other = seen.setdefault(processor(arch), arch)
        if other != arch:
            return f"architecture {processor(arch)} is listed twice with different features ({other}, {arch})"
    return None


def arch_list_problem(archs: list[str] | tuple[str, ...]) -> str | None:
    """:func:`archs_problem`, and an exact repeat refused: the one rule for a list of architectures
    given by a user (``--arch``, ``[build].architectures``, ``GPU_ARCHS``)."""
    if "native" in archs:
        return "'native' cannot be built ahead of time: name the architectures, e.g. gfx942"
    problem = archs_problem(archs)
    if problem:
        return problem + ("; build one vendor per manifest" if "mix" in problem else "")
    if len(set(archs)) != len(archs):
        return f"architectures repeat an entry: {list(archs)}"
    return None


MAX_JOBS = 4096  # more parallel jobs than any build host has cores; ninja's own limit is an int


def bounded_jobs(count: int) -> int:
    """A job count qola computed (from CPUs, memory, a farm's report): 1 … :data:`MAX_JOBS`, the bound a
    given ``-j``/``MAX_JOBS`` is checked against."""
    return max(1, min(count, MAX_JOBS))


def count_problem(value: object, lo: int, hi: int) -> str | None:
    """A whole number ``lo`` … ``hi`` (an int, or its decimal text), or what is wrong with it."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        return f"must be a whole number, got {value!r}"
    try:
        number = int(value.strip(), 10) if isinstance(value, str) else value
    except ValueError:
        return f"must be a whole number, got {value!r}"
    return None if lo <= number <= hi else f"must be between {lo} and {hi}, got {number}"


def arch_dir_problem(arch: object) -> str | None:
    """An architecture naming a directory of code objects (``hsa/<arch>/``): a target of either
    vendor without target features (``gfx942``, ``sm_90``)."""
    if vendor(arch) is None:
        return "is not a GPU architecture (gfx…, sm_…)"
    assert isinstance(arch, str)
    if ":" in arch:
        return "has target features; code objects live under the processor's name (e.g. gfx90a)"
    return None


def _bad_chars(value: str) -> str | None:
    """What makes ``value`` unusable as (part of) a file name, or None."""
    if "\x00" in value:
        return "contains a NUL character"
    ctrl = next((c for c in value if ord(c) < 32 or ord(c) == 127), None)
    if ctrl is not None:
        return f"contains a control character ({ctrl!r})"
    if "/" in value or "\\" in value:
        return "contains a path separator"
    if ".." in value:
        return "contains '..'"
    if any(c.isspace() for c in value):
        return "contains a space"
    return None


def _text_problem(value: object, limit: int, why: str, pattern: re.Pattern[str], shape: str) -> str | None:
    """A name's problem: not a string, empty, a bad character, longer than ``limit`` (``why`` says
    why there is one), or not matching ``pattern`` (``shape`` says what it must be); None: fine."""
    if not isinstance(value, str):
        return f"is a {type(value).__name__}, not a string"
    if not value:
        return "is empty"
    bad = _bad_chars(value)
    if bad:
        return bad
    if len(value) > limit:
        return f"is {len(value)} characters long; at most {limit} are allowed{why}"
    if not pattern.match(value):
        return shape
    return None


def _name_problem(value: object, limit: int) -> str | None:
    return _text_problem(
        value, limit, " (names become file names)", C_IDENT_RE,
        "is not a C identifier (letters, digits and _, not starting with a digit)",
    )  # fmt: skip


def module_key_problem(key: object) -> str | None:
    """A module-table key or a manifest ``[[modules]].name``: a C identifier of at most MAX_NAME characters."""
    return _name_problem(key, MAX_NAME)


def md_name_problem(name: object) -> str | None:
    """A module's ``md_name`` (its library is ``<namespace>_<md_name>``): the same rule as a module key."""
    return _name_problem(name, MAX_NAME)


def namespace_problem(ns: object) -> str | None:
    """``[qola].namespace``: a C identifier, not a keyword, not reserved (``__…``), at most MAX_NAMESPACE long."""
    problem = _name_problem(ns, MAX_NAMESPACE)
    if problem:
        return problem
    assert isinstance(ns, str)
    if ns in C_KEYWORDS or ns.startswith("__") or re.match(r"_[A-Z]", ns):
        return "is a C/C++ keyword or a reserved name"
    return None


NAMESPACE_HINT = "use letters, digits and '_', not starting with a digit and not a C/C++ keyword, e.g. 'te'"


def check_namespace(ns: object) -> str:
    """``ns`` when :func:`namespace_problem` finds nothing, else :class:`QolaError` — for callers
    outside the manifest (the embed/audit commands, output files, link steps)."""
    problem = namespace_problem(ns)
    if problem:
        raise QolaError(f"namespace {ns!r} {problem}", hint=NAMESPACE_HINT)
    assert isinstance(ns, str)
    return ns


def check_name(what: str, value: object, problem: str | None, hint: str) -> None:
    """Raise :class:`QolaError` naming ``what`` when a ``*_problem`` function found ``problem``."""
    if problem:
        raise QolaError(f"{what} {value!r} {problem}", hint=hint)


FILE_STEM_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]*\Z")


def file_stem_problem(stem: object) -> str | None:
    """A name from the tree that qola turns into a file name in its own dirs (a tuned config's stem
    → ``<build>/gen/configs/<stem>.csv``): one plain path component, at most MAX_NAME characters."""
    return _text_problem(
        stem,
        MAX_NAME,
        " (names become file names)",
        FILE_STEM_RE,
        "is not a plain file name (letters, digits, _ . + -)",
    )


MAX_VARIANT_NAME = 240  # CK's fMHA instance stems run to ~170 characters; a file name holds 255 bytes


def usage_name_problem(name: object) -> str | None:
    """A variant name in ``[usage]`` or a usage record (an instance file stem): a plain file name of at
    most MAX_VARIANT_NAME characters, so no glob or filter character (``* ? [ , | @``) can make it
    select more than itself."""
    return _text_problem(
        name, MAX_VARIANT_NAME, "", FILE_STEM_RE, "is not a plain file name (letters, digits, _ . + -)"
    )


def relative_pattern_problem(pattern: object) -> str | None:
    """A file-name glob or a path relative to a tree (``drop_srcs``): no NUL or control characters,
    not absolute, no ``..`` component."""
    if not isinstance(pattern, str):
        return f"is a {type(pattern).__name__}, not a string"
    if not pattern.strip():
        return "is empty"
    if "\x00" in pattern or any(ord(c) < 32 or ord(c) == 127 for c in pattern):
        return "contains a NUL or control character"
    if pattern.startswith(("/", "\\", "~")):
        return "is an absolute path; name files relative to the module's sources (a file name or glob)"
    if ".." in re.split(r"[/\\]", pattern):
        return "contains a '..' component; patterns match the module's own sources only"
    return None


def split_list(entries: object) -> list[str]:
    """QoLA's list syntax: each entry may hold several values separated by ``;`` (CMake's list
    separator: ``--arch "gfx942;gfx950"``, ``--group "a;b"``, ``GPU_ARCHS``, ``QOLA_BUILD_GROUPS``).
    Values are stripped; empty ones (``"a;;b"``, ``"a;"``, ``""``) are dropped, as QoLA drops them."""
    if entries is None:
        return []
    items = [entries] if isinstance(entries, str) else list(entries)  # type: ignore[call-overload]
    return [v.strip() for item in items for v in str(item).split(";") if v.strip()]


GROUP_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]*\Z")


def group_problem(name: object) -> str | None:
    """A module group (``[[modules]].group``, ``--group``): a plain word of letters, digits and
    ``_ . + -``, at most MAX_NAME characters (CMake upper-cases it into ``QOLA_PREBUILT_DIR_<GROUP>``)."""
    if not isinstance(name, str):
        return f"is a {type(name).__name__}, not a string"
    if not name:
        return "is empty"
    if len(name) > MAX_NAME:
        return f"is {len(name)} characters long; at most {MAX_NAME} are allowed"
    if not GROUP_RE.match(name):
        return "is not a plain group name (letters, digits, _ . + -, not starting with . + -)"
    return None


# a git revision qola passes to git (a sha, tag or branch): never an option, a range or a reflog form
GIT_REV_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_./+-]{0,254}\Z")


def git_rev_problem(rev: object) -> str | None:
    """``--aiter-commit``: a commit sha, tag or branch name git can resolve, never something git
    would read as an option (``-…``), a range (``..``) or a reflog/revision expression (``@{``, ``^``, ``~``, ``:``)."""
    if not isinstance(rev, str) or not rev:
        return "is empty"
    if ".." in rev or rev.endswith((".", "/", ".lock")) or "//" in rev or not GIT_REV_RE.match(rev):
        return "is not a commit sha, tag or branch name (letters, digits, _ . / + -; no '..', not starting with '-')"
    return None


def url_problem(url: object) -> str | None:
    """A clone URL (``--aiter-url``, ``[qola].aiter_url``, ``QOLA_AITER_URL``): no control characters,
    not an option, no ``ext::`` transport (it runs commands)."""
    if not isinstance(url, str) or not url.strip():
        return "is empty"
    if any(ord(c) < 32 or ord(c) == 127 for c in url):
        return "contains a control character"
    if url.startswith("-"):
        return "starts with '-' (git would read it as an option)"
    if url.lower().startswith("ext::") or "::" in url.split("/", 1)[0]:
        return "uses a remote-helper transport (<transport>::…); give an https, ssh, git, file URL or a path"
    try:
        split_url(url)
    except UnsplittableURL as exc:
        return f"is refused: {exc}; {exc.hint}"
    return None


def dir_path_problem(path: object) -> str | None:
    """A directory qola is given (the kernel tree, the output and build dirs) whose path it writes
    into build.ninja, compile commands, logs and manifest.json: no NUL or control character (a
    newline ends a ninja line), and UTF-8 (a path read from undecodable bytes holds surrogates)."""
    text = os.fspath(path) if isinstance(path, os.PathLike) else path
    if not isinstance(text, str):
        return f"is a {type(text).__name__}, not a string"
    ctrl = next((c for c in text if ord(c) < 32 or ord(c) == 127), None)
    if ctrl is not None:
        return (
            f"contains a control character ({ctrl!r}"
            + (", a line break" if ctrl in "\n\r" else "")
            + "); qola writes this path into build.ninja and compile commands, where it cannot stand"
        )
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "contains bytes that are not UTF-8; qola writes this path into build.ninja and manifest.json as UTF-8"
    return None


_ENV_REF = re.compile(r"""(?:environ\.get|getenv|get_config_file)\(\s*\\?['"]([A-Za-z_][A-Za-z0-9_]*)""")


def referenced_env(texts: Iterable[str], modules: Collection[str] | None = None) -> list[str]:
    """Every variable an expression text of the tree reads with os.environ.get / os.getenv (or names
    as an AITER config variable): what the no-op record, the build key and ``--reproduce`` record.
    ``modules``: the modules built; a text that is the module table (a JSON object) counts only by
    their entries (a variable a module the build leaves out names is no input, and is never
    recorded); another text (core.py) counts whole."""
    return sorted({key for text in texts for key in _ENV_REF.findall(_entries_of(text, modules))})


def _entries_of(text: str, modules: Collection[str] | None) -> str:
    """``text``, or where it is the module table and ``modules`` is given, the text of their entries."""
    if modules is None or not text.lstrip().startswith("{"):
        return text
    try:
        table = json.loads(text)
    except ValueError:
        return text
    if not isinstance(table, dict):
        return text
    return json.dumps([entry for name, entry in table.items() if name in modules])


FIX_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,63}\Z")


def fix_names(value: object) -> tuple[str, ...] | None:
    """``[qola] fixes`` / ``--fixes``: ``"all"``, ``"none"`` or fix names (a TOML list, or text
    split at ``;`` and ``,``); each a plain name (the planner checks it names a fix of
    :mod:`qola.plan.fixes`). ``"none"`` and ``[]`` are ``()``; absent: None (every fix)."""
    if isinstance(value, list):
        names = [str(v).strip() for v in value]
    elif isinstance(value, str):
        names = [n for n in (p.strip() for p in value.replace(",", ";").split(";")) if n]
        if not names:
            return None
    else:
        raise ValueError(f'expected "all", "none" or a list of fix names, got {value!r}')
    bad = [n for n in names if not FIX_NAME.match(n)]
    if bad:
        raise ValueError(f"{bad[0]!r} is not a fix name (lower-case letters, digits and '-')")
    if names in (["none"], []):
        return ()
    return tuple(dict.fromkeys(names))
