"""What a generator read: its depfile (issue 41), as ninja keeps a compiler's.

Every generator run, its ``--list_blobs`` listing and its generation alike, runs under qola's
recorder (:data:`RUNNER`, ``templates/genwrap/record_reads.py``: ``python RUNNER RECORD script
args…``). The recorder installs an audit hook (:func:`sys.addaudithook`) and a recording
``os.environ`` in the generator's own interpreter, runs the script as ``python script args`` would,
and writes, when it ends, the files it opened for reading, the module files it imported (through
``sys.path.insert`` from anywhere: AITER's ``mha_fwd_generate.py`` imports ``chip_info`` from
``aiter/jit/utils/``), each file's size, mtime and sha256 as it was when the generator opened it (a
file saved while the generator runs is kept as the generator read it, so the next run sees the
change; a file another open found with other content makes the run unusable), the paths it only
looked at (``os.stat``, ``os.path.exists``: an optional input it skipped counts when it appears), the
directories it listed, the variables it looked up (``os.environ`` and ``os.environb``), and whether it
started another program.

:func:`collect` turns that record into :class:`Deps`: each file with its real path (a link's
target is part of the key), size, mtime and content hash as opened (files of the interpreter's own
``stdlib``/``site-packages`` by size and mtime alone), each listed directory's names, each
variable's value as a hash (absent ones too; :func:`value_hash`: no value is kept in clear), the interpreter, and each toolchain probe it ran (``hipconfig
--version``: AITER's ``cpp_extension`` runs it at import) as its argv and the file that ran. :func:`unchanged` tells whether they still
hold (a size and mtime that match spare the hash). A listing (:mod:`qola.plan.listcache`) and a
generation (:mod:`qola.compile.codegen`) are reused only while their :class:`Deps` hold; a run that
started a program (what it read is unknown), that could not be recorded, or that read a file qola
cannot hash (a FIFO, a file past :data:`MAX_INPUT`) has none: it reruns every time. Files the run
wrote, files under its own temp dirs, ``/proc``, ``/sys`` and ``/dev`` are no inputs.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import stat
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from qola.core import argfile, inputs
from qola.core.errors import QolaError
from qola.core.secret import fingerprint
from qola.plan.registry import genwrap_script

FORMAT = 4  # 4: bytecode caches no input; 3: files as opened, paths only looked at (2: hashed when the run ended)
RECORD_FORMAT = 2  # what the recorder writes (templates/genwrap/record_reads.py); 2: "opened", "changed", "stats"
MAX_INPUT = 256 << 20  # one file a generator read (CK's and AITER's largest inputs: a few MiB of CSV)
PSEUDO = ("/proc/", "/sys/", "/dev/")  # read, never inputs (their content changes by itself)
# Python's bytecode cache: written beside a module by whichever interpreter imports it with bytecode on
# (a generator run, the ROCm 7 chroot's, a user's), derived from the module's source, which is recorded;
# it is never an input, nor its directory one of a listed directory's names (its appearance would make
# every listing and generation before it stale)
BYTECODE = "__pycache__"
# the caller's bookkeeping, never a generator's input, even one that reads the whole environment: the
# shell's (``_``, ``OLDPWD``, ``SHLVL``) and pytest's (``PYTEST_CURRENT_TEST``: another in every test)
VOLATILE = frozenset({"_", "OLDPWD", "SHLVL", "PYTEST_CURRENT_TEST"})

# (path, real path, size, mtime_ns, sha256 | "" for a system file | "-" for an absent one)
File = tuple[str, str, int, int, str]


def runner() -> str:
    """The recorder script a generator runs under."""
    return str(genwrap_script("record_reads.py"))


ARGV_FILE = "--qola-argv-file="  # the recorder's: the generator's argv (a JSON list) is in this file


TREE = "\0tree"  # the tree's root in a record that holds it by place: no path or variable's value holds a NUL


@dataclass(frozen=True)
class Place:
    """Where the tree a generator belongs to lies, for a record that holds it by place (:data:`TREE`):
    a listing is the tree's, wherever the tree lies (a copy elsewhere, a CI job's new workspace).
    ``root`` as the plan names it, ``real`` its real path (a file's real path is hidden by the second)."""

    root: str
    real: str

    @classmethod
    def of(cls, root: str | os.PathLike[str] | None) -> Place | None:
        if root is None:
            return None
        full = os.path.abspath(os.fspath(root))
        return cls(full.rstrip("/") or "/", os.path.realpath(full))

    def hide(self, path: str, *, real: bool = False) -> str:
        """``path`` with the root as :data:`TREE` (a path outside the tree as it is)."""
        root = self.real if real else self.root
        return TREE + path[len(root) :] if path == root or path.startswith(root + "/") else path

    def show(self, path: str, *, real: bool = False) -> str:
        """The path :meth:`hide` gave, under this place's root."""
        root = self.real if real else self.root
        return root + path[len(TREE) :] if path == TREE or path.startswith(TREE + "/") else path

    def value(self, value: str) -> str:
        """A variable's value or an argument with the root, wherever it is a path's start, as :data:`TREE`."""
        return re.sub(rf"(?<![^\s=:;,]){re.escape(self.root)}(?=[/\s;:,]|$)", TREE, value)


def argv(python: str, record: str, rest: Sequence[str]) -> list[str]:
    """The command running ``python rest…`` under the recorder, which writes ``record``. ``rest`` past
    :data:`qola.core.argfile.THRESHOLD` (a filter naming thousands of kernels) goes by file, beside
    ``record`` (:func:`qola.core.argfile.passed`): the recorder reads it back before the generator runs."""
    return [python, runner(), record, *argfile.passed(rest, record + ".argv.json", ARGV_FILE)]


@dataclass(frozen=True)
class Deps:
    """What one or several generator runs read, as a key (see the module)."""

    files: tuple[File, ...]
    dirs: tuple[tuple[str, str], ...]  # (directory, sha256 of its sorted names)
    env: tuple[tuple[str, str | None], ...]  # (variable, value_hash of its value; None: looked up, absent)
    python: tuple[tuple[str, str], ...]  # (interpreter's real path, its identity)
    whole_env: str | None = None  # sha256 of the whole environment, when a run iterated it
    programs: tuple[tuple[str, str], ...] = ()  # (a toolchain probe's argv, the file it ran: among files)

    def to_json(self) -> dict[str, object]:
        return {
            "format": FORMAT,
            "files": [list(f) for f in self.files],
            "dirs": [list(d) for d in self.dirs],
            "env": [list(e) for e in self.env],
            "python": [list(p) for p in self.python],
            "whole_env": self.whole_env,
            "programs": [list(p) for p in self.programs],
        }

    @classmethod
    def from_json(cls, doc: object) -> Deps | None:
        """The deps ``doc`` holds, None when it is not a record of this format (a miss)."""
        try:
            assert isinstance(doc, dict) and doc.get("format") == FORMAT
            files = tuple(_file(f) for f in doc["files"])
            dirs = tuple((str(d), str(h)) for d, h in doc["dirs"])
            env = tuple((str(k), v if v is None else str(v)) for k, v in doc["env"])
            python = tuple((str(p), str(i)) for p, i in doc["python"])
            whole = doc.get("whole_env")
            programs = tuple((str(a), str(p)) for a, p in doc.get("programs", ()))
            return cls(files, dirs, env, python, whole if isinstance(whole, str) else None, programs)
        except (AssertionError, KeyError, TypeError, ValueError):
            return None

    def hidden(self, place: Place) -> Deps:
        """These deps with ``place``'s root as :data:`TREE` (to be recorded by place)."""
        return self._mapped(place.hide)

    def shown(self, place: Place) -> Deps:
        """Deps :meth:`hidden` gave, under ``place``'s root."""
        return self._mapped(place.show)

    def _mapped(self, how: Callable[..., str]) -> Deps:
        return replace(
            self,
            files=tuple((how(f[0]), how(f[1], real=True), f[2], f[3], f[4]) for f in self.files),
            dirs=tuple((how(d), h) for d, h in self.dirs),
            programs=tuple((a, how(p)) for a, p in self.programs),
        )

    def paths(self) -> list[str]:
        """Every file and directory these deps name (links and their targets)."""
        return sorted({p for f in self.files for p in f[:2] if p} | {d for d, _ in self.dirs})


def _file(f: object) -> File:
    assert isinstance(f, list) and len(f) == 5
    return (str(f[0]), str(f[1]), int(f[2]), int(f[3]), str(f[4]))


def merge(parts: Iterable[Deps | None]) -> Deps | None:
    """One key over several runs (a module's generators, in order); None when any has none."""
    got = list(parts)
    if not got or any(p is None for p in got):
        return None
    ds = [p for p in got if p is not None]
    wholes = {d.whole_env for d in ds if d.whole_env}
    return Deps(
        tuple(sorted({f for d in ds for f in d.files})),
        tuple(sorted({x for d in ds for x in d.dirs})),
        tuple(sorted({e for d in ds for e in d.env}, key=lambda e: (e[0], e[1] or ""))),
        tuple(sorted({p for d in ds for p in d.python})),
        next(iter(wholes)) if len(wholes) == 1 else (None if not wholes else "mixed"),
        tuple(sorted({x for d in ds for x in d.programs})),
    )


def absent(path: str) -> Deps:
    """The deps of a run that did not happen because ``path`` (its script) is absent."""
    full = os.path.abspath(path)
    return Deps(((full, os.path.realpath(full), -1, -1, "-"),), (), (), ())


def value_hash(value: str | None) -> str | None:
    """How a variable's value is kept (None: unset): :func:`qola.core.secret.fingerprint`, a hash
    with a URL's credentials masked first, so no record holds a secret."""
    return None if value is None else fingerprint(value)


def read_under(record: str, directory: str) -> bool:
    """Whether the run that wrote ``record`` read a file in ``directory`` or listed it (what an
    earlier generator wrote there); True when the record cannot be read."""
    try:
        doc = json.loads(inputs.read_record(record, what="generator's read record"))
        names = [str(p) for k in ("reads", "dirs") for p in doc[k]]
        looked = [str(p) for p in doc.get("stats", ())]
    except (OSError, QolaError, KeyError, TypeError, ValueError):
        return True
    dirs = [directory, os.path.realpath(directory)]
    # a path looked at inside it counts; the directory itself (``mkdir(exist_ok=True)``) does not
    return any(_under(p, dirs) for p in names) or any(_under(p, dirs) and p not in dirs for p in looked)


def _under(path: str, dirs: Sequence[str]) -> bool:
    return path.startswith(PSEUDO) or any(path == d or path.startswith(d.rstrip("/") + "/") for d in dirs)


def _no_input(path: str, exclude: Sequence[str]) -> bool:
    """``path`` is none of a run's inputs: under ``exclude`` (its temp dirs), a pseudo file, bytecode."""
    return _under(path, exclude) or f"/{BYTECODE}/" in path or path.endswith(f"/{BYTECODE}")


def collect(record: str, *, env: Mapping[str, str], exclude: Sequence[str], place: Place | None = None) -> Deps | None:
    """The deps of the run that wrote ``record`` under ``env`` (files under ``exclude``: its temp
    dirs, not inputs); None when it cannot be reused (see the module). With ``place``, variables are
    kept with the tree's root hidden (:meth:`Place.value`), as :func:`unchanged` then reads them."""
    held = _held(place)
    try:
        doc = json.loads(inputs.read_record(record, what="generator's read record"))
        assert isinstance(doc, dict) and doc.get("format") == RECORD_FORMAT
        if doc.get("spawned") or doc.get("broken") or doc.get("exit") != 0:
            return None
        ex = [os.path.realpath(d) for d in exclude] + list(exclude)
        if any(not _no_input(str(p), ex) for p in doc["changed"]):  # another content at another open
            return None
        system = [str(s) for s in doc["system"]]
        names = {str(p) for p in (*doc["reads"], *doc["modules"])}
        opened = {str(p): _opened(p, s) for p, s in dict(doc["opened"]).items()}
        files = [opened.get(p) or _state(p, system) for p in sorted(names) if not _no_input(p, ex)]
        files += [
            _looked(str(p), s) for p, s in dict(doc["stats"]).items() if str(p) not in names and not _no_input(p, ex)
        ]
        dirs = [(d, _names(d)) for d in sorted({str(d) for d in doc["dirs"]}) if not _no_input(d, ex)]
        looked = {str(k): value_hash(v if v is None else held(str(v))) for k, v in dict(doc["env"]).items()}
        python = str(doc["python"])
        programs = [
            (shlex.join([str(prog), *map(str, argv)]), _which(str(prog), env)) for prog, argv in doc.get("programs", [])
        ]
        files += [_state(p, ()) if p else None for _, p in programs]
    except (OSError, QolaError, AssertionError, KeyError, TypeError, ValueError):
        return None
    if any(f is None for f in files) or any(h is None for _, h in dirs):
        return None
    # what the interpreter itself read
    looked |= {k: value_hash(held(v)) for k, v in env.items() if k.startswith("PYTHON")}
    real = os.path.realpath(python)
    return Deps(
        tuple(f for f in files if f is not None),
        tuple((d, h) for d, h in dirs if h is not None),
        tuple(sorted(looked.items(), key=lambda e: (e[0], e[1] or ""))),
        ((real, _identity(real, str(doc.get("version", "")))),),
        _whole(env) if doc.get("all_env") else None,
        tuple(sorted((a, p) for a, p in programs if p)),
    )


def _opened(path: object, state: object) -> File:
    """``path`` as the generator opened it (the recorder's [size, mtime_ns, sha256 | "" for a system file])."""
    assert isinstance(path, str) and isinstance(state, list) and len(state) == 3
    return (path, os.path.realpath(path), int(state[0]), int(state[1]), str(state[2]))


def _looked(path: str, state: object) -> File:
    """A path the generator only looked at (``os.stat``, ``os.path.exists``): what it found, as a key
    ("-": absent, "dir", "other": neither a file nor a directory, "stat": a file by size and mtime)."""
    if isinstance(state, list) and len(state) == 2:
        return (path, os.path.realpath(path), int(state[0]), int(state[1]), "stat")
    assert state in ("-", "dir", "other")
    return (path, os.path.realpath(path), -1, -1, str(state))


def _which(prog: str, env: Mapping[str, str]) -> str:
    """The file ``prog`` names under ``env``'s PATH ("": none)."""
    if os.sep in prog:
        return os.path.abspath(prog) if os.path.isfile(prog) else ""
    return shutil.which(prog, path=env.get("PATH", os.defpath)) or ""


def interpreter(python: str) -> list[str | int | None]:
    """The identity of the interpreter ``python`` names: its real path, size and mtime (``[python,
    None]`` when it cannot be read); a generator run's key holds it."""
    real = os.path.realpath(python)
    try:
        st = os.stat(real)
    except OSError:
        return [python, None]
    return [real, st.st_size, st.st_mtime_ns]


def _identity(real: str, version: str) -> str:
    try:
        st = os.stat(real)
    except OSError:
        return "absent"
    return f"{st.st_size}:{st.st_mtime_ns}:{version}"


def _whole(env: Mapping[str, str]) -> str:
    return hashlib.sha256(json.dumps(sorted((k, v) for k, v in env.items() if k not in VOLATILE)).encode()).hexdigest()


def _names(directory: str) -> str | None:
    """sha256 of ``directory``'s sorted names ("-": absent); None when it cannot be listed."""
    try:
        listed = sorted(n for n in os.listdir(directory) if n != BYTECODE)
    except FileNotFoundError:
        return "-"
    except OSError:
        return None
    return hashlib.sha256("\0".join(listed).encode("utf-8", "surrogateescape")).hexdigest()


def _state(path: str, system: Sequence[str]) -> File | None:
    """``path`` as a key (absent: "-"); None when it cannot be one (not a regular file, too large)."""
    real = os.path.realpath(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:  # looked for, not there (an optional input): its appearance counts
        return (path, real, -1, -1, "-")
    except OSError:
        return None
    if stat.S_ISDIR(st.st_mode):
        return (path, real, -1, -1, "dir")
    if not stat.S_ISREG(st.st_mode):
        return None
    if _under(real, system):  # the interpreter's own libraries: by size and mtime (a pip upgrade changes them)
        return (path, real, st.st_size, st.st_mtime_ns, "")
    try:
        digest, _ = inputs.sha256_checked(path, limit=MAX_INPUT, what="generator input")
    except (OSError, QolaError):
        return None
    return (path, real, st.st_size, st.st_mtime_ns, digest)


def _held(place: Place | None) -> Callable[[str], str]:
    """How a variable's value is kept before it is hashed: with the tree's root hidden, by place."""
    return place.value if place is not None else str


def unchanged(deps: Deps, env: Mapping[str, str], place: Place | None = None) -> bool:
    """Whether everything ``deps`` names is still as it was, under ``env`` (``place``: the one
    :func:`collect` was given)."""
    held = _held(place)
    if any(value_hash(None if (got := env.get(k)) is None else held(got)) != v for k, v in deps.env):
        return False
    pythons = {k: v for k, v in deps.env if k.startswith("PYTHON") and v is not None}
    if {k: value_hash(held(v)) for k, v in env.items() if k.startswith("PYTHON")} != pythons:
        return False
    if deps.whole_env is not None and deps.whole_env != _whole(env):
        return False
    if any(_identity(real, ident.split(":", 2)[-1]) != ident for real, ident in deps.python):
        return False
    if any(_names(d) != h for d, h in deps.dirs):
        return False
    if any(_which(shlex.split(argv)[0], env) != path for argv, path in deps.programs):
        return False
    return all(_holds(f) for f in deps.files)


def _holds(f: File) -> bool:
    path, real, size, mtime, digest = f
    if os.path.realpath(path) != real:
        return False
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return digest == "-"
    except OSError:
        return False
    if digest in ("-", "dir", "other"):
        kind = "dir" if stat.S_ISDIR(st.st_mode) else "file" if stat.S_ISREG(st.st_mode) else "other"
        return digest == kind
    if not stat.S_ISREG(st.st_mode) or st.st_size != size:
        return False
    if st.st_mtime_ns == mtime:
        return True
    if digest in ("", "stat"):  # a system file, a file only looked at: by size and mtime alone
        return False
    try:
        return inputs.sha256_checked(path, limit=MAX_INPUT, what="generator input")[0] == digest
    except (OSError, QolaError):
        return False
