"""Every host-only object proven by its symbols.

qola compiles a unit for the host alone (``--cuda-host-only``) where the plan knows it holds no kernel
(:mod:`qola.compile.devicecode`, and qola's own wrappers). That rule is judged from the generator; the
object is the proof. clang, compiling host-only a unit that defines a ``__global__`` function or
instantiates a ``__global__`` template (or defines a ``__device__`` variable), still emits the host
side of it: the kernel's host stub (``__device_stub__<kernel>``), the kernel handle (a data symbol of
the kernel's own name), ``__hip_module_ctor`` registering it and a reference to the code object
(``__hip_fatbin``, with ``__hip_fatbin_wrapper``, ``__hip_gpubin_handle`` and the
``.hipFatBinSegment`` section) that only a device pass provides. Such a library would launch a
kernel no GPU code was compiled for. Each host-only compile edge is followed by a check edge
(:func:`edge`, ninja runs it whenever the object is rebuilt, on every path that runs ninja) that the
link depends on: an object holding any of those fails its module naming the unit, before the link.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from qola.compile.elf import ObjectSymbols, demangle, object_symbols
from qola.compile.ninja import Edge, command_template
from qola.core.errors import QolaError
from qola.core.fsutil import atomic_write
from qola.core.selfrun import module_argv

STUB = "__device_stub__"
CTOR = "__hip_module_ctor"
REGISTRATION = ("__hip_fatbin", "__hip_gpubin_handle")  # name prefixes: the code object, its handle
SECTIONS = (".hip_fatbin", ".hipFatBinSegment")
MARKERS = tuple(m.encode() for m in (STUB, CTOR, *REGISTRATION, *SECTIONS))
_STUB_LEN = re.compile(r"([0-9]+)" + STUB)  # Itanium: <length><name> of the stub's own name
MAX_NAMED = 5  # kernels named in a message


def kernel_of(stub: str) -> str:
    """The kernel handle's symbol of a host stub's (``_Z19__device_stub__kernILi3EEvPf`` ->
    ``_Z4kernILi3EEvPf``; ``__device_stub__k`` -> ``k``)."""
    if stub.startswith(STUB):
        return stub[len(STUB) :]
    m = _STUB_LEN.search(stub)
    return stub if m is None else f"{stub[: m.start()]}{int(m.group(1)) - len(STUB)}{stub[m.end() :]}"


def device_code(syms: ObjectSymbols) -> tuple[str, ...]:
    """What in an object's symbols shows device code (empty: none)."""
    stubs = sorted(n for n in syms.defined if STUB in n)
    out: list[str] = []
    if stubs:
        names = demangle(stubs)
        handles = [kernel_of(s) for s in stubs if kernel_of(s) in syms.defined]
        shown = ", ".join(n.replace(STUB, "") for n in names[:MAX_NAMED])
        more = f" and {len(stubs) - MAX_NAMED} more" if len(stubs) > MAX_NAMED else ""
        out.append(f"the host stub of kernel {shown}{more} ({len(handles)} kernel handle(s) defined)")
    if CTOR in syms.defined:
        out.append(f"{CTOR} (it registers device code)")
    regs = sorted(n for n in syms.defined | syms.undefined if n.startswith(REGISTRATION))
    if regs:
        out.append("the code-object registration " + ", ".join(regs))
    if secs := sorted(s for s in syms.sections if s in SECTIONS):
        out.append("the section(s) " + ", ".join(secs))
    return tuple(out)


def findings(obj: Path) -> tuple[str, ...]:
    """What shows device code in ``obj`` (empty: none). A missing object (its compile failed) or an
    empty one (a compiler wrapper's stub: :func:`qola.compile.results.empty_objects`) shows none; one
    that is not a readable ELF object cannot prove it holds none."""
    try:
        if not obj.is_file() or obj.stat().st_size == 0:
            return ()
        syms = object_symbols(obj, MARKERS)
    except (QolaError, OSError) as exc:
        text = exc.message if isinstance(exc, QolaError) else str(exc)
        return (f"nothing qola can read ({text})",)
    return () if syms is None else device_code(syms)


RULE_NAME = "hostonly"


def rule(python: str) -> dict[str, str]:
    """The ninja rule of the check edges: ``$in`` is the object then its source, ``$out`` the stamp
    written when it passes (the link depends on it)."""
    return {
        "command": command_template(
            [*module_argv(python, "qola.compile.hostonly"), "--module", "$module", "$in", "$out"]
        ),
        "description": "GEN $module host-only check $out",
    }


def edge(module: str, src: str, obj: str) -> Edge:
    """The check edge of one host-only compile: it runs once the object is (re)built, before the link."""
    return Edge(RULE_NAME, stamp_of(obj), (obj, src), (("module", module),))


def stamp_of(obj: str) -> str:
    return f"{obj}.hostonly"


def error(module: str, src: str, found: tuple[str, ...]) -> QolaError:
    """The failure of a host-only unit whose object holds ``found``: its name and what it holds first
    (a module's summary shows the first 300 characters)."""
    return QolaError(
        f"module {module}: {Path(src).name}, compiled for the host alone (--cuda-host-only), holds device "
        f"code: {'; '.join(found)}. qola judged from the generator that wrote {src} that it holds no kernel; "
        "the library would launch a kernel or use device data that no GPU code was compiled for",
        hint="its generator now writes device code into this file: report it to qola with the file (it then "
        "needs device passes); the next build checks the object again",
    )


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m qola.compile.hostonly --module M OBJ SRC STAMP``: exit 1 naming the unit when OBJ
    holds device code, else write STAMP."""
    parser = argparse.ArgumentParser(prog="python -m qola.compile.hostonly")
    parser.add_argument("--module", required=True)
    parser.add_argument("obj", type=Path)
    parser.add_argument("src")
    parser.add_argument("stamp", type=Path)
    args = parser.parse_args(argv)
    if found := findings(args.obj):
        print(error(args.module, args.src, found).render(), file=sys.stderr)
        args.stamp.unlink(missing_ok=True)
        return 1
    atomic_write(args.stamp, b"no device code\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
