"""Compile JIT units ahead of time into a cache or a prebuilt dir (``qola jit prebuild``).

Same keys, command line, entry format and locking as the runtime, so the runtime
uses what this writes and the two never compile the same key at the same time.

The library is the authority: what is compiled (flags, source hash, content key, header bundle
and digest) comes from the table the library records (:mod:`qola.jit.libtable`); an
``index.json`` that says otherwise is refused, a source or bundle whose bytes differ from the
library's hashes is not compiled, and the unpacked headers are checked against the library's
digest before every compile. The source is compiled from a private copy of the verified bytes.
"""

from __future__ import annotations

import fnmatch
import math
import os
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from qola.core import deadlines, inputs, proc
from qola.core.errors import FailedProcessError, QolaError
from qola.core.fsutil import atomic_write, commit, remove
from qola.jit import format as fmt
from qola.jit import headers as hdr
from qola.jit import key as jkey
from qola.jit import libtable, safeio
from qola.jit.cache import JitCache
from qola.jit.layout import read_index
from qola.output import outdir


@dataclass(frozen=True)
class Unit:
    module: str
    jit_dir: Path
    table: libtable.LibModule  # what the library recorded: the authority
    unit: libtable.LibUnit
    key: str
    compiler: jkey.JitCompiler | None


@dataclass
class PrebuildResult:
    built: list[str] = field(default_factory=list)
    present: list[str] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)


def find_jit_dirs(out: Path) -> list[Path]:
    """OUT, OUT/jit or OUT/jit/<module> -> the module dirs holding an index.json."""
    out = Path(out)
    hint = "give the build's output dir (it has jit/<module>/index.json)"
    if out.exists() and not out.is_dir():
        raise QolaError(f"{out} is not a directory", hint=hint)

    if outdir.interrupted(out):  # a publish killed mid-switch: completed before OUT/jit is read
        with outdir.reading(out):
            pass
    for base in (out / "jit", out):
        found = sorted(p.parent for p in base.glob(f"*/{fmt.INDEX}"))
        if found:
            return found
    if (out / fmt.INDEX).is_file():
        return [out]
    raise QolaError(f"no JIT modules under {out}", hint=hint)


def resolve_compiler(
    table: libtable.LibModule, env: Mapping[str, str], memo: dict[str, jkey.JitCompiler]
) -> jkey.JitCompiler | None:
    """The compiler the runtime would use: QOLA_JIT_COMPILER, else the recorded path (or its
    name in PATH). None if there is none."""
    want = env.get("QOLA_JIT_COMPILER") or table.compiler
    path = jkey.which(want, env)
    if path is None and not env.get("QOLA_JIT_COMPILER"):
        path = jkey.which(os.path.basename(want), env)
    if path is None:
        return None
    if path not in memo:
        memo[path] = jkey.probe_compiler(path, env)
    return memo[path]


def module_tables(jit_dirs: Sequence[Path], libraries: Iterable[Path] = ()) -> dict[Path, libtable.LibModule]:
    """jit dir -> its library's table, after checking its index.json against that table."""
    tables = libtable.tables_for(jit_dirs, libraries)
    for d in jit_dirs:
        libtable.check_index(read_index(d), tables[d], str(d / fmt.INDEX))
    return tables


def select_units(jit_dirs: Sequence[Path], env: Mapping[str, str], pattern: str | None = None,
                 libraries: Iterable[Path] = ()) -> list[Unit]:  # fmt: skip
    memo: dict[str, jkey.JitCompiler] = {}
    units = []
    for d, table in module_tables(jit_dirs, libraries).items():
        comp = resolve_compiler(table, env, memo)
        for name in sorted(table.units):
            if pattern and not fnmatch.fnmatch(name, pattern):
                continue
            u = table.units[name]
            key = jkey.entry_key(u.content_key, comp.identity if comp else table.compiler_id)
            units.append(Unit(table.module, d, table, u, key, comp))
    return units


def entry_matches(fields: Mapping[str, str], table: libtable.LibModule, unit: libtable.LibUnit) -> bool:
    """Whether an entry's .meta says it was built from this unit of this library (as the runtime checks)."""
    return (fields.get("content_key") == unit.content_key and fields.get("source_sha256") == unit.source_sha256
            and fields.get("headers_sha256") == table.headers_sha256)  # fmt: skip


def ensure_headers(cache: JitCache, u: Unit, wait: float = math.inf) -> Path:
    """The module's bundle, unpacked into <cache>/headers/<sha> under the lock headers-<sha> (as the
    runtime does) and checked against the library's digest; a tree that fails the check (owner,
    mode, links, content) is moved aside and unpacked again."""
    t = u.table
    if not t.headers:
        return u.jit_dir
    if not (t.headers_sha256 and t.headers_digest):
        raise QolaError(f"module {t.module}: its library records no header digest", hint="rebuild the library")
    heads = cache.path / fmt.HEADERS
    dest = heads / t.headers_sha256
    with cache.lock(fmt.headers_lock(t.headers_sha256), wait=wait):
        for p in heads.glob(f"{fmt.temp_prefix(t.headers_sha256)}*"):  # we hold its lock: leftovers of dead unpacks
            remove(p)
        if os.path.lexists(dest):
            try:
                if hdr.tree_digest(dest) == t.headers_digest:
                    return dest
            except safeio.Refused:
                pass
            aside = heads / fmt.stale_aside(t.headers_sha256, os.getpid())
            os.rename(dest, aside)
            remove(aside)
        bundle = u.jit_dir / t.headers
        data = safeio.read_regular(bundle, max_size=fmt.MAX_SOURCE, follow=True)
        if jkey.sha256_hex(data) != t.headers_sha256:
            raise QolaError(f"{bundle} does not match the library {t.library} (sha256 differs)",
                            hint="restore OUT/jit from the build that produced the library")  # fmt: skip
        tmp = Path(tempfile.mkdtemp(dir=heads, prefix=fmt.temp_prefix(t.headers_sha256)))
        try:
            hdr.unpack_tar_gz(data, tmp, bundle)
            if hdr.tree_digest(tmp) != t.headers_digest:
                raise QolaError(f"{bundle}: the unpacked headers do not match the library's digest")
            atomic_write(tmp / fmt.COMPLETE, fmt.COMPLETE_TEXT.encode(), fmt.FILE_MODE)
            commit(tmp, dest)
        finally:
            remove(tmp)
    return dest


def compile_argv(u: Unit, headers: Path, source: Path, out: Path) -> list[str]:
    subst = {fmt.HEADERS_TOKEN: str(headers), fmt.DIR_TOKEN: str(u.jit_dir)}
    flags = []
    for f in u.table.flags:
        for a, b in subst.items():
            f = f.replace(a, b)
        if f:
            flags.append(f)
    return [u.compiler.path, *flags, "-o", str(out), str(source)]  # type: ignore[union-attr]


def _suffix(source_rel: str) -> str:
    ext = os.path.splitext(source_rel)[1]
    return ext if len(ext) <= 8 and all(c.isalnum() or c in ".+" for c in ext) else ".cpp"


def build_one(cache: JitCache, u: Unit, env: Mapping[str, str], wait: float = math.inf) -> tuple[str, str]:
    """("built" | "present" | "failed", message). Holds the key's lock while compiling (waits up to
    ``wait`` seconds for it, and for the header bundle's)."""
    name = f"{u.module}/{u.unit.name}"
    if u.compiler is None:
        return "failed", f"{name}: compiler {u.table.compiler} not found (set QOLA_JIT_COMPILER)"
    with cache.lock(u.key, wait=wait):
        e = cache.entry(u.key)
        if e.problem is None and entry_matches(e.fields, u.table, u.unit):
            return "present", name
        cache.remove_stale_temps(u.key)
        src = u.jit_dir / u.unit.source
        try:
            text = safeio.read_regular(src, max_size=fmt.MAX_SOURCE, follow=True)
        except safeio.Refused as exc:
            return "failed", f"{name}: {exc.message}"
        if jkey.sha256_hex(text) != u.unit.source_sha256:
            return "failed", f"{name}: {src} does not match the library {u.table.library} (sha256 differs)"
        headers = ensure_headers(cache, u, wait)
        fd, copy = tempfile.mkstemp(dir=cache.path, prefix=fmt.temp_prefix(u.key), suffix=_suffix(u.unit.source))
        with os.fdopen(fd, "wb") as f:
            f.write(text)
        fd, tmp = tempfile.mkstemp(dir=cache.path, prefix=fmt.temp_prefix(u.key), suffix=fmt.SO_SUFFIX)
        os.close(fd)
        log = cache.path / fmt.LOGS / fmt.log_name(u.key)
        argv = compile_argv(u, headers, Path(copy), Path(tmp))
        try:
            lfd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, fmt.PRIVATE_MODE)
            with os.fdopen(lfd, "w") as lf:
                lf.write(f"# qola jit prebuild: unit {u.unit.name} of {u.module} ({src})\n# key {u.key}\n")
                lf.write(f"# {' '.join(argv)}\n")
                lf.flush()
                try:
                    rc = proc.run(argv, env=env, out=proc.Output(stdout=lf), timeout=deadlines.COMPILE).returncode
                except proc.TimeoutExpired:
                    lf.write(f"no answer within {deadlines.COMPILE:g} s; ended\n")
                    rc = 124
                except OSError as exc:
                    lf.write(f"cannot run {argv[0]}: {exc.strerror or exc}\n")
                    rc = 127
            if rc != 0 or os.path.getsize(tmp) == 0:
                output = inputs.read_record(log, what="compile log")
                why = None if rc != 0 else "exit code 0 but no shared object written"
                failed = FailedProcessError(argv, rc, output, reason=why)
                return "failed", f"{name}: {failed.message}\n  log: {log}"
            fields = {"unit": u.unit.name, "module": u.module, "compiler": u.compiler.path,
                      "compiler_id": u.compiler.identity, "content_key": u.unit.content_key,
                      "source_sha256": u.unit.source_sha256, "headers_sha256": u.table.headers_sha256}  # fmt: skip
            entry = cache.publish(u.key, Path(tmp), fields)
            if entry.problem:
                return "failed", f"{name}: entry broken after writing: {entry.problem}"
            log.unlink(missing_ok=True)
            return "built", name
        finally:
            Path(tmp).unlink(missing_ok=True)
            Path(copy).unlink(missing_ok=True)


def prebuild(units: Sequence[Unit], cache: JitCache, env: Mapping[str, str], jobs: int,
             progress: Callable[[str, str], None] | None = None) -> PrebuildResult:  # fmt: skip
    result = PrebuildResult()
    wait = deadlines.seconds(deadlines.LOCK, env)  # a bad QOLA_LOCK_TIMEOUT fails before any work
    cache.remove_stale_temps()  # what killed compiles left behind

    def work(u: Unit) -> tuple[str, str]:
        proc.check_stop()  # told to stop (SIGTERM): the queued units end at once
        try:
            return build_one(cache, u, env, wait)
        except (OSError, QolaError) as exc:
            return "failed", f"{u.module}/{u.unit.name}: {getattr(exc, 'message', None) or exc}"

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        for status, msg in pool.map(work, units):
            if progress:
                progress(status, msg)
            if status == "built":
                result.built.append(msg)
            elif status == "present":
                result.present.append(msg)
            else:
                result.failed.append((msg.split(":")[0], msg))
    return result
