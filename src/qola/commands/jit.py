"""``qola jit``: prebuild, list, verify and clean the on-demand JIT cache.

The cache dir is the runtime's (QOLA_JIT_CACHE_DIR, else $XDG_CACHE_HOME/qola/jit, else
~/.cache/qola/jit) and gets the same checks: owned by you, not writable by others.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from qola.errors import QolaError
from qola.jit import prebuild as pb
from qola.jit.cache import JitCache, default_cache_dir

EXIT_BROKEN = 1


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "jit",
        help="manage the on-demand JIT cache (prebuild, ls, verify, clean)",
        description="Deferred kernel instances are compiled on first use into the JIT cache. "
        "These commands fill it ahead of time, list it, check it and clean it.",
    )
    p.add_argument("--cache-dir", type=Path, metavar="DIR",
                   help="cache dir (default: QOLA_JIT_CACHE_DIR, else $XDG_CACHE_HOME/qola/jit or ~/.cache/qola/jit)")
    sub = p.add_subparsers(dest="jit_command", metavar="ACTION", required=True)

    b = sub.add_parser("prebuild", help="compile deferred units of a build output into the cache",
                       description="Compile the deferred units of OUT (same keys, format and locking as the "
                       "runtime) into the cache, or into a prebuilt dir to ship.")
    b.add_argument("out", type=Path, metavar="OUT", help="build output dir (or OUT/jit, or OUT/jit/<module>)")
    b.add_argument("--filter", metavar="PATTERN", help="fnmatch pattern on unit names (default: all)")
    b.add_argument("-j", "--jobs", type=int, default=max(1, (os.cpu_count() or 2) // 2), metavar="N")
    b.add_argument("--prebuilt-dir", type=Path, metavar="D",
                   help="write here (for QOLA_JIT_PREBUILT_DIR or OUT/jit/prebuilt) instead of the cache")
    b.set_defaults(func=run_prebuild)

    ls = sub.add_parser("ls", help="list cache entries, or the units of OUT and whether they are ready")
    ls.add_argument("out", type=Path, nargs="?", metavar="OUT")
    ls.set_defaults(func=run_ls)

    v = sub.add_parser("verify", help="re-hash every cache entry; exit 1 if any is broken")
    v.add_argument("--fix", action="store_true", help="remove broken entries and stale temp files")
    v.set_defaults(func=run_verify)

    c = sub.add_parser("clean", help="remove broken entries, temp files and logs (--all: everything)")
    c.add_argument("--all", action="store_true", help="also remove valid entries and unpacked headers")
    c.set_defaults(func=run_clean)


def _env() -> dict[str, str]:
    return dict(os.environ)  # read once here; passed down, never mutated


def _cache(args: argparse.Namespace, *, create: bool = True) -> JitCache:
    path = args.cache_dir or default_cache_dir(_env())
    if not create and not path.exists():
        hint = "nothing was compiled yet, or set QOLA_JIT_CACHE_DIR"
        raise QolaError(f"JIT cache dir {path} does not exist", hint=hint)
    return JitCache(path, create=create)


def run_prebuild(args: argparse.Namespace) -> int:
    env = _env()
    if args.jobs < 1:
        raise QolaError(f"-j must be at least 1, got {args.jobs}")
    cache = JitCache(args.prebuilt_dir) if args.prebuilt_dir else _cache(args)
    units = pb.select_units(pb.find_jit_dirs(args.out), env, args.filter)
    if not units:
        raise QolaError(f"no JIT unit matches {args.filter!r}", hint="`qola jit ls OUT` lists them")

    def progress(status: str, msg: str) -> None:
        print(f"{status:8} {msg}", file=sys.stderr if status == "failed" else sys.stdout)

    res = pb.prebuild(units, cache, env, args.jobs, progress)
    print(f"{len(res.built)} built, {len(res.present)} already present, {len(res.failed)} failed -> {cache.path}")
    return EXIT_BROKEN if res.failed else 0


def run_ls(args: argparse.Namespace) -> int:
    env = _env()
    if args.out is None:
        cache = _cache(args, create=False)
        n = 0
        for e in cache.entries():
            n += 1
            status = "ok" if e.problem is None else f"BROKEN: {e.problem}"
            print(f"{e.key[:16]}  {e.size:>10}  {e.fields.get('module', '?')}/{e.fields.get('unit', '?')}  {status}")
        print(f"{n} entries in {cache.path}")
        return 0
    cache_path = args.cache_dir or default_cache_dir(env)
    caches = [JitCache(cache_path, create=False)] if cache_path.exists() else []
    prebuilt = [Path(p) for p in env.get("QOLA_JIT_PREBUILT_DIR", "").split(":") if p]
    dirs = pb.find_jit_dirs(args.out)
    prebuilt += [d for d in {jd.parent / "prebuilt" for jd in dirs} if d.is_dir()]
    caches += [JitCache(p, create=False, check=False) for p in prebuilt if p.is_dir()]
    ready = 0
    units = pb.select_units(dirs, env)
    for u in units:
        where = next((str(c.path) for c in caches if c.entry(u.key).problem is None), None)
        ready += where is not None
        print(f"{u.module}/{u.unit['name']}  {u.key[:16]}  {'ready in ' + where if where else 'not compiled'}")
    print(f"{ready} of {len(units)} units ready")
    return 0


def run_verify(args: argparse.Namespace) -> int:
    cache = _cache(args, create=False)
    broken = [e for e in cache.entries() if e.problem is not None]
    total = len(cache.keys())
    for e in broken:
        print(f"BROKEN {e.key}: {e.problem}")
        if args.fix:
            with cache.lock(e.key, blocking=False) as got:
                if got:
                    cache.remove(e.key)
                    print(f"  removed {e.key}")
                else:
                    print(f"  skipped {e.key}: being compiled right now")
    if args.fix:
        for p in cache.temp_files():
            with cache.lock(p.name[5:69], blocking=False) as got:
                if got:
                    p.unlink(missing_ok=True) if not p.is_dir() else None
    print(f"{total - len(broken)} of {total} entries ok in {cache.path}")
    if broken and not args.fix:
        print("hint: `qola jit verify --fix` removes the broken entries (rebuilt on next use)", file=sys.stderr)
        return EXIT_BROKEN
    return 0


def run_clean(args: argparse.Namespace) -> int:
    cache = _cache(args, create=False)
    removed = cache.clean(everything=args.all)
    print(f"removed {len(removed)} files from {cache.path}")
    return 0
