"""Every host-only object proven by its symbols, and compiled again with device passes when it holds
device code.

qola compiles a unit for the host alone where it judges it holds no kernel: HIP (``--cuda-host-only``)
from the generator that wrote it (:mod:`qola.compile.devicecode`) and qola's own wrappers; CUDA
(``-x c++``: :func:`qola.toolchain.cuda.host_only`) from what the unit and its headers hold
(:mod:`qola.compile.devicescan`). Those rules judge; the object is the proof. clang, compiling host-only a unit that defines a ``__global__`` function or
instantiates a ``__global__`` template (or defines a ``__device__`` variable), still emits the host
side of it: the kernel's host stub (``__device_stub__<kernel>``), the kernel handle (a data symbol of
the kernel's own name), ``__hip_module_ctor`` registering it and a reference to the code object
(``__hip_fatbin``, with ``__hip_fatbin_wrapper``, ``__hip_gpubin_handle`` and the
``.hipFatBinSegment`` section) that only a device pass provides. Such a library would launch a
kernel no GPU code was compiled for. Each host-only compile edge is followed by a check edge
(:func:`edge`, ninja runs it whenever the object is rebuilt, on every path that runs ninja) that the
link depends on. CUDA's host compiler turns a kernel into a plain host function; qola's host-only line
defines ``__global__``, ``__constant__`` and ``__managed__`` to put what they declare in sections of
its own (``.qola_cuda_global``, ``.qola_cuda_data``), and nvcc's registration (``.nv_fatbin``,
``__cudaRegisterFatBinary``, ``__fatbinwrap``, ``__device_stub__``) is looked for too.

An object holding any of those is compiled again, by the check edge, with the device passes its unit
needs (the same line with them: ``argv`` after ``--``), and the module's log says so; the link then
takes that object. The object keeps the time the host-only compile gave it: ninja holds the compile's
header list valid while the object is no newer than when it recorded it (a newer one would make the
compile edge dirty at every build, and the two compiles take turns). The edge's depfile is the device compile's (an empty one when the object held no
device code), so a header only the device passes read rebuilds it. The host-only compile's line is
unchanged (what a compiler wrapper such as ck-jit reads). Without a device line (an older graph), such
an object fails its module naming the unit, before the link.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from qola.compile.elf import ObjectSymbols, demangle, object_symbols
from qola.compile.ninja import DEPFILE, Compile, Edge, command_template, escape_flags
from qola.core import deadlines, inputs, proc
from qola.core.errors import QolaError
from qola.core.fsutil import atomic_write
from qola.core.selfrun import module_argv
from qola.toolchain.portable import depfile_of

STUB = "__device_stub__"
CTOR = "__hip_module_ctor"
# name prefixes: HIP's code object and its handle; nvcc's registration and its wrapper
REGISTRATION = ("__hip_fatbin", "__hip_gpubin_handle", "__cudaRegisterFatBinary", "__fatbinwrap")
CUDA_MARKS = (".qola_cuda_global", ".qola_cuda_data")  # what qola's CUDA host-only line puts kernels, data in
GPU_CODE = (".hip_fatbin", ".nv_fatbin", "__nv_relfatbin")  # the code object itself: only a device pass writes it
SECTIONS = (*GPU_CODE, ".hipFatBinSegment", *CUDA_MARKS)
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
        marked = [s for s in secs if s in CUDA_MARKS]
        out.append("the section(s) " + ", ".join(secs) + (" (a __global__ or device variable)" if marked else ""))
    return tuple(out)


def examine(obj: Path) -> tuple[tuple[str, ...], bool]:
    """(what shows device code in ``obj``, empty: none; whether device passes compiled it: it holds the
    GPU code itself, a section of :data:`GPU_CODE` and none of qola's host-only marks). A missing object
    (its compile failed) or an empty one (a compiler wrapper's stub:
    :func:`qola.compile.results.empty_objects`) shows none; one that is not a readable ELF object cannot
    prove it holds none."""
    try:
        if not obj.is_file() or obj.stat().st_size == 0:
            return (), False
        syms = object_symbols(obj, MARKERS)
    except (QolaError, OSError) as exc:
        text = exc.message if isinstance(exc, QolaError) else str(exc)
        return (f"nothing qola can read ({text})",), False
    if syms is None:
        return (), False
    return device_code(syms), bool(syms.sections & set(GPU_CODE)) and not syms.sections & set(CUDA_MARKS)


def findings(obj: Path) -> tuple[str, ...]:
    """What shows device code in ``obj`` (:func:`examine`; empty: none)."""
    return examine(obj)[0]


RULE_NAME = "hostonly"


def rule(python: str, device: Sequence[str] = ()) -> dict[str, str]:
    """The ninja rule of the check edges: ``$in`` is the object then its source, ``$out`` the stamp
    written when it passes (the link depends on it); ``device``: the compile line with device passes
    (a template of ``$src``, ``$obj``, the edge's ``$flags`` and ``$archs``) that replaces an object
    holding device code."""
    argv = [*module_argv(python, "qola.compile.hostonly"), "--module", "$module", "$in", "$out"]
    return {
        "command": command_template([*argv, *(("--", *device) if device else ())]),
        "description": "GEN $module host-only check $out",
        "depfile": DEPFILE,  # the stamp's (portable.depfile_of): bound per edge as every compile's
        "deps": "gcc",
    }


def edge(module: str, compiled: Compile, device: Sequence[str]) -> Edge:
    """The check edge of one host-only compile (it runs once the object is (re)built, before the link),
    bound to the compile's flags and ``device``: the passes it compiles with when its object holds
    device code."""
    flags = f"${compiled.flags_var}" + (f" {escape_flags(compiled.extra_flags)}" if compiled.extra_flags else "")
    bound = (
        ("module", module),
        ("flags", flags),
        ("archs", escape_flags(device)),
        ("src", escape_flags([compiled.src])),
        ("obj", escape_flags([compiled.obj])),
    )
    return Edge(RULE_NAME, stamp_of(compiled.obj), (compiled.obj, compiled.src), bound)


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


def recompiled(module: str, src: str, found: tuple[str, ...]) -> str:
    """The module log's line for a host-only unit compiled again with device passes."""
    return (
        f"qola: module {module}: {Path(src).name} was compiled for the host alone, but its object holds device "
        f"code ({'; '.join(found)}): compiled again with device passes"
    )


def _depfile(stamp: Path, obj: Path) -> None:
    """The check edge's depfile (:func:`qola.toolchain.portable.depfile_of` the stamp): the device
    compile's, its target made the stamp; an empty one when no compile ran here (or the compiler wrote
    none)."""
    made = Path(depfile_of(str(obj)))
    deps = ""
    try:
        text = inputs.read_checked(made, limit=inputs.MAX_SOURCE, what="depfile").decode(errors="surrogateescape")
        deps = text.split(": ", 1)[1]
        made.unlink()
    except (OSError, QolaError, IndexError):
        deps = "\n"
    target = str(stamp).replace(" ", "\\ ")
    atomic_write(Path(depfile_of(str(stamp))), f"{target}: {deps}".encode(errors="surrogateescape"))


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m qola.compile.hostonly --module M OBJ SRC STAMP [-- DEVICE_ARGV…]``: when OBJ holds
    device code, compile it again with DEVICE_ARGV (saying so), or without one exit 1 naming the unit;
    then write STAMP and its depfile."""
    parser = argparse.ArgumentParser(prog="python -m qola.compile.hostonly")
    parser.add_argument("--module", required=True)
    parser.add_argument("obj", type=Path)
    parser.add_argument("src")
    parser.add_argument("stamp", type=Path)
    parser.add_argument("device", nargs="*")
    args = parser.parse_args(argv)
    text = b"no device code\n"
    found, compiled = examine(args.obj)
    if found and compiled:  # its host-only compile failed and the edge compiled it with device passes
        text = f"device code: compiled with device passes ({'; '.join(found)})\n".encode()
    elif found:
        if not args.device:
            print(error(args.module, args.src, found).render(), file=sys.stderr)
            args.stamp.unlink(missing_ok=True)
            return 1
        print(recompiled(args.module, args.src, found), flush=True)
        was = args.obj.stat()
        done = proc.run(args.device, timeout=deadlines.COMPILE)
        print(done.stdout or "", end="", flush=True)
        if done.returncode != 0:
            args.stamp.unlink(missing_ok=True)
            return done.returncode or 1
        os.utime(args.obj, ns=(was.st_atime_ns, was.st_mtime_ns))  # the time ninja recorded its deps at
        text = f"device code: compiled again with device passes ({'; '.join(found)})\n".encode()
    _depfile(args.stamp, args.obj)
    atomic_write(args.stamp, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
