r"""qola's environment-only knobs: the ``QOLA_*`` variables no command-line flag or manifest key
gives (deadlines, the JIT's and the compile cache's dirs, …), declared as :class:`Setting`\ s beside
the settings of :mod:`qola.core.settings`, and the check of every ``QOLA_*`` variable set
(:func:`check_environment`) that runs before any command works."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from qola.core import deadlines
from qola.core.setting import Setting, T
from qola.core.settings import declared

# Read where they are used (qola.core.deadlines, qola.checkout.choice, qola.jit); declared here so that
# :func:`check_environment` refuses a wrong one before any command does work.


def deadline(knob: deadlines.Knob) -> Callable[[object], float | None]:
    """The check of a deadline knob: :func:`qola.core.deadlines.seconds`' own (its error names the
    variable, the value and what it takes)."""

    def parse(value: object) -> float | None:
        return deadlines.seconds(knob, {knob.variable: str(value)}) if str(value).strip() else None

    return parse


def plain_path(value: object) -> str | None:
    """A path or program (blank: not given), without control characters (a newline would split the
    lines of the files it is written into)."""
    text = str(value)
    if any(ord(c) < 32 or ord(c) == 127 for c in text):
        raise ValueError(f"holds a control character: {text!r}")
    return text if text.strip() else None


def cache_gb(value: object) -> float | None:
    """The compile cache's cap in GB: a number above 0 (blank: not given)."""
    text = str(value).strip()
    if not text:
        return None
    try:
        gb = float(text)
    except ValueError:
        raise ValueError(f"takes a number of GB above 0, got {text!r}") from None
    if not 0 < gb < 1 << 20:
        raise ValueError(f"takes a number of GB above 0, got {text!r}")
    return gb


def _knob(variable: str, parse: Callable[[object], T | None], example: str, help_: str) -> Setting[T]:
    return Setting(variable.lower(), parse, env=(variable,), example=example, help=help_)


_DEADLINES: tuple[Setting[float], ...] = tuple(
    _knob(k.variable, deadline(k), "600", f"seconds, the limit on {k.what}")
    for k in (deadlines.PROBE, deadlines.GENERATOR, deadlines.GIT_LOCAL, deadlines.LOCK)
)
KNOBS: tuple[Setting[object], ...] = (
    *_DEADLINES,  # type: ignore[arg-type]
    _knob("QOLA_JIT_COMPILER", plain_path, "/opt/rocm/bin/hipcc", "the compiler a JIT prebuild uses"),
    _knob("QOLA_JIT_CACHE_DIR", plain_path, "DIR", "the JIT cache qola jit reads and fills"),
    _knob("QOLA_JIT_PREBUILT_DIR", plain_path, "DIR", "':'-separated read-only dirs of JIT entries"),
    _knob("QOLA_CACHE_DIR", plain_path, "DIR", "qola's compile cache (default ~/.cache/qola/cc)"),
    _knob("QOLA_CACHE_MAX_GB", cache_gb, "20", "the compile cache's size cap in GB (default 20)"),
)
# read only by the JIT runtime inside a client process, which checks them itself (qola/runtime/jit)
RUNTIME_ONLY = ("QOLA_JIT", "QOLA_JIT_SOURCE_DIR", "QOLA_JIT_VERBOSE", "QOLA_USAGE_DIR", "QOLA_JIT_COVERAGE")


def declared_variables() -> set[str]:
    """Every ``QOLA_*`` environment variable qola reads (a test checks the source names no other)."""
    return {v for s in (*declared(), *KNOBS) for v in s.env if v.startswith("QOLA_")} | set(RUNTIME_ONLY)


PREFIX = "QOLA_"  # what callers give :func:`check_environment` of the environment (never all of it)


def check_environment(env: Mapping[str, str]) -> None:
    """Every ``QOLA_*`` variable set in ``env`` that a setting or knob declares, checked as where it
    is read checks it: a QolaError naming the variable, its value and what it takes, before any
    command does work (``QOLA_GENERATOR_TIMEOUT=10m`` would otherwise fail a module mid-build)."""
    for setting in (*declared(), *KNOBS):
        for variable in setting.env:
            if variable.startswith("QOLA_") and variable in env:
                setting.check(env[variable], variable)
