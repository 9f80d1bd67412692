"""How long qola lets a child process run or a wait last: the knobs, read from an environment.

Every child qola starts has a deadline (:mod:`qola.core.proc` ends its process group when it passes)
and every wait for a lock ends on SIGTERM (:mod:`qola.core.lock`). The defaults are generous; each can
be set in the environment qola runs with (seconds, a positive number, or ``inf`` for no limit):

=========================  ==========  ==================================================================
variable                   default     what it bounds
=========================  ==========  ==================================================================
``QOLA_PROBE_TIMEOUT``     120         one toolchain probe: ``hipcc``/``nvcc``/``hipconfig --version``,
                                       flag probes, ``nvcc --list-gpu-code``, the JIT compiler's identity,
                                       ``ninja --version`` and ``qola doctor``'s test compile
``QOLA_GENERATOR_TIMEOUT`` 3600        one generator command of a module (and its ``--list_blobs`` run)
``QOLA_GIT_TIMEOUT``       600 / 3600  one git call (local / one that reaches the network)
``QOLA_LOCK_TIMEOUT``      inf         ``qola jit prebuild`` waiting for a JIT cache lock another process
                                       holds (it says so every minute while it waits)
=========================  ==========  ==================================================================

:data:`COMPILE` (4 h, not a knob) bounds one compile or link qola runs itself: a link step, a JIT
prebuild compile, ``--remote``'s dependency scan and local fallback.

Every call of :func:`qola.core.proc.run` / :func:`~qola.core.proc.run_checked` passes ``timeout=``
(``tests/core/test_shared_primitives.py`` reads the source to prove it).

Standard library only, nothing at import time.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from qola.core.errors import QolaError


@dataclass(frozen=True)
class Knob:
    variable: str
    default: float
    what: str


PROBE = Knob("QOLA_PROBE_TIMEOUT", 120.0, "a toolchain probe")
GENERATOR = Knob("QOLA_GENERATOR_TIMEOUT", 3600.0, "one generator command")
GIT_LOCAL = Knob("QOLA_GIT_TIMEOUT", 600.0, "a git call")
GIT_NETWORK = Knob("QOLA_GIT_TIMEOUT", 3600.0, "a git call that reaches the network")
LOCK = Knob("QOLA_LOCK_TIMEOUT", math.inf, "a wait for a JIT cache lock")
KNOBS = (PROBE, GENERATOR, GIT_LOCAL, LOCK)
COMPILE = 4 * 3600.0  # seconds: one compile or link qola runs itself (never hours of a healthy compiler)
LIMIT = 30 * 24 * 3600.0  # a month: anything longer is written ``inf``


def seconds(knob: Knob, env: Mapping[str, str] | None) -> float:
    """``knob``'s value in ``env`` (its default when unset or empty); a QolaError (exit 2) naming the
    variable for anything but a positive number of seconds or ``inf``."""
    raw = (env or {}).get(knob.variable, "").strip()
    if not raw:
        return knob.default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if raw.lower() in ("inf", "infinity"):
        return math.inf
    if math.isnan(value) or not 0 < value <= LIMIT:
        raise QolaError(
            f"{knob.variable}={raw!r} is not a number of seconds (the limit on {knob.what})",
            hint=f"set it to a positive number up to {LIMIT:g}, or inf for no limit; unset, it is {knob.default:g}",
        )
    return value


def timeout(knob: Knob, env: Mapping[str, str] | None) -> float | None:
    """:func:`seconds` as a ``timeout=`` argument: None for no limit."""
    value = seconds(knob, env)
    return None if math.isinf(value) else value


def shown(value: float | None) -> str:
    return "no limit" if value is None or math.isinf(value) else f"{value:g} s"
