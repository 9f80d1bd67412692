"""One compile through qola's local compile cache: the compiler launcher of a local build.

ninja runs ``<build>/cache/cc <compiler> <args…>`` (a script :mod:`qola.store.ccache` writes) for
every compile; this module, run as ``python -m qola.compile.cache_launch CONFIG -- <compiler> <args…>``,
serves the object from the cache or compiles it and stores it. The anchor is Bazel's disk cache: an
action cache keyed by what decides the object's bytes, and a content-addressed store of objects.

* **The action's key** (:func:`action_key`): the compiler's identity (its file's digest and its
  ``--version``, computed once per build), the command line with the kernel tree's, the build
  dir's and qola's own package dir's roots replaced by names (``@T@``, ``@B@``, ``@Q@``:
  :class:`Roots`; qola's runtime headers are on HIP lines) and the compilers' environment. Where the
  tree, the build dir and qola lie does not enter it: the objects do not depend on it (prefix maps
  and stable unit names: :mod:`qola.compile.pathmap`); what qola's files hold does (the inputs).
* **The inputs**: an action has candidates, each the files a compile read (its depfile: the source
  and every header), named by root and with their sha256. A candidate is a hit when every file it
  names has that digest now, so an edited header misses and nothing stale can hit.
* **The object**: stored by its sha256 and checked against it on every read; a damaged one is
  removed and the unit compiled again. An object that names the build dir or the tree by path
  (``__FILE__`` in a generated source) would differ elsewhere: it is not stored.

Every entry is written by temp file + rename (concurrent builds write the same bytes); every file
read is a regular file of ours (:func:`qola.core.inputs.open_checked`, no link followed). The cache
steps aside (the compiler runs as if there were no cache) where it cannot be exact: a compile line
without ``-c``/``-o``/depfile, roots whose names a depfile would escape, and a compiler that left an
empty object — a wrapper's stub (ck-jit's interceptor records the compiles it defers): that compiler
is marked and never served from the cache, so such a wrapper sees every compile.

What each compile did goes to the build's tally (``hit``/``miss``/``aside``), which the progress
line and the build's notes read (:mod:`qola.compile.executor`). Standard library and :mod:`qola.core`
only: it runs once per compile.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qola.compile import tally
from qola.core import inputs, proc
from qola.core.errors import QolaError
from qola.core.fsutil import atomic_write
from qola.toolchain.portable import depfile_named, option, split_depfile

FORMAT = "v1"
ACTIONS, OBJECTS, WRAPPERS = "a", "o", "w"  # under <cache>/v1/
MAX_OBJECT = 2 << 30
MAX_ENTRY = 16 << 20  # one candidate (its inputs' names and digests, the depfile)
CANDIDATES = 8  # per action: the newest are tried first
TREE, BUILD, QOLA = "@T@", "@B@", "@Q@"
_ESCAPED = frozenset(" \\#$:\n\t")  # a root spelled with one of these is escaped in a depfile


@dataclass(frozen=True)
class Roots:
    """The tree's, the build dir's and qola's package dir's spellings (as given and resolved) and their
    names."""

    pairs: tuple[tuple[str, str], ...]

    @classmethod
    def of(cls, cfg: Mapping[str, Any]) -> Roots:
        named = ((TREE, cfg["tree"]), (BUILD, cfg["build"]), (QOLA, cfg.get("qola", ())))
        pairs = [(p.rstrip("/") or "/", name) for name, spellings in named for p in spellings]
        return cls(tuple(sorted(pairs, key=lambda p: -len(p[0]))))

    def plain(self) -> bool:
        return not any(set(p) & _ESCAPED for p, _ in self.pairs)

    def name(self, text: str) -> str:
        for old, new in self.pairs:
            text = text.replace(old, new)
        return text

    def real(self, named: str) -> str:
        """A named path back on this build's roots (the first spelling of each)."""
        first = {}
        for old, new in reversed(self.pairs):
            first[new] = old
        for new, old in first.items():
            named = named.replace(new, old)
        return named

    def spelled_in(self, data: bytes) -> bool:
        return any(old.encode() in data for old, _ in self.pairs if old != "/")


def action_key(cfg: Mapping[str, Any], roots: Roots, argv: Sequence[str], cwd: str, env: Mapping[str, str]) -> str:
    """The action's key (the module's docstring)."""
    spec = {
        "format": FORMAT,
        "compiler": cfg["compiler_id"],
        "argv": [roots.name(a) for a in argv],
        "cwd": roots.name(cwd),
        "env": {k: env[k] for k in cfg["env"] if k in env},
    }
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()


def _sha256(path: str, memo: dict[str, str | None]) -> str | None:
    if path not in memo:
        try:
            memo[path] = inputs.sha256_checked(path, limit=MAX_OBJECT, what="input")[0]
        except (OSError, QolaError):
            memo[path] = None
    return memo[path]


class Cache:
    """One cache dir (``<dir>/v1``): its subdirs made or checked as they are reached."""

    def __init__(self, root: str) -> None:
        self.top = Path(root) / FORMAT

    def _dir(self, *parts: str) -> Path:
        path = self.top.joinpath(*parts)
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        return path

    def _read(self, path: Path, limit: int) -> bytes | None:
        try:
            return inputs.read_checked(path, limit=limit, what="compile cache entry", follow=False, trusted=True)
        except (OSError, QolaError):
            return None

    def wrapper(self, compiler_id: str) -> bool:
        """Whether this compiler left a stub before (a wrapper that records compiles)."""
        return (self.top / WRAPPERS / compiler_id).exists()

    def mark_wrapper(self, compiler_id: str) -> None:
        atomic_write(self._dir(WRAPPERS) / compiler_id, b"left an empty object: a wrapper's stub\n")

    def _action(self, key: str) -> Path:
        return self.top / ACTIONS / key[:2] / key

    def _object(self, digest: str) -> Path:
        return self.top / OBJECTS / digest[:2] / digest

    def lookup(self, key: str, roots: Roots) -> tuple[bytes, str] | str | None:
        """(the object, its depfile's text on this build's roots) of a candidate whose inputs all
        hold, ``"corrupt"`` when its object failed its digest (removed), or None."""
        try:
            names = sorted(os.scandir(self._action(key)), key=lambda e: e.stat(follow_symlinks=False).st_mtime_ns)
        except OSError:
            return None
        memo: dict[str, str | None] = {}
        for entry in reversed(names):
            data = self._read(Path(entry.path), MAX_ENTRY)
            try:
                cand = json.loads(data) if data is not None else None
            except ValueError:
                cand = None
            if not isinstance(cand, dict):
                continue
            if not all(_sha256(roots.real(p), memo) == d for p, d in cand.get("inputs", ())):
                continue
            obj_path = self._object(str(cand["object"]))
            obj = self._read(obj_path, MAX_OBJECT)
            if obj is None or hashlib.sha256(obj).hexdigest() != cand["object"]:
                for p in (obj_path, Path(entry.path)):
                    p.unlink(missing_ok=True)
                return "corrupt"
            os.utime(obj_path)  # the newest use: what a trim keeps longest
            return obj, roots.real(str(cand["depfile"]))
        return None

    def store(self, key: str, obj: bytes, depfile: str, files: list[tuple[str, str]], roots: Roots) -> None:
        digest = hashlib.sha256(obj).hexdigest()
        target = self._object(digest)
        if not target.is_file() or target.stat().st_size != len(obj):
            self._dir(OBJECTS, digest[:2])
            atomic_write(target, obj)
        cand = {"inputs": files, "object": digest, "depfile": roots.name(depfile)}
        text = json.dumps(cand, sort_keys=True).encode()
        where = self._dir(ACTIONS, key[:2], key)
        atomic_write(where / hashlib.sha256(text).hexdigest()[:32], text)
        olds = sorted(os.scandir(where), key=lambda e: e.stat(follow_symlinks=False).st_mtime_ns)
        for e in olds[:-CANDIDATES]:
            Path(e.path).unlink(missing_ok=True)


def record(cfg: Mapping[str, Any], what: str, obj: str, why: str = "") -> None:
    tally.record(cfg["work"], what, obj, why)


def _compile(argv: Sequence[str]) -> int:
    """The compile itself, its output where the launcher's goes (ninja's pipe), in the launcher's
    process group (ended with ninja's, as a compile without the cache is) and with it."""
    streams = proc.Streams(stdin=proc.DEVNULL, stdout=None, stderr=None)
    with proc.started(argv, streams=streams, own_group=False) as child:
        return child.wait()


def _inputs(depfile: str, cwd: str, roots: Roots) -> list[tuple[str, str]] | None:
    """Every file the compile read (named by root) with its sha256; None where one cannot be read."""
    memo: dict[str, str | None] = {}
    files = []
    for p in dict.fromkeys(split_depfile(depfile)):
        path = os.path.normpath(os.path.join(cwd, p))
        digest = _sha256(path, memo)
        if digest is None:
            return None
        files.append((roots.name(path), digest))
    return files


def launch(cfg: Mapping[str, Any], argv: Sequence[str], cwd: str, env: Mapping[str, str]) -> int:
    """Serve or compile ``argv`` (the module's docstring); its exit status."""
    obj, dep = option(argv, "-o"), depfile_named(argv)
    roots = Roots.of(cfg)
    cache = Cache(cfg["dir"])
    if obj is None or dep is None or "-c" not in argv or not roots.plain():
        record(cfg, "aside", obj or "?", "not a compile the cache can key")
        return _compile(argv)
    if cache.wrapper(cfg["compiler_id"]):
        record(cfg, "aside", obj, "the compiler is a wrapper that left stubs")
        return _compile(argv)
    key = action_key(cfg, roots, argv, cwd, env)
    found = cache.lookup(key, roots)
    if isinstance(found, tuple):
        atomic_write(os.path.join(cwd, obj), found[0])
        atomic_write(os.path.join(cwd, dep), found[1].encode())
        record(cfg, "hit", obj)
        return 0
    code = _compile(argv)
    if code != 0:
        return code
    data = inputs.read_checked(Path(cwd, obj), limit=MAX_OBJECT, what="object", follow=False)
    if not data:
        cache.mark_wrapper(cfg["compiler_id"])
        record(cfg, "aside", obj, "an empty object: the compiler is a wrapper (stub)")
        return 0
    text = inputs.read_checked(Path(cwd, dep), limit=MAX_ENTRY, what="depfile", follow=False).decode(
        "utf-8", "surrogateescape"
    )
    files = _inputs(text, cwd, roots)
    if files is None or roots.spelled_in(data):
        record(cfg, "miss", obj, "not stored: " + ("an input is unreadable" if files is None else "names its dirs"))
        return 0
    cache.store(key, data, text, files, roots)
    record(cfg, "miss" if found is None else "corrupt", obj)
    return 0


def main(argv: Sequence[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m qola.compile.cache_launch CONFIG -- COMPILER ARGS...", file=sys.stderr)
        return 2
    try:
        cfg = json.loads(inputs.read_checked(argv[0], limit=MAX_ENTRY, what="the compile cache's config"))
    except (OSError, QolaError, ValueError) as exc:
        print(f"qola compile cache: {argv[0]}: {exc}", file=sys.stderr)
        return 2
    try:
        return launch(cfg, argv[2:], os.getcwd(), os.environ)
    except OSError as exc:  # the cache's disk (full, gone): the compile itself is what counts
        print(
            f"qola compile cache: {exc.filename or cfg['dir']}: {exc.strerror}; compiling without it", file=sys.stderr
        )
        return _compile(argv[2:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
