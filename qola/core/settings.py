"""Every setting a command resolves from several sources, declared once, and the one resolver.

A :class:`Setting` says everything about one setting: its command-line flag(s), its environment
names, its manifest key, how a value is checked (the one validator, shared by every source and by
every command that takes the flag), what is said when nothing gives it, and whether it enters the
build key. :func:`resolve` walks the sources in the one order every setting keeps (as
scikit-build-core's settings do with one source chain):

    command line > manifest > environment > default

A source that gives nothing (None, ``""``, an empty list, ``--arch ""``) is passed over. A value
that is wrong is a :class:`~qola.core.errors.QolaError` naming its source (the flag, the manifest
key or the variable) and how to fix it there. With ``check_every`` a wrong value is an error even
where a source before it decides (``-j 2`` does not hide a broken ``MAX_JOBS``).

Where a value comes from is kept (:attr:`Chosen.where`): messages and records name it.

To add a setting: declare it here (and in :data:`ALL`), add its flag with
:func:`qola.commands.common.add_flag`, and resolve it with :func:`resolve` where it is read
(``qola/pipeline/spec.py`` for a build's); CONTRIBUTING.md, "Where to add … a setting".

Standard library only (the no-op fast path resolves settings before anything heavy loads).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

from qola.core import deadlines, rules
from qola.core.errors import QolaError

T = TypeVar("T")


@dataclass(frozen=True)
class Setting(Generic[T]):
    """One setting: where it may come from, and the one check of its value."""

    name: str  # what messages and records call it (the BuildSpec field, the argparse dest)
    parse: Callable[[object], T | None]  # a source's value -> the value, None: not given; ValueError: wrong
    flags: tuple[str, ...] = ()  # its command-line flag(s); messages name them joined by '/'
    env: tuple[str, ...] = ()  # its environment variables, the first one set counts
    manifest: str | None = None  # its manifest key, as messages name it ("[build].jobs")
    example: str = ""  # a good value, for the hints
    missing: str | None = None  # the error when no source gives it (None: the default decides)
    check_every: bool = False  # a wrong value in a source passed over is an error too
    in_key: bool = False  # whether it enters the build key (qola.store.key; a test keeps them in step)
    help: str = ""  # the command line's help text
    shown: str = ""  # how messages name the command line's value (default: the flags joined by '/')

    @property
    def flag(self) -> str:
        return self.shown or "/".join(self.flags)

    def check(self, value: object, where: str) -> T | None:
        """``value`` as ``where`` gave it, checked (:data:`parse`); a QolaError naming ``where``."""
        try:
            return self.parse(value)
        except ValueError as exc:
            raise QolaError(f"{_shown(where)}: {exc}", hint=self.fix(where)) from None

    def fix(self, where: str) -> str:
        if where == self.manifest:
            return f"fix {where} in the manifest, or remove it"
        if where in self.env:
            return f"set {where}={self.example}, or unset it" if self.example else f"unset {where}"
        return f"pass {self.flags[0]} {self.example}".rstrip()

    def absent(self) -> QolaError:
        """The one error for no value from any source (:data:`missing`)."""
        ways = [f"set {self.manifest} in the manifest"] if self.manifest else []
        ways += [f"pass {self.flags[0]} (e.g. {self.flags[0]} {self.example})"] if self.flags else []
        ways += [f"set {' or '.join(self.env)}"] if self.env else []
        return QolaError(self.missing or f"no {self.name} given", hint=", ".join(ways[:-1]) + ", or " + ways[-1])


def _shown(where: str) -> str:
    return where if where.startswith(("-", "[")) else f"environment variable {where}"


@dataclass(frozen=True)
class Chosen(Generic[T]):
    value: T
    where: str  # the flag, the manifest key, the variable, or DEFAULT


DEFAULT = "default"


def resolve(
    setting: Setting[T],
    cli: object = None,
    manifest: object = None,
    env: Mapping[str, str] | None = None,
    default: Callable[[], T] | None = None,
) -> Chosen[T]:
    """The value of ``setting``: command line > manifest > environment (only ``env``: what the
    caller resolved for this setting) > ``default()``. Nothing given and no default: its
    :meth:`Setting.absent` error, or a value of None."""
    sources: list[tuple[str, object]] = [(setting.flag, cli), (setting.manifest or "", manifest)]
    sources += [(name, (env or {}).get(name)) for name in setting.env]
    chosen: Chosen[T] | None = None
    for where, raw in sources:
        if raw is None:
            continue
        value = setting.check(raw, where)
        if value is None:
            continue
        chosen = chosen or Chosen(value, where)
        if not setting.check_every:
            break
    if chosen is not None:
        return chosen
    if default is not None:
        return Chosen(default(), DEFAULT)
    if setting.missing:
        raise setting.absent()
    return Chosen(None, DEFAULT)  # type: ignore[arg-type]  # an optional setting no source gives


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


def groups(value: object) -> tuple[str, ...] | None:
    """Module groups (``;``-separated entries), each a plain group name; repeats dropped."""
    names = rules.split_list(value)
    for name in names:
        problem = rules.group_problem(name)
        if problem:
            raise ValueError(f"group {name!r} {problem}")
    return tuple(dict.fromkeys(names)) or None


MODES = ("pybind", "cpp_itfs")


def mode(value: object) -> str | None:
    """A module mode (:data:`MODES`)."""
    if value in (None, ""):
        return None
    if value not in MODES:
        raise ValueError(f"expected one of {', '.join(MODES)}, got {value!r}")
    return str(value)


def text(value: object) -> str | None:
    return str(value) if value not in (None, "") else None


def path(value: object) -> str | None:
    """A path as given (blank: not given); it is checked where it is used."""
    return str(value) if str(value).strip() else None


def url(value: object) -> str | None:
    """A URL git may clone (:func:`qola.core.rules.url_problem`)."""
    if value in (None, ""):
        return None
    problem = rules.url_problem(value)
    if problem:
        raise ValueError(f"the URL {problem}")
    return str(value)


# --------------------------------------------------------------------------- the settings

JOBS: Setting[int] = Setting(
    "jobs",
    jobs,
    flags=("-j", "--jobs"),
    env=("MAX_JOBS",),
    manifest="[build].jobs",
    example="8",
    check_every=True,
    help="parallel jobs (default: MAX_JOBS, else AITER's cpu/memory rule)",
)
ARCHS: Setting[tuple[str, ...]] = Setting(
    "archs",
    archs,
    flags=("--arch",),
    env=("GPU_ARCHS",),
    manifest="[build].architectures",
    example="gfx942",
    missing="no GPU architectures given",
    in_key=True,
    help="target architecture(s), ';'-separated (repeatable; beats the manifest and GPU_ARCHS)",
)
GROUPS: Setting[tuple[str, ...]] = Setting(
    "groups",
    groups,
    flags=("--group",),
    env=("QOLA_BUILD_GROUPS",),
    example="attn",
    in_key=True,  # the modules built (the key hashes the plan)
    help="build only the [[modules]] of these groups, ';'-separated (repeatable; default: QOLA_BUILD_GROUPS, "
    "else every module)",
)
AITER_ROOT: Setting[str] = Setting(
    "aiter_root",
    path,
    flags=("--aiter-root", "-a"),
    env=("QOLA_AITER_SOURCE_DIR", "NVTE_AITER_SOURCE_DIR"),  # QoLA's CMake: build this tree, never check out
    manifest="[qola].aiter_root",  # relative to the manifest's dir
    example="DIR",
    shown="--aiter-root",
    help="root of the kernel tree (default: [qola].aiter_root of the manifest, else QOLA_AITER_SOURCE_DIR / "
    "NVTE_AITER_SOURCE_DIR, else the default checkout: docs/manifest.md)",
)
AITER_URL: Setting[str] = Setting(
    "aiter_url",
    url,
    flags=("--aiter-url",),
    env=("QOLA_AITER_URL",),
    manifest="[qola].aiter_url",
    example="https://github.com/ROCm/aiter.git",
    in_key=True,  # as the manifest's text (the tree's own commit is hashed too)
    help="where a checkout clones the tree from (beats [qola].aiter_url and QOLA_AITER_URL)",
)
MODE: Setting[str] = Setting(
    "mode",
    mode,
    flags=("--mode",),
    manifest="[build].mode",
    example="pybind",
    in_key=True,
    help="default mode for modules without one",
)
LAUNCHER: Setting[str] = Setting(
    "launcher",
    text,
    flags=("--launcher",),
    manifest="[build].launcher",
    example="sccache",
    help="compiler launcher, e.g. sccache or ccache",
)
REMOTE: Setting[str] = Setting(
    "remote",
    text,
    flags=("--remote",),
    manifest="[build].remote",
    example="grpc://host:port",
)
WAIT: Setting[float] = Setting(
    "wait",
    seconds,
    flags=("--wait",),
    env=("QOLA_WAIT",),
    example="600",
    help="when another qola build uses the same build or output dir, wait for it (at most SECONDS; "
    "default: QOLA_WAIT, else fail at once) instead of failing at once",
)

ALL: tuple[Setting[object], ...] = (JOBS, ARCHS, GROUPS, AITER_ROOT, AITER_URL, MODE, LAUNCHER, REMOTE, WAIT)  # type: ignore[assignment]


# --------------------------------------------------------------------------- environment-only knobs
# Read where they are used (qola.core.deadlines, qola.checkout.choice, qola.jit); declared here so that
# :func:`check_environment` refuses a wrong one before any command does work (issue 41 item 6).


def deadline(knob: deadlines.Knob) -> Callable[[object], float | None]:
    """The check of a deadline knob: :func:`qola.core.deadlines.seconds`' own (its error names the
    variable, the value and what it takes)."""

    def parse(value: object) -> float | None:
        return deadlines.seconds(knob, {knob.variable: str(value)}) if str(value).strip() else None

    return parse


SWITCH_ON, SWITCH_OFF = ("1", "true", "yes", "on"), ("0", "")


def switch(value: object) -> bool | None:
    """QoLA's on/off variable: ``1`` (or true/yes/on), ``0`` or empty; anything else (``false``, which
    QoLA would take as on) is refused."""
    text = str(value).strip().lower()
    if text in SWITCH_ON or text in SWITCH_OFF:
        return text in SWITCH_ON
    raise ValueError(f"takes 1 (on) or 0 (off), got {value!r}")


def plain_path(value: object) -> str | None:
    """A path or program (blank: not given), without control characters (a newline would split the
    lines of the files it is written into)."""
    text = str(value)
    if any(ord(c) < 32 or ord(c) == 127 for c in text):
        raise ValueError(f"holds a control character: {text!r}")
    return text if text.strip() else None


def _knob(variable: str, parse: Callable[[object], T | None], example: str, help_: str) -> Setting[T]:
    return Setting(variable.lower(), parse, env=(variable,), example=example, help=help_)


_DEADLINES: tuple[Setting[float], ...] = tuple(
    _knob(k.variable, deadline(k), "600", f"seconds, the limit on {k.what}")
    for k in (deadlines.PROBE, deadlines.GENERATOR, deadlines.GIT_LOCAL, deadlines.LOCK)
)
KNOBS: tuple[Setting[object], ...] = (
    *_DEADLINES,  # type: ignore[arg-type]
    _knob("QOLA_FORCE_AITER_CHECKOUT", switch, "1", "1: a checkout discards local changes (as --force)"),
    _knob("QOLA_JIT_COMPILER", plain_path, "/opt/rocm/bin/hipcc", "the compiler a JIT prebuild uses"),
    _knob("QOLA_JIT_CACHE_DIR", plain_path, "DIR", "the JIT cache qola jit reads and fills"),
    _knob("QOLA_JIT_PREBUILT_DIR", plain_path, "DIR", "':'-separated read-only dirs of JIT entries"),
)
# read only by the JIT runtime inside a client process, which checks them itself (qola/runtime/jit)
RUNTIME_ONLY = ("QOLA_JIT", "QOLA_JIT_SOURCE_DIR", "QOLA_JIT_VERBOSE", "QOLA_USAGE_DIR", "QOLA_JIT_COVERAGE")


def declared_variables() -> set[str]:
    """Every ``QOLA_*`` environment variable qola reads (a test checks the source names no other)."""
    return {v for s in (*ALL, *KNOBS) for v in s.env if v.startswith("QOLA_")} | set(RUNTIME_ONLY)


PREFIX = "QOLA_"  # what callers give :func:`check_environment` of the environment (never all of it)


def check_environment(env: Mapping[str, str]) -> None:
    """Every ``QOLA_*`` variable set in ``env`` that a setting or knob declares, checked as where it
    is read checks it: a QolaError naming the variable, its value and what it takes, before any
    command does work (``QOLA_GENERATOR_TIMEOUT=10m`` would otherwise fail a module mid-build)."""
    for setting in (*ALL, *KNOBS):
        for variable in setting.env:
            if variable.startswith("QOLA_") and variable in env:
                setting.check(env[variable], variable)


def arg_type(setting: Setting[T]) -> Callable[[str], T]:
    """The argparse ``type=`` of ``setting``'s flag: :meth:`Setting.check` (argparse then exits 2
    naming the flag)."""

    def convert(text: str) -> T:
        try:
            value = setting.parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        if value is None:
            raise argparse.ArgumentTypeError(f"is empty; e.g. {setting.flags[0]} {setting.example}")
        return value

    convert.__name__ = setting.name  # argparse names it in "invalid <name> value"
    return convert
