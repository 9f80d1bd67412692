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
iterated the whole environment (``os.environb`` too), each file's state as it was opened for reading
(size, mtime and sha256, taken at the open: a file saved while the generator runs is recorded as the
generator read it, and one that another open found changed marks the run ``changed``, never reused),
the paths it only looked at (``os.stat``: ``os.path.exists``/``isfile``/``isdir``/``getmtime``, ``pathlib``'s
``exists()``/``stat()``; an optional input it skipped because it was absent counts when it appears),
the toolchain probes it ran (``hipconfig``: :data:`PROBES`, as inputs),
and whether it started any other program (``subprocess``,
``os.system``, ``os.exec*``, ``os.posix_spawn``, ``os.fork``...: then what that program read is unknown,
and qola never reuses the record). Written by qola (qola.plan.genread); standard library only.
"""

import contextlib
import hashlib
import importlib.util
import json
import os
import runpy
import stat
import sys
import sysconfig
import threading

SPAWNS = ("subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty",
          "pty.spawn", "os.startfile")  # fmt: skip
# version probes of the toolchain qola keys its builds on (AITER's cpp_extension runs `hipconfig --version`
# at import): recorded as inputs (the program's file and its argv), not as an unknown program
PROBES = ("hipconfig",)
READS, WRITES, DIRS, ENV, PROGRAMS = set(), set(), set(), {}, set()
STATE = {"spawned": None, "broken": None, "all_env": False, "done": False}
LOCAL = threading.local()  # .busy: this thread is in the recorder (its own opens and stats are no reads)
WRITTEN_ENV = set()
OPENED, CHANGED, STATS = {}, set(), {}  # path -> [size, mtime_ns, sha256 | ""]; paths found changed; path -> its stat
MAX_HASH = 256 << 20  # qola.plan.genread.MAX_INPUT: past it, no digest (qola never reuses the run)
SYSTEM = []  # the interpreter's own library dirs: their files by size and mtime alone
_STAT = os.stat


def _system_dirs():
    return sorted({os.path.realpath(p) for k in ("stdlib", "platstdlib", "purelib", "platlib")
                   if (p := sysconfig.get_paths().get(k))})  # fmt: skip


def _sha256(path):
    """sha256 of the regular file ``path`` (no wait on a FIFO swapped in), None when it cannot be read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        h = hashlib.sha256()
        while chunk := os.read(fd, 1 << 20):
            h.update(chunk)
        return h.hexdigest()
    except OSError:
        return None
    finally:
        os.close(fd)


def _opened(path):
    """Note ``path``'s state as the generator opens it for reading (first open; a later one that finds
    other content marks it changed)."""
    try:
        st = _STAT(path)
    except OSError:
        return
    if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_HASH:
        return
    prev = OPENED.get(path)
    if prev is not None and prev[:2] == [st.st_size, st.st_mtime_ns]:
        return
    system = any(os.path.realpath(path).startswith(d.rstrip("/") + "/") for d in SYSTEM)
    digest = "" if system else _sha256(path)
    if digest is None:
        return
    if prev is None:
        OPENED[path] = [st.st_size, st.st_mtime_ns, digest]
    elif not digest or prev[2] != digest:
        CHANGED.add(path)


class _RecordingStat:
    """``os.stat``, noting the state of a path the generator looked at (absent ones too). An object,
    not a function: Python 3.10's ``pathlib`` keeps ``os.stat`` as a class attribute, where a function
    would be bound as a method."""

    def __call__(self, path, *, dir_fd=None, follow_symlinks=True):
        try:
            st = _STAT(path, dir_fd=dir_fd, follow_symlinks=follow_symlinks)
        except (OSError, ValueError):
            _stated(path, dir_fd, follow_symlinks, None)
            raise
        _stated(path, dir_fd, follow_symlinks, st)
        return st


def _stated(path, dir_fd, follow, st):
    if getattr(LOCAL, "busy", False) or STATE["done"] or dir_fd is not None or not follow or isinstance(path, int):
        return
    try:
        p = _path(path)
        if p is None or p in STATS:
            return
        if st is None:
            STATS[p] = "-"
        elif stat.S_ISDIR(st.st_mode):
            STATS[p] = "dir"
        else:
            STATS[p] = [st.st_size, st.st_mtime_ns] if stat.S_ISREG(st.st_mode) else "other"
    except Exception as exc:  # never fail the generator (see _hook)
        STATE["broken"] = f"os.stat: {exc!r}"


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
    if getattr(LOCAL, "busy", False) or STATE["done"]:  # the recorder's own reads
        return
    LOCAL.busy = True
    try:
        if event == "open":
            p = _path(args[0])
            if p is not None:
                r, w = _mode(args[1], args[2] if len(args) > 2 else 0)
                (READS.add(p) if r else None), (WRITES.add(p) if w else None)
                if r and not w and p.endswith(".pyc") and "__pycache__" in p:
                    # a cache Python may rewrite in this run (a stale one): its source, as Python checked it
                    with contextlib.suppress(ValueError):
                        _opened(importlib.util.source_from_cache(p))
                elif r and not w:
                    _opened(p)
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
    finally:
        LOCAL.busy = False


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
    """``os.environ`` (and ``os.environb``: the same variables as bytes, names and values recorded
    decoded) recording each variable looked up (absent ones too) before the generator set it."""

    def __getitem__(self, key):
        name = _name(key)
        try:
            value = super().__getitem__(key)
        except KeyError:
            if name not in WRITTEN_ENV:
                ENV.setdefault(name, None)
            raise
        if name not in WRITTEN_ENV:
            ENV.setdefault(name, _name(value))
        return value

    def __setitem__(self, key, value):
        if _name(key) not in ENV:
            WRITTEN_ENV.add(_name(key))
        super().__setitem__(key, value)

    def __delitem__(self, key):
        if _name(key) not in ENV:
            WRITTEN_ENV.add(_name(key))
        super().__delitem__(key)

    def __iter__(self):
        STATE["all_env"] = True
        return super().__iter__()


def _name(text):
    return os.fsdecode(text) if isinstance(text, bytes) else text


def _modules():
    """Every module file in ``sys.modules`` and the source of every ``.pyc`` read."""
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
    STATE["done"] = True  # what the recorder itself does from here on is no read
    record = {
        "format": 2,
        "script": script,
        "python": sys.executable,
        "version": sys.version,
        "system": SYSTEM,
        "reads": sorted(READS - WRITES),
        "modules": sorted(_modules() - WRITES),
        "opened": {p: s for p, s in OPENED.items() if p not in WRITES},
        "changed": sorted(CHANGED - WRITES),
        "stats": {p: s for p, s in STATS.items() if p not in WRITES},
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
    SYSTEM[:] = _system_dirs()
    os.environ.__class__ = _Environ
    os.environb.__class__ = _Environ
    os.stat = _RecordingStat()
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
