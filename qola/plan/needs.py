"""What a cpp_itfs module needs to contain kernels, decided by what the tree's sources ask for.

qola's registry (``registry.toml``) names, per module, preprocessor *switches* (``FAV3_ON``) and
*needed generators* (``hsa/codegen.py -m fmha_v3_fwd``, which alone writes
``asm_fmha_v3_fwd_configs.hpp``). Whether they apply is read from the module's own sources, not
from a list of AITER commits (which cannot know the commits to come):

* a switch applies when a source tests it in a preprocessor conditional (``#if FAV3_ON``,
  ``#ifdef``, ``#elif … defined(FAV3_ON)``); qola adds ``-D<NAME>=1`` unless the tree's table or
  the manifest already defines it (AITER's slim trees carry it in ``flags_extra_cc``);
* a needed generator applies when a source ``#include``\\ s the file it writes and no generator of
  the module runs the same command already.

:func:`gates` is also the build's check: a source gating code on a switch that the module's flags
leave undefined or ``0`` compiles that path out (:func:`off_switches`), and the module fails naming
the switch. Pure: reads source files (size-limited), never writes.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from qola.core.errors import QolaError
from qola.plan.registry import RegistryEntry
from qola.plan.tree.files import read_small

MAX_SOURCE = 16 << 20  # one module source read for its conditionals (AITER's largest: about 200 KiB)
_COND = re.compile(rb"^[ \t]*#[ \t]*(?:if|elif|ifdef|ifndef)\b([^\n]*)", re.MULTILINE)
_INCLUDE = re.compile(rb'^[ \t]*#[ \t]*include[ \t]*[<"]([^>"\n]+)[>"]', re.MULTILINE)
_DEFINE = re.compile(r"^-D([A-Za-z_][A-Za-z0-9_]*)(?:=(.*))?$")


@dataclass(frozen=True)
class Needs:
    """What the registry adds to one module, and the switches its sources gate code on."""

    flags: tuple[str, ...] = ()  # -D<NAME>=1 added
    generators: tuple[str, ...] = ()  # evaluated commands added
    gates: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (source path, switches it tests)
    notes: tuple[str, ...] = ()


def _read(path: str) -> bytes:
    try:
        return read_small(path, limit=MAX_SOURCE, what="module source")
    except FileNotFoundError:
        return b""


def tested(text: bytes, names: Iterable[str]) -> tuple[str, ...]:
    """The ``names`` a preprocessor conditional of ``text`` tests."""
    conds = b" ".join(_COND.findall(text))
    return tuple(n for n in names if re.search(rb"\b" + n.encode() + rb"\b", conds))


def included(text: bytes) -> set[str]:
    """Base names of every file ``text`` includes."""
    return {os.path.basename(m.decode("utf-8", "replace")) for m in _INCLUDE.findall(text)}


def defines(flags: Iterable[str]) -> dict[str, str]:
    """NAME -> value of each ``-DNAME[=value]`` in ``flags`` (AITER writes several words in one
    entry); a later ``-U NAME`` removes it."""
    out: dict[str, str] = {}
    words = [w for f in flags for w in (shlex.split(f) if f.strip() else [])]
    for i, w in enumerate(words):
        if w == "-D" and i + 1 < len(words):
            w = "-D" + words[i + 1]
        if (m := _DEFINE.match(w)) is not None:
            out[m.group(1)] = "1" if m.group(2) is None else m.group(2)
        elif w.startswith("-U") and len(w) > 2:
            out.pop(w[2:], None)
    return out


def is_on(value: str | None) -> bool:
    """Whether ``#if NAME`` takes its branch for a macro defined as ``value`` (None: undefined)."""
    if value is None:
        return False
    v = value.strip().rstrip("uUlL")
    try:
        return int(v, 0) != 0
    except ValueError:
        return bool(v)  # another macro or expression: not decidable here, taken as set


def _same(a: str, b: str) -> bool:
    try:
        x, y = shlex.split(a), shlex.split(b)
    except ValueError:
        return a.strip() == b.strip()

    def norm(argv: list[str]) -> list[str]:
        return [os.path.normpath(argv[0]), *argv[1:]] if argv else argv

    return norm(x) == norm(y)


def needs(
    module: str,
    reg: RegistryEntry,
    sources: Sequence[str],
    flags: Iterable[str],
    generators: Sequence[str],
    evaluate: Callable[[str], str],
) -> Needs:
    """What ``reg`` adds to ``module`` whose own ``sources`` (the tree's, before qola's wrappers),
    compile ``flags`` (table + manifest) and generator ``generators`` are given. ``evaluate`` turns
    a registry command expression into the command (the table's safe evaluator)."""
    if not reg.switches and not reg.generators:
        return Needs()
    texts = {s: _read(s) for s in sources}
    gates = tuple((s, g) for s, t in texts.items() if (g := tested(t, reg.switches)))
    have = defines(flags)
    wanted = sorted({n for _, g in gates for n in g}, key=reg.switches.index)
    add_flags = tuple(f"-D{n}=1" for n in wanted if n not in have)
    notes = []
    if add_flags:
        names = ", ".join(sorted({os.path.basename(s) for s, _ in gates}))
        notes.append(
            f"module {module}: {names} gate{'s' if len(gates) == 1 else ''} kernel paths on "
            f"{', '.join(wanted)}; qola's registry adds {' '.join(add_flags)}"
        )
    heads: set[str] = set().union(*(included(t) for t in texts.values()))
    add_gens: list[str] = []
    for need in reg.generators:
        if need.writes not in heads:
            continue
        cmd = evaluate(need.command)
        if not isinstance(cmd, str) or not cmd.strip():
            raise QolaError(
                f"qola registry: module {module}: generator command for {need.writes} evaluates to "
                f"{cmd!r}, not a command"
            )
        if not any(_same(cmd, g) for g in [*generators, *add_gens]):
            add_gens.append(cmd)
            notes.append(
                f"module {module}: a source includes {need.writes}; qola's registry adds its generator "
                f"{shlex.split(cmd)[0] if cmd.strip() else cmd}"
            )
    return Needs(add_flags, tuple(add_gens), gates, tuple(notes))


def off_switches(
    gates: Sequence[tuple[str, Sequence[str]]],
    flags: Iterable[str],
    per_source: Mapping[str, Iterable[str]] | None = None,
) -> list[tuple[str, list[str]]]:
    """(source, switches it gates on that ``flags`` (+ its per-source flags) leave off), for each
    source with any."""
    out = []
    for src, names in gates:
        have = defines([*flags, *((per_source or {}).get(src, ()))])
        off = [n for n in names if not is_on(have.get(n))]
        if off:
            out.append((src, off))
    return out


def off_message(module: str, off: Sequence[tuple[str, Sequence[str]]], all_off: bool) -> str:
    parts = "; ".join(
        f"{os.path.basename(s)} gates kernel code on {', '.join(n)}, which this build leaves undefined or 0"
        for s, n in off
    )
    tail = (
        " — every kernel path of its entry point is compiled out: it would return -1 for every call"
        if all_off
        else " — those kernel paths are compiled out"
    )
    return f"module {module}: {parts}{tail}"
