"""``qola jit``: prebuild, list, verify and clean the on-demand JIT cache.

The cache dir is the runtime's (QOLA_JIT_CACHE_DIR, else $XDG_CACHE_HOME/qola/jit, else
~/.cache/qola/jit) and gets the same checks: owned by you, not writable by others, and every
subdir and file in it a real directory / regular file owned by you or root. What OUT/jit says
is checked against the table its library recorded (qola.jit.libtable).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from qola.commands.common import add_flag
from qola.core import settings
from qola.core.errors import QolaError
from qola.core.fsutil import remove
from qola.jit import format as fmt
from qola.jit import headers as hdr
from qola.jit import libtable, safeio
from qola.jit import prebuild as pb
from qola.jit.cache import JitCache
from qola.jit.format import default_cache_dir
from qola.pipeline.views import only

EXIT_BROKEN = 1


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "jit",
        help="manage the on-demand JIT cache (prebuild, ls, verify, clean)",
        description="Deferred kernel instances are compiled on first use into the JIT cache. "
        "These commands fill it ahead of time, list it, check it and clean it.",
    )
    p.add_argument(
        "--cache-dir",
        type=Path,
        metavar="DIR",
        help="cache dir (default: QOLA_JIT_CACHE_DIR, else $XDG_CACHE_HOME/qola/jit or ~/.cache/qola/jit)",
    )
    sub = p.add_subparsers(dest="jit_command", metavar="ACTION", required=True)

    _prebuild_parser(sub)

    ls = sub.add_parser("ls", help="list cache entries, or the units of OUT and whether they are ready")
    ls.add_argument("out", type=Path, nargs="?", metavar="OUT")
    ls.add_argument("--library", type=Path, action="append", default=[], metavar="LIB", help="as for prebuild")
    ls.set_defaults(func=run_ls)

    v = sub.add_parser(
        "verify",
        help="re-hash every cache entry, report stale temp files; exit 1 if any is broken",
        description="Check every cache entry (file types, owner, mode, size, sha256, the record "
        "of its sources), the unpacked headers and leftover temp files. With OUT (or --library), "
        "entries of its units must have been built from the sources its library recorded.",
    )
    v.add_argument("out", type=Path, nargs="?", metavar="OUT", help="also check against this build output")
    v.add_argument("--library", type=Path, action="append", default=[], metavar="LIB", help="as for prebuild")
    v.add_argument("--fix", action="store_true", help="remove broken entries and stale temp files")
    v.set_defaults(func=run_verify)

    c = sub.add_parser("clean", help="remove broken entries, temp files and logs (--all: everything)")
    c.add_argument("--all", action="store_true", help="also remove valid entries and unpacked headers")
    c.set_defaults(func=run_clean)


def _prebuild_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    b = sub.add_parser(
        "prebuild",
        help="compile deferred units of a build output into the cache",
        description="Compile the deferred units of OUT (same keys, format and locking as the "
        "runtime) into the cache, or into a prebuilt dir to ship.",
    )
    b.add_argument("out", type=Path, metavar="OUT", help="build output dir (or OUT/jit, or OUT/jit/<module>)")
    b.add_argument("--filter", metavar="PATTERN", help="fnmatch pattern on unit names (default: all)")
    add_flag(
        b,
        settings.JOBS,
        metavar="N",
        help="parallel compiles (-j > MAX_JOBS > half the CPUs)",
    )
    b.add_argument(
        "--prebuilt-dir",
        type=Path,
        metavar="D",
        help="write here (for QOLA_JIT_PREBUILT_DIR or OUT/jit/prebuilt) instead of the cache",
    )
    b.add_argument(
        "--library",
        type=Path,
        action="append",
        default=[],
        metavar="LIB",
        help="the library (.so/.a) whose recorded JIT table OUT/jit is checked against "
        "(default: the libraries in OUT/lib)",
    )
    b.set_defaults(func=run_prebuild)


def _env() -> dict[str, str]:
    return dict(os.environ)  # read once here; passed down, never mutated


def _cache(args: argparse.Namespace, *, create: bool = True) -> JitCache:
    path = args.cache_dir or default_cache_dir(_env())
    if not create and not path.exists():
        hint = "nothing was compiled yet, or set QOLA_JIT_CACHE_DIR"
        raise QolaError(f"JIT cache dir {path} does not exist", hint=hint)
    return JitCache(path, create=create)


def _tables(args: argparse.Namespace) -> list[libtable.LibModule]:
    """The tables of OUT's libraries (or of --library), each checked against its index.json."""
    if args.out is not None:
        return list(pb.module_tables(pb.find_jit_dirs(args.out), args.library).values())
    mods: list[libtable.LibModule] = []
    for lib in args.library:
        found = libtable.read_library(lib)
        if not found:
            raise QolaError(f"{lib} records no JIT table", hint="give a library built by qola with deferred units")
        mods += found
    return mods


def run_prebuild(args: argparse.Namespace) -> int:
    env = _env()
    jobs = settings.resolve(
        settings.JOBS,
        args.jobs,
        env=only(env, settings.JOBS.env),
        default=lambda: max(1, (os.cpu_count() or 2) // 2),
    ).value
    units = pb.select_units(pb.find_jit_dirs(args.out), env, args.filter, args.library)
    if not units:
        raise QolaError(f"no JIT unit matches {args.filter!r}", hint="`qola jit ls OUT` lists them")
    cache = JitCache(args.prebuilt_dir) if args.prebuilt_dir else _cache(args)

    def progress(status: str, msg: str) -> None:
        print(f"{status:8} {msg}", file=sys.stderr if status == "failed" else sys.stdout)

    res = pb.prebuild(units, cache, env, jobs, progress)
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
            print(
                f"{fmt.short(e.key)}  {e.size:>10}  {e.fields.get('module', '?')}/{e.fields.get('unit', '?')}  {status}"
            )
        print(f"{n} entries in {cache.path}")
        return 0
    units = pb.select_units(pb.find_jit_dirs(args.out), env, libraries=args.library)
    cache_path = args.cache_dir or default_cache_dir(env)
    caches = [JitCache(cache_path, create=False)] if cache_path.exists() else []
    prebuilt = [Path(p) for p in env.get(fmt.ENV_PREBUILT, "").split(":") if p]
    prebuilt += sorted({u.jit_dir.parent / fmt.PREBUILT for u in units})
    for p in prebuilt:
        if p.is_dir():
            try:
                caches.append(JitCache(p, create=False, readonly=True))
            except QolaError as exc:
                print(f"note: skipping prebuilt dir: {exc.message}", file=sys.stderr)
    ready = 0
    for u in units:
        where = None
        for c in caches:
            e = c.entry(u.key)
            if e.problem is None and pb.entry_matches(e.fields, u.table, u.unit):
                where = str(c.path)
                break
        ready += where is not None
        print(f"{u.module}/{u.unit.name}  {fmt.short(u.key)}  {'ready in ' + where if where else 'not compiled'}")
    print(f"{ready} of {len(units)} units ready")
    return 0


def _header_problems(cache: JitCache, tables: list[libtable.LibModule]) -> list[tuple[Path, str]]:
    digests = {t.headers_sha256: t.headers_digest for t in tables if t.headers_sha256}
    problems = []
    heads = cache.path / fmt.HEADERS
    for p in sorted(heads.iterdir()) if heads.is_dir() else []:
        if p.name.startswith(fmt.TEMP_PREFIX):
            continue
        try:
            digest = hdr.tree_digest(p)
        except safeio.Refused as exc:
            problems.append((p, exc.message))
            continue
        if p.name in digests and digest != digests[p.name]:
            problems.append((p, "does not hold the headers the library recorded (digest differs)"))
    return problems


def _absent(args: argparse.Namespace, what: str) -> bool:
    """A cache dir that does not exist yet (a fresh machine) is an empty cache: says so."""
    path = args.cache_dir or default_cache_dir(_env())
    if path.exists():
        return False
    print(f"JIT cache dir {path} does not exist yet (nothing compiled on demand here): {what}")
    return True


def run_verify(args: argparse.Namespace) -> int:
    tables = _tables(args)
    if _absent(args, "0 entries, nothing to verify"):
        return 0
    cache = _cache(args, create=False)
    by_content = {u.content_key: (t, u) for t in tables for u in t.units.values()}
    broken: list[tuple[str, str]] = []
    total = 0
    for e in cache.entries():
        total += 1
        problem = e.problem
        hit = by_content.get(e.fields.get("content_key", ""))
        if problem is None and hit and not pb.entry_matches(e.fields, *hit):
            problem = f"not built from the sources {hit[0].library} recorded for unit {hit[1].name}"
        if problem is not None:
            broken.append((e.key, problem))
    for key, problem in broken:
        print(f"BROKEN {key}: {problem}")
        if args.fix:
            with cache.lock(key, blocking=False) as got:
                if got:
                    cache.remove(key)
                    print(f"  removed {key}")
                else:
                    print(f"  skipped {key}: being compiled right now")
    bad_headers = _header_problems(cache, tables)
    for p, why in bad_headers:
        print(f"BROKEN {p}: {why}")
        if args.fix:
            remove(p)
            print(f"  removed {p}")
    stale = [t for t in cache.temps() if t.stale]
    for t in stale:
        print(f"STALE {t.path}: temp file of an interrupted compile or write")
        if args.fix:
            print(f"  removed {t.path}" if cache.remove_temp(t) else f"  skipped {t.path}: in use now")
    checked = f" (checked against {len(tables)} library table(s))" if tables else ""
    print(f"{total - len(broken)} of {total} entries ok, {len(stale)} stale temp file(s) in {cache.path}{checked}")
    if (broken or stale or bad_headers) and not args.fix:
        print("hint: `qola jit verify --fix` removes the broken entries and stale temp files "
              "(entries are rebuilt on next use)", file=sys.stderr)  # fmt: skip
        return EXIT_BROKEN
    return 0


def run_clean(args: argparse.Namespace) -> int:
    if _absent(args, "nothing to clean"):
        return 0
    cache = _cache(args, create=False)
    removed = cache.clean(everything=args.all)
    print(f"removed {len(removed)} files from {cache.path}")
    return 0
