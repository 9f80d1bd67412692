"""Every setting a command resolves from several sources, declared once (:class:`Setting`: its
flag(s) and the commands that take them, its environment names, its manifest key (the manifest
schema's field is made from it), its type and default as the docs show them, its one check, its
help, whether it enters the build key), and the environment-only knobs. The machinery (the
resolver, :class:`Values`, the docs table) is :mod:`qola.core.setting`.

To add a setting: declare it here and add it to :data:`ALL`; that is all (CONTRIBUTING.md, "Where to
add … a setting"): the commands it names take its flag, :func:`resolve_all` reads its sources, the
manifest schema accepts its key, and ``python scripts/docs_tables.py`` writes its docs row.

Standard library only (the no-op fast path resolves settings before anything heavy loads).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Literal, TypeVar

from qola.core import rules
from qola.core.setting import (
    DEFAULT,
    Chosen,
    Setting,
    Tables,
    Values,
    arg_type,
    manifest_tables,
    resolve,
)
from qola.core.setting import resolve_all as _resolve_all

__all__ = ["DEFAULT", "Chosen", "Setting", "Tables", "Values", "arg_type", "manifest_tables", "resolve"]
T = TypeVar("T")


# --------------------------------------------------------------------------- validators


def jobs(value: object) -> int | None:
    """A job count: 1 … :data:`qola.core.rules.MAX_JOBS` (blank text: not given)."""
    if isinstance(value, str) and not value.strip():
        return None
    problem = rules.count_problem(value, 1, rules.MAX_JOBS)
    if problem:
        raise ValueError(problem)
    return int(str(value).strip())


def archs(value: object) -> tuple[str, ...] | None:
    """A list of architectures (``;``-separated entries, as QoLA and AITER split them: ``--arch
    "gfx942;gfx950"``); naming nothing (``--arch ""``, CMake's empty list) is not giving it."""
    names = rules.split_list(value)
    if not names:
        return None
    problem = rules.arch_list_problem(names)
    if problem:
        raise ValueError(problem)
    return tuple(names)


def arch_list(value: object) -> tuple[str, ...] | None:
    """``[build].architectures``: a TOML list, each entry as written (no splitting or stripping)."""
    names = [str(v) for v in value] if isinstance(value, list) else rules.split_list(value)
    problem = rules.arch_list_problem(names) if names else None
    if problem:
        raise ValueError(problem)
    return tuple(names) or None


WEEK = 7 * 24 * 3600


def seconds(value: object) -> float | None:
    """Seconds to wait, 0 … a week, or ``inf`` (as long as it takes); blank: not given."""
    text = str(value).strip()
    if not text:
        return None
    try:
        number = float(text)
    except ValueError:
        raise ValueError(f"takes seconds, got {value!r}") from None
    if not (0 <= number <= WEEK or number == math.inf):
        raise ValueError(f"must be between 0 and {WEEK} seconds (or inf), got {value}")
    return number


def by_rule(problem_of: Callable[[object], str | None], say: str = "{problem}") -> Callable[[object], str | None]:
    """The check of a text setting by one of :mod:`qola.core.rules`' ``*_problem`` rules: blank is
    not given, a problem is a ValueError worded by ``say`` (``{value}``: the value's repr,
    ``{problem}``: the rule's words), else the text as given."""

    def parse(value: object) -> str | None:
        if value in (None, ""):
            return None
        problem = problem_of(value)
        if problem:
            raise ValueError(say.format(value=repr(value), problem=problem))
        return str(value)

    return parse


def groups(value: object) -> tuple[str, ...] | None:
    """Module groups (``;``-separated entries), each a plain group name; repeats dropped."""
    names = rules.split_list(value)
    for name in names:
        problem = rules.group_problem(name)
        if problem:
            raise ValueError(f"group {name!r} {problem}")
    return tuple(dict.fromkeys(names)) or None


MODES = ("pybind", "cpp_itfs")


def _mode_problem(value: object) -> str | None:
    return None if value in MODES else f"expected one of {', '.join(MODES)}, got {value!r}"


mode = by_rule(_mode_problem)  # a module mode (:data:`MODES`)


def text(value: object) -> str | None:
    return str(value) if value not in (None, "") else None


def path(value: object) -> str | None:
    """A path as given (blank: not given); it is checked where it is used."""
    return str(value) if str(value).strip() else None


url = by_rule(rules.url_problem, "the URL {problem}")  # a URL git may clone
commit = by_rule(rules.git_rev_problem, "{value} {problem}")  # --aiter-commit: a sha, tag or branch git can resolve


def sha(value: object) -> str | None:
    """``[qola].aiter_commit``: a commit sha (4 to 40 hex digits), lowercased."""
    if value in (None, ""):
        return None
    if not isinstance(value, str) or not rules.SHA_RE.match(value.lower()):
        raise ValueError("expected a git commit sha (4 to 40 hex digits)")
    return value.lower()


SWITCH_ON, SWITCH_OFF = ("1", "true", "yes", "on"), ("0", "")


def switch(value: object) -> bool | None:
    """QoLA's on/off variable: ``1`` (or true/yes/on), ``0`` or empty; anything else (``false``, which
    QoLA would take as on) is refused. A flag's False or a manifest's false: not given."""
    if isinstance(value, bool):
        return True if value else None
    text = str(value).strip().lower()
    if text in SWITCH_ON or text in SWITCH_OFF:
        return text in SWITCH_ON
    raise ValueError(f"takes 1 (on) or 0 (off), got {value!r}")


def on_off(value: object) -> bool | None:
    """``--jit on|off`` / ``[jit] enabled = true|false``."""
    if isinstance(value, bool):
        return value
    if value in ("on", "off"):
        return value == "on"
    if value in (None, ""):
        return None
    raise ValueError(f"takes on or off, got {value!r}")


DEFAULT_URL = "https://github.com/ROCm/aiter.git"


# --------------------------------------------------------------------------- the settings

BUILD, PLAN, CHECKOUT = "build", "plan", "checkout"  # the commands whose parsers loop ALL

JOBS: Setting[int] = Setting(
    "jobs",
    jobs,
    flags=("-j", "--jobs"),
    commands=(BUILD,),
    metavar="N",
    typed=True,
    env=("MAX_JOBS",),
    manifest_key=("build", "jobs"),
    toml=int,
    type_text="integer, 1 … 4096",
    default_text="AITER's cpu/memory rule",
    example="8",
    check_every=True,
    help="parallel jobs (default: MAX_JOBS, else AITER's cpu/memory rule)",
)
ARCHS: Setting[tuple[str, ...]] = Setting(
    "archs",
    archs,
    flags=("--arch",),
    commands=(BUILD, PLAN),
    shape="repeatable",
    metavar="ARCH",
    env=("GPU_ARCHS",),
    manifest_key=("build", "architectures"),
    manifest_parse=arch_list,
    toml=list[str],
    toml_default=[],
    type_text="architectures, ';'-separated",
    default_text="none: an error",
    example="gfx942",
    missing="no GPU architectures given",
    in_key=True,
    help="target architecture(s), ';'-separated (repeatable; beats the manifest and GPU_ARCHS)",
)
GROUPS: Setting[tuple[str, ...]] = Setting(
    "groups",
    groups,
    flags=("--group",),
    commands=(BUILD, PLAN, CHECKOUT),
    shape="repeatable",
    metavar="GROUP",
    env=("QOLA_BUILD_GROUPS",),
    type_text="module groups, ';'-separated",
    default_text="every module",
    example="attn",
    in_key=True,  # the modules built (the key hashes the plan)
    help="build only the [[modules]] of these groups, ';'-separated (repeatable; default: QOLA_BUILD_GROUPS, "
    "else every module; qola checkout: check that the manifest declares them and list their modules)",
)
AITER_ROOT: Setting[str] = Setting(
    "aiter_root",
    path,
    flags=("--aiter-root", "-a"),
    commands=(BUILD, PLAN, CHECKOUT),
    env=("QOLA_AITER_SOURCE_DIR", "NVTE_AITER_SOURCE_DIR"),  # QoLA's CMake: build this tree, never check out
    manifest_key=("qola", "aiter_root"),
    relative=True,  # relative to the manifest's dir
    type_text="path",
    default_text="the default checkout",
    example="DIR",
    shown="--aiter-root",
    help="root of the kernel tree (default: [qola].aiter_root of the manifest, else QOLA_AITER_SOURCE_DIR / "
    "NVTE_AITER_SOURCE_DIR, else the default checkout: docs/manifest.md)",
)
AITER_URL: Setting[str] = Setting(
    "aiter_url",
    url,
    flags=("--aiter-url",),
    commands=(BUILD, CHECKOUT),
    metavar="URL",
    env=("QOLA_AITER_URL",),
    manifest_key=("qola", "aiter_url"),
    type_text="URL",
    default=DEFAULT_URL,
    default_text=DEFAULT_URL,
    example="https://github.com/ROCm/aiter.git",
    in_key=True,  # as the manifest's text (the tree's own commit is hashed too)
    help=f"where a checkout clones the tree from (beats [qola].aiter_url and QOLA_AITER_URL; default: {DEFAULT_URL})",
)
AITER_COMMIT: Setting[str] = Setting(
    "aiter_commit",
    commit,
    flags=("--aiter-commit",),
    commands=(BUILD, PLAN, CHECKOUT),
    metavar="REV",
    manifest_key=("qola", "aiter_commit"),
    manifest_parse=sha,
    type_text="sha (flag: sha, tag or branch)",
    default_text="the tree's HEAD",
    example="33f2e6a",
    in_key=True,
    help="the commit (sha, tag or branch) to check out and to expect (beats [qola].aiter_commit)",
)
PATCHES_DIR: Setting[str] = Setting(
    "patches_dir",
    path,
    flags=("--patches-dir",),
    commands=(BUILD, CHECKOUT),
    metavar="DIR",
    manifest_key=("qola", "patches_dir"),
    relative=True,
    type_text="path",
    default_text="`<qola checkout>/patches/aiter` when it exists, else none",
    example="DIR",
    in_key=True,
    help="*.patch files the checkout applies, in lexical order (beats [qola].patches_dir; "
    "an empty dir or /dev/null: none)",
)
FORCE_CHECKOUT: Setting[bool] = Setting(
    "force_checkout",
    switch,
    flags=("--force-checkout",),
    commands=(BUILD, CHECKOUT),
    command_flags=((CHECKOUT, ("--force",)),),
    shape="switch",
    env=("QOLA_FORCE_AITER_CHECKOUT",),
    type_text="switch (variable: 1 or 0)",
    default=False,
    default_text="off",
    example="1",
    help="let the checkout discard local changes of the tree (never without this)",
)
MODE: Setting[str] = Setting(
    "mode",
    mode,
    flags=("--mode",),
    commands=(BUILD, PLAN),
    shape="choices",
    choices=MODES,
    manifest_key=("build", "mode"),
    toml=Literal["pybind", "cpp_itfs"],
    type_text=" or ".join(MODES),
    default=MODES[0],
    default_text=MODES[0],
    example="pybind",
    in_key=True,
    help="default mode for modules without one",
)
LAUNCHER: Setting[str] = Setting(
    "launcher",
    text,
    flags=("--launcher",),
    commands=(BUILD,),
    manifest_key=("build", "launcher"),
    type_text="program",
    example="sccache",
    help="compiler launcher, e.g. sccache or ccache",
)
NO_CACHE: Setting[bool] = Setting(
    "no_cache",
    switch,
    flags=("--no-cache",),
    commands=(BUILD,),
    shape="switch",
    env=("QOLA_NO_CACHE",),
    type_text="switch (variable: 1 or 0)",
    default=False,
    default_text="off: the cache is used",
    example="1",
    help="compile every unit, neither taking objects from qola's compile cache nor storing them "
    "(QOLA_CACHE_DIR, else ~/.cache/qola/cc; a build with a --launcher, --dist or --remote uses none)",
)
REMOTE: Setting[str] = Setting(
    "remote",
    text,
    flags=("--remote",),
    commands=(BUILD,),
    metavar="URL",
    manifest_key=("build", "remote"),
    type_text="REAPI URL",
    example="grpc://host:port",
    help="run every compile as an action on this Remote Execution API service (grpc://host:port, "
    "grpcs://host:port for TLS, unix:/path; beats [build].remote) through buildbox's trexe: "
    "docs/distributed.md",
)
WAIT: Setting[float] = Setting(
    "wait",
    seconds,
    flags=("--wait",),
    commands=(BUILD,),
    shape="optional",
    const="inf",
    metavar="SECONDS",
    typed=True,
    env=("QOLA_WAIT",),
    type_text="seconds (0 … a week, inf; the flag alone: inf)",
    default_text="fail at once",
    example="600",
    help="when another qola build uses the same build or output dir, wait for it (at most SECONDS; "
    "default: QOLA_WAIT, else fail at once) instead of failing at once",
)
RECORD_AHEAD: Setting[bool] = Setting(
    "record_ahead",
    switch,
    flags=("--record-ahead",),
    commands=(BUILD, PLAN),
    shape="switch",
    manifest_key=("usage", "record_ahead"),
    toml=bool,
    toml_default=False,
    type_text="switch",
    default=False,
    default_text="off",
    in_key=True,
    help="variants built ahead record their first call in each process, as deferred ones do "
    "(as [usage] record_ahead = true; docs/usage.md)",
)
JIT: Setting[bool] = Setting(
    "jit",
    on_off,
    flags=("--jit",),
    commands=(BUILD, PLAN),
    shape="choices",
    choices=("on", "off"),
    manifest_key=("jit", "enabled"),
    toml=bool,
    toml_default=True,
    type_text="on / off (manifest: true / false)",
    default_text="as the manifest's [jit] says",
    example="on",
    in_key=True,
    help="on: defer every generated instance to the on-demand JIT (the manifest's [jit], or an empty one); "
    "off: build everything ahead ([jit] enabled = false); default: as the manifest says (docs/manifest.md)",
)

FIXES: Setting[tuple[str, ...]] = Setting(
    "fixes",
    rules.fix_names,
    flags=("--fixes",),
    commands=(BUILD, PLAN),
    metavar="NAMES",
    env=("QOLA_FIXES",),
    manifest_key=("qola", "fixes"),
    toml=str | list[str],
    type_text='"all", "none" or fix names',
    default_text="all (docs/manifest.md, [qola] fixes)",
    example="none",
    in_key=True,
    help="qola's fixes of the tree's code (staged copies): all (default), none, or names ','-separated",
)

ALL: tuple[Setting[object], ...] = (  # type: ignore[assignment]  # each its own T
    JOBS,
    ARCHS,
    GROUPS,
    AITER_ROOT,
    AITER_URL,
    AITER_COMMIT,
    PATCHES_DIR,
    FORCE_CHECKOUT,
    MODE,
    LAUNCHER,
    NO_CACHE,
    REMOTE,
    WAIT,
    RECORD_AHEAD,
    JIT,
    FIXES,
)


def declared() -> tuple[Setting[object], ...]:
    """The declarations in force (:data:`ALL`; a test adds one by patching it)."""
    return ALL


def resolve_all(cli: Mapping[str, object], tables: Tables, env: Mapping[str, str], base: Path | None = None) -> Values:
    """Every declared setting resolved once (:func:`qola.core.setting.resolve_all`)."""
    return _resolve_all(declared(), cli, tables, env, base)


def for_command(command: str) -> Iterable[Setting[object]]:
    """The declarations whose flag ``command`` takes."""
    return (s for s in declared() if command in s.commands)
