"""Whether a CUDA unit holds device code, read from what it holds: its text and every header it can
read through its include dirs (:meth:`qola.compile.includes.HeaderScanner.every`), never its name.

A unit holds device code when one of those files, comments and literals aside, in any ``#if`` branch,
spells in its code (not only in a ``#define``):

* a kernel or device data: ``__global__``, ``__shared__``, ``__constant__``, ``__managed__``, or a
  launch ``<<<``;
* a ``__device__`` *variable* (a ``__device__`` function, inline in a header, compiles to nothing
  until a kernel calls it, and a kernel is ``__global__``: qola compiles whole-program, no ``-rdc``);
* a macro whose body spells one of those (``#define QK_GLOBAL __global__``), followed through other
  macros; a function-like macro that spells ``__device__`` counts as a kernel (its use cannot be read).

A unit that reads a file named by a macro (``#include MACRO``) or a file it cannot read, or whose flags
ask for relocatable device code (``-rdc=true``, ``-dc``), holds device code as far as qola can tell;
so does one whose tree's or build dir's files (:attr:`DeviceScan.own`) test a macro nvcc defines and the host compiler does not (``__CUDACC__``,
``__CUDA_ARCH__``, …): what such a conditional keeps or drops would differ in a host-only compile,
without a word (headers outside the tree, CUDA's and pybind11's, are the host compiler's as for any
C++ program).
Every other unit compiles host-only (:func:`qola.toolchain.cuda.host_only`), and its object is
checked after the compile (:mod:`qola.compile.hostonly`): a unit this rule missed is compiled again
with device passes.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from qola.compile.includes import HeaderScanner, search_path
from qola.core.errors import QolaError

STRONG = frozenset({b"__global__", b"__shared__", b"__constant__", b"__managed__", b"<<<"})
DEVICE = b"__device__"
RDC = ("-rdc=true", "--relocatable-device-code=true", "-dc", "--device-c", "-rdc", "--relocatable-device-code")

_DROP = re.compile(rb'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])\'', re.S)
_DEFINE = re.compile(rb"^[ \t]*#[ \t]*define[ \t]+([A-Za-z_]\w*)(\(?)(.*)$")
_TOKEN = re.compile(rb"[A-Za-z_]\w*|<<<")
_CONDITION = re.compile(rb"^[ \t]*#[ \t]*(?:if|ifdef|ifndef|elif|elifdef|elifndef)\b")
# what nvcc defines and a host compiler does not: code a conditional on one of these keeps or drops
# would differ in a host-only compile, silently (the unit keeps its device passes)
NVCC_MACROS = frozenset({b"__CUDACC__", b"__NVCC__", b"__CUDA_ARCH__", b"__CUDACC_VER_MAJOR__", b"__CUDACC_RDC__"})


def _blank(m: re.Match[bytes]) -> bytes:
    text = m.group()
    return b'""' if text[:1] in b"\"'" else b"\n" * text.count(b"\n") or b" "


@dataclass(frozen=True)
class Facts:
    """One file, read: its code (every line but the directives), its macros (name -> (body, whether
    it takes arguments)) and the CUDA compiler macro a conditional of it tests (None: none)."""

    code: bytes
    defines: dict[bytes, tuple[bytes, bool]]
    tests_nvcc: bytes | None = None


def facts_of(text: bytes) -> Facts:
    text = _DROP.sub(_blank, text).replace(b"\\\n", b" ")
    code: list[bytes] = []
    defines: dict[bytes, tuple[bytes, bool]] = {}
    tests = None
    for line in text.split(b"\n"):
        if line.lstrip().startswith(b"#"):
            if m := _DEFINE.match(line):
                defines[m.group(1)] = (m.group(3), bool(m.group(2)))
            elif tests is None and _CONDITION.match(line):
                tests = next((t for t in _TOKEN.findall(line) if t in NVCC_MACROS), None)
        else:
            code.append(line)
    return Facts(b"\n".join(code), defines, tests)


def _aliases(defines: dict[bytes, tuple[bytes, bool]]) -> tuple[set[bytes], set[bytes]]:
    """(the macros that spell a kernel or device data, those that spell ``__device__``), followed
    through each other until nothing changes."""
    strong, device = set(STRONG), {DEVICE}
    changed = True
    while changed:
        changed = False
        for name, (body, takes_args) in defines.items():
            used = set(_TOKEN.findall(body))
            if name not in strong and (used & strong or (takes_args and used & device)):
                strong.add(name)
                changed = True
            elif name not in device and used & device:
                device.add(name)
                changed = True
    return strong, device


def _is_variable(code: bytes, at: int) -> bool:
    """Whether the declaration that goes on at ``at`` declares a variable: it reaches ``;``, ``=`` or
    ``{`` before a ``(`` (outside ``<…>``)."""
    depth = 0
    for ch in code[at : at + 4096]:
        if ch == ord("<"):
            depth += 1
        elif ch == ord(">"):
            depth = max(0, depth - 1)
        elif depth == 0 and ch == ord("("):
            return False
        elif depth == 0 and ch in b";={":
            return True
    return False


@dataclass
class DeviceScan:
    """Reads units and their headers once per build (each file's facts kept)."""

    own: tuple[str, ...] = ()  # the tree's and the build dir's roots: whose files' conditionals count
    _facts: dict[Path, Facts | None] = field(default_factory=dict)
    _scanners: dict[tuple[str, ...], HeaderScanner] = field(default_factory=dict)

    def _read(self, path: Path, scanner: HeaderScanner) -> Facts | None:
        if path not in self._facts:
            try:
                self._facts[path] = facts_of(scanner.read(path))
            except (OSError, QolaError):
                self._facts[path] = None
        return self._facts[path]

    def _owned(self, path: Path) -> bool:
        """Whether ``path`` is the tree's or the build's (``own``; none given: every file)."""
        real = os.path.realpath(path)
        return not self.own or any(real == r or real.startswith(r.rstrip("/") + "/") for r in self.own)

    def device_code(self, src: str, flags: Sequence[str]) -> str | None:
        """Why the unit ``src`` compiled with ``flags`` holds device code (None: it holds none)."""
        if rdc := [f for f in flags if f in RDC or f.startswith(("-rdc=t", "--relocatable-device-code=t"))]:
            return f"its flags ask for relocatable device code ({rdc[0]})"
        dirs, forced = search_path(list(flags))
        scanner = self._scanners.setdefault(dirs, HeaderScanner([Path(d) for d in dirs]))
        files: dict[Path, None] = {}
        for unit in (*forced, src):
            found, opaque = scanner.every(Path(unit))
            if opaque:
                return f"{Path(unit).name} or a header it reads includes a file named by a macro"
            files.update(dict.fromkeys(found))
        read = {f: self._read(f, scanner) for f in files}
        if missing := [f for f, facts in read.items() if facts is None]:
            return f"qola cannot read {missing[0]}"
        known = {f: facts for f, facts in read.items() if facts is not None}
        strong, device = _aliases({k: v for facts in known.values() for k, v in facts.defines.items()})
        for path, facts in known.items():
            for m in _TOKEN.finditer(facts.code):
                tok = m.group()
                if tok in strong or (tok in device and _is_variable(facts.code, m.end())):
                    shown = tok.decode()
                    what = shown if tok in STRONG or tok == DEVICE else f"{shown} (a macro that spells device code)"
                    return f"{path.name} holds {what}"
        for path, facts in known.items():
            if facts.tests_nvcc is not None and self._owned(path):
                return f"{path.name} tests {facts.tests_nvcc.decode()}, which a host-only compile would not define"
        return None
