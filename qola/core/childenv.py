"""The environment a child runs under (:class:`ChildEnv`, opaque) and a stage's view of it with its
deadline (:class:`TimedEnv`); :mod:`qola.core.proc` runs children under them. Standard library only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar, TypeVar

from qola.core import deadlines


@dataclass(frozen=True)
class ChildEnv:
    """The environment a child process runs under, built once from the build's environment.
    Opaque on purpose: no setting is read from it (a stage resolves what it reads into typed values
    first, e.g. :class:`qola.toolchain.env.ToolchainEnv`); only :func:`qola.core.proc.popen` opens it."""

    items: tuple[tuple[str, str], ...]

    @classmethod
    def of(cls, env: Mapping[str, str] | ChildEnv) -> ChildEnv:
        return env if isinstance(env, ChildEnv) else cls(tuple(sorted(env.items())))

    def plus(self, extra: Mapping[str, str]) -> ChildEnv:
        """This environment with ``extra`` set over it."""
        return ChildEnv(tuple(sorted({**dict(self.items), **extra}.items()))) if extra else self

    def as_dict(self) -> dict[str, str]:
        return dict(self.items)


_Timed = TypeVar("_Timed", bound="TimedEnv")


@dataclass(frozen=True)
class TimedEnv:
    """A stage's view of the build's environment, resolved once: the environment its children run
    under (opaque) and its deadline variable (:mod:`qola.core.deadlines`) as set, checked when the
    first child runs. Each stage that runs children under a deadline names its knob in a subclass
    (``checkout.git.GitEnv``, ``plan.listing.GeneratorEnv``)."""

    KNOB: ClassVar[deadlines.Knob]
    child: ChildEnv
    timeout_raw: str | None = None

    @classmethod
    def of(cls: type[_Timed], env: Mapping[str, str] | TimedEnv) -> _Timed:
        if isinstance(env, cls):
            return env
        assert isinstance(env, Mapping), f"{cls.__name__}.of: a mapping or a {cls.__name__}, not {type(env).__name__}"
        return cls(ChildEnv.of(env), env.get(cls.KNOB.variable))

    def timeout(self, knob: deadlines.Knob | None = None) -> float | None:
        """The deadline of ``knob`` (default: the stage's) under the variable as set."""
        knob = knob or self.KNOB
        return deadlines.timeout(knob, {knob.variable: self.timeout_raw or ""})
