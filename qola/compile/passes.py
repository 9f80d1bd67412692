"""Each compile edge's device passes (its ``$archs``) and the line that replaces a host-only object
holding device code.

* HIP: a generated file the archs it holds code for (:func:`qola.compile.devicecode.source_archs`: CK's
  ``…_gfx9`` file no gfx950 pass), every other source all the build's archs; qola's own wrapper and
  the generated files whose generator writes no kernel (:mod:`qola.compile.devicecode`) add
  ``--cuda-host-only``: no device pass runs (a third of the CPU, the same object), and the line still
  names the archs, as tools that read them from compile lines expect (ck-jit's post-build takes the
  first recorded line's).
* CUDA: nvcc's device passes (``-x cu``) for a unit that holds device code as its text and headers
  show it (:mod:`qola.compile.devicescan`), else the host compiler (``-x c++``:
  :attr:`qola.toolchain.Toolchain.host_only`).

Every host-only object is checked after its compile and compiled again with :func:`device_of`'s
passes when it holds device code (:mod:`qola.compile.hostonly`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from qola.compile import ninja
from qola.compile.devicescan import DeviceScan
from qola.toolchain import Toolchain, cuda
from qola.toolchain.hip import HOST_ONLY, arch_flags


def every(tc: Toolchain) -> tuple[str, ...]:
    """HIP: the device passes of every arch of the build (each compile edge names its own); else none."""
    return tuple(arch_flags(tc.archs)) if tc.kind == "hip" else ()


def of_sources(
    tc: Toolchain, sources: Sequence[str], host: set[str], served: Mapping[str, tuple[str, ...]]
) -> dict[str, tuple[str, ...]]:
    """What each source compiles, in order -> its device passes. HIP: ``host`` (the units judged to hold
    no kernel) host-only, ``served`` (a generated file -> its archs) those archs, the rest every arch.
    CUDA: every unit nvcc's device passes (:func:`for_cuda` decides per unit, from its text)."""
    if tc.kind != "hip":
        return dict.fromkeys(sources, cuda.DEVICE_PASSES)
    all_archs = every(tc)
    return {
        s: (*all_archs, HOST_ONLY) if s in host else tuple(arch_flags(served[s])) if s in served else all_archs
        for s in sources
    }


def for_cuda(tc: Toolchain, scan: DeviceScan, src: str, flags: Sequence[str]) -> tuple[tuple[str, ...], str | None]:
    """(a CUDA unit's passes, why it needs device passes: None when it is compiled host-only)."""
    why = scan.device_code(src, flags)
    return (cuda.DEVICE_PASSES if why or not tc.host_only else tc.host_only), why


def device_of(tc: Toolchain, passes: tuple[str, ...]) -> tuple[str, ...] | None:
    """The passes a host-only edge's unit compiles with when its object holds device code; None for an
    edge that is not host-only."""
    if tc.kind == "hip":
        return tuple(p for p in passes if p != HOST_ONLY) if HOST_ONLY in passes else None
    return cuda.DEVICE_PASSES if tc.host_only and passes == tc.host_only else None


def compile_line(tc: Toolchain, src: str, obj: str, launcher: str | None, archs: str = "$archs") -> list[str]:
    """A compile rule's argv (a template: ``src``, ``obj``, ``$flags`` and the passes' variable
    ``archs``). HIP names its passes after the flags, before ``-MD -x hip``; CUDA names them in the
    language's place (``-x cu`` or the host-only spelling)."""
    if tc.kind == "hip":
        line = tc.compile_argv(src, obj, ["$flags", archs])
    else:
        line = dataclasses.replace(tc, lang_args=(archs,)).compile_argv(src, obj, ["$flags"])
    return ([launcher] if launcher else []) + line


# what a host-only edge prints when its compile failed and the device passes' compile runs instead
FELL_BACK = "qola: module %s: %s: its host-only compile failed: compiled again with device passes\\n"


def host_only_command(tc: Toolchain, launcher: str | None) -> str:
    """The command of a host-only compile edge (rule :data:`qola.compile.ninja.HOST_RULE`): the
    host-only line (``$archs``), its output kept back; when it fails (a unit whose device code the
    rule that judged it did not see: ``threadIdx`` undeclared for the host compiler), a line saying
    so and the same line with the unit's device passes (``$device``), whose outcome is the edge's. An
    object that holds device code after a host-only compile that succeeded is the check edge's
    (:mod:`qola.compile.hostonly`)."""
    host = ninja.command_template(compile_line(tc, "$in", "$out", launcher))
    device = ninja.command_template(compile_line(tc, "$in", "$out", launcher, "$device"))
    return f"{host}{_KEPT_BACK}{{ printf '{FELL_BACK}' $module $in; {device}; }}"


_KEPT_BACK = " >/dev/null 2>&1 || "


def host_and_device(command: str) -> tuple[str, str] | None:
    """A host-only edge's command as ninja expands it (``ninja -t commands``, ``-t compdb``): (its
    host-only line, the line with device passes it falls back to); None for any other command."""
    host, sep, rest = command.partition(_KEPT_BACK)
    if not sep or not rest.startswith("{ printf ") or not rest.endswith("; }"):
        return None
    device = rest[: -len("; }")].split("; ", 1)
    return (host, device[1]) if len(device) == 2 else None
