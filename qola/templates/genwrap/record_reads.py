#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Run a kernel generator and record what it read: qola's depfile for generators.

    python record_reads.py RECORD.json GENERATOR.py [ARGS...]

runs GENERATOR.py with ARGS as ``python GENERATOR.py ARGS`` would (``sys.argv``, ``sys.path[0]``: the
script's real directory, ``__main__``) and writes RECORD.json when it ends, on failure too: the
files it opened for reading and for writing (audit event ``open``), the directories it listed
(``os.listdir``/``os.scandir``, the import system's own listings left out), the module files it
imported (``sys.modules``, and the sources of the ``.pyc`` files it read), the environment variables
it looked up (``os.environ``/``os.getenv``; a variable it set itself is not its input), whether it
iterated the whole environment, the toolchain probes it ran (``hipconfig``: :data:`PROBES`, as inputs),
and whether it started any other program (``subprocess``,
``os.system``, ``os.exec*``, ``os.posix_spawn``, ``os.fork``...: then what that program read is unknown,
and qola never reuses the record). Written by qola (qola.plan.genread); standard library only.
"""

import contextlib
import json
import os
import runpy
import sys
import sysconfig

SPAWNS = ("subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty",
          "pty.spawn", "os.startfile")  # fmt: skip
# version probes of the toolchain qola keys its builds on (AITER's cpp_extension runs `hipconfig --version`
# at import): recorded as inputs (the program's file and its argv), not as an unknown program
PROBES = ("hipconfig",)
READS, WRITES, DIRS, ENV, PROGRAMS = set(), set(), set(), {}, set()
STATE = {"spawned": None, "broken": None, "all_env": False}
WRITTEN_ENV = set()


def _path(obj):
    if isinstance(obj, int):
        return None
    p = os.fsdecode(os.fspath(obj))
    return os.path.abspath(p) if p else None


def _mode(mode, flags):
    """(read, write) of an ``open`` event."""
    if isinstance(mode, str):
        return ("r" in mode or "+" in mode), any(c in mode for c in "wax+")
    acc = (flags or 0) & os.O_ACCMODE
    return acc in (os.O_RDONLY, os.O_RDWR), acc in (os.O_WRONLY, os.O_RDWR)


def _hook(event, args):
    try:
        if event == "open":
            p = _path(args[0])
            if p is not None:
                r, w = _mode(args[1], args[2] if len(args) > 2 else 0)
                (READS.add(p) if r else None), (WRITES.add(p) if w else None)
        elif event in ("os.listdir", "os.scandir"):
            caller = sys._getframe(1).f_code.co_filename
            if not caller.startswith("<frozen") and "importlib" not in caller:
                p = _path(args[0] if args and args[0] is not None else ".")
                if p is not None:
                    DIRS.add(p)
        elif event.startswith(SPAWNS):
            probe = _probe(event, args)
            if probe is not None:
                PROGRAMS.add(probe)
            elif STATE["spawned"] is None:
                STATE["spawned"] = event
    except Exception as exc:  # never fail the generator: a record that missed something is not reused
        STATE["broken"] = f"{event}: {exc!r}"


def _probe(event, args):
    """(program as named, its argv) when ``event`` starts one of :data:`PROBES`, else None."""
    if event not in ("subprocess.Popen", "os.exec", "os.posix_spawn") or len(args) < 2:
        return None
    argv = args[1]
    argv = [argv] if isinstance(argv, (str, bytes)) else list(argv or ())
    prog = args[0] if args[0] is not None else (argv[0] if argv else "")
    prog = os.fsdecode(os.fspath(prog))
    if os.path.basename(prog) not in PROBES or not all(isinstance(a, (str, bytes)) for a in argv):
        return None
    return prog, tuple(os.fsdecode(a) for a in argv)


class _Environ(type(os.environ)):
    """``os.environ`` recording each variable looked up (absent ones too) before the generator set it."""

    def __getitem__(self, key):
        try:
            value = super().__getitem__(key)
        except KeyError:
            if key not in WRITTEN_ENV:
                ENV.setdefault(key, None)
            raise
        if key not in WRITTEN_ENV:
            ENV.setdefault(key, value)
        return value

    def __setitem__(self, key, value):
        if key not in ENV:
            WRITTEN_ENV.add(key)
        super().__setitem__(key, value)

    def __delitem__(self, key):
        if key not in ENV:
            WRITTEN_ENV.add(key)
        super().__delitem__(key)

    def __iter__(self):
        STATE["all_env"] = True
        return super().__iter__()


def _modules():
    """Every module file in ``sys.modules`` and the source of every ``.pyc`` read."""
    import importlib.util

    found = set()
    for mod in list(sys.modules.values()):
        f = getattr(mod, "__file__", None)
        if isinstance(f, str) and f:
            found.add(os.path.abspath(f))
    for p in list(READS):
        if p.endswith(".pyc") and "__pycache__" in p:
            with contextlib.suppress(ValueError):
                found.add(importlib.util.source_from_cache(p))
    return found


def _write(record_path, script, exit_code):
    system = sorted({os.path.realpath(p) for k in ("stdlib", "platstdlib", "purelib", "platlib")
                     if (p := sysconfig.get_paths().get(k))})  # fmt: skip
    record = {
        "format": 1,
        "script": script,
        "python": sys.executable,
        "version": sys.version,
        "system": system,
        "reads": sorted(READS - WRITES),
        "modules": sorted(_modules() - WRITES),
        "dirs": sorted(DIRS),
        "programs": sorted([p, list(a)] for p, a in PROGRAMS),
        "env": ENV,
        "all_env": STATE["all_env"],
        "spawned": STATE["spawned"],
        "broken": STATE["broken"],
        "exit": exit_code,
    }
    tmp = f"{record_path}.tmp"
    with open(tmp, "w") as fh:
        json.dump(record, fh)
    os.replace(tmp, record_path)


ARGV_FILE = "--qola-argv-file="  # qola.plan.genread.ARGV_FILE


def main():
    if len(sys.argv) < 3:
        sys.exit("usage: record_reads.py RECORD.json GENERATOR.py [ARGS...] | RECORD.json --qola-argv-file=PATH")
    if sys.argv[2].startswith(ARGV_FILE):  # a list past the OS's argument limits: qola wrote it to a file
        with open(sys.argv[2][len(ARGV_FILE) :], encoding="utf-8", errors="surrogateescape") as fh:
            sys.argv[2:] = json.load(fh)
    record_path, script = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    sys.argv = [script, *sys.argv[3:]]
    sys.path[0] = os.path.dirname(os.path.realpath(script))  # as `python GENERATOR.py` sets it
    os.environ.__class__ = _Environ
    sys.addaudithook(_hook)
    code = 0
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        raise
    except BaseException:
        code = 1
        raise
    finally:
        _write(record_path, script, code)


if __name__ == "__main__":
    main()
