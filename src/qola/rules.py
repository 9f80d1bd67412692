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
with it as a phrase ("contains a space") for the caller's message.
"""

from __future__ import annotations

import keyword
import re

C_IDENT_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
GFX_RE = re.compile(r"gfx[0-9]{2,4}[a-z]?(?::(?:xnack|sramecc)[+-])*\Z")
SM_RE = re.compile(r"sm_[0-9]{2,3}[af]?\Z")
SHA_RE = re.compile(r"[0-9a-f]{4,40}\Z")
VERSION_RE = re.compile(r"[0-9]+(?:\.[0-9]+){0,2}\Z")

MAX_NAMESPACE = 64  # [qola].namespace
MAX_NAME = 96  # a module key, a module's md_name
MAX_LIBRARY_NAME = MAX_NAMESPACE + 1 + MAX_NAME  # "<namespace>_<md_name>", the stem of its files

C_KEYWORDS = frozenset(
    "auto break case char const continue default do double else enum extern float for goto if inline int "
    "long register restrict return short signed sizeof static struct switch typedef union unsigned void "
    "volatile while bool class namespace template typename this new delete operator private public "
    "protected virtual friend using true false nullptr".split()
)


def is_c_ident(value: object) -> bool:
    return isinstance(value, str) and C_IDENT_RE.match(value) is not None


def is_c_keyword(name: str) -> bool:
    return name in C_KEYWORDS or keyword.iskeyword(name)


def vendor(arch: object) -> str | None:
    """``"hip"`` for a gfx target ID, ``"cuda"`` for ``sm_XX``, else None."""
    if not isinstance(arch, str):
        return None
    if GFX_RE.match(arch):
        return "hip"
    if SM_RE.match(arch):
        return "cuda"
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


def _name_problem(value: object, limit: int) -> str | None:
    if not isinstance(value, str):
        return f"is a {type(value).__name__}, not a string"
    if not value:
        return "is empty"
    bad = _bad_chars(value)
    if bad:
        return bad
    if len(value) > limit:
        return f"is {len(value)} characters long; at most {limit} are allowed (names become file names)"
    if not C_IDENT_RE.match(value):
        return "is not a C identifier (letters, digits and _, not starting with a digit)"
    return None


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
    if ns in C_KEYWORDS or ns.startswith("__"):
        return "is a C/C++ keyword or a reserved name"
    return None


FILE_STEM_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]*\Z")


def file_stem_problem(stem: object) -> str | None:
    """A name from the tree that qola turns into a file name in its own dirs (a tuned config's stem
    → ``<build>/gen/configs/<stem>.csv``): one plain path component, at most MAX_NAME characters."""
    if not isinstance(stem, str):
        return f"is a {type(stem).__name__}, not a string"
    if not stem:
        return "is empty"
    bad = _bad_chars(stem)
    if bad:
        return bad
    if len(stem) > MAX_NAME:
        return f"is {len(stem)} characters long; at most {MAX_NAME} are allowed (names become file names)"
    if not FILE_STEM_RE.match(stem):
        return "is not a plain file name (letters, digits, _ . + -)"
    return None


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
