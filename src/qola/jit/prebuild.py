"""Compile JIT units ahead of time into a cache or a prebuilt dir (``qola jit prebuild``).

Same keys, command line, entry format and locking as the runtime, so the runtime
uses what this writes and the two never compile the same key at the same time.
"""

from __future__ import annotations

import fnmatch
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from qola.errors import QolaError
from qola.jit import headers as hdr
from qola.jit import key as jkey
from qola.jit.cache import JitCache
from qola.jit.layout import read_index


@dataclass(frozen=True)
class Unit:
    module: str
    jit_dir: Path
    index: dict
    unit: dict
    key: str
    compiler: jkey.JitCompiler


@dataclass
class PrebuildResult:
    built: list[str] = field(default_factory=list)
    present: list[str] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)


def find_jit_dirs(out: Path) -> list[Path]:
    """OUT, OUT/jit or OUT/jit/<module> -> the module dirs holding an index.json."""
    out = Path(out)
    for base in (out / "jit", out):
        found = sorted(p.parent for p in base.glob("*/index.json"))
        if found:
            return found
    if (out / "index.json").is_file():
        return [out]
    raise QolaError(f"no JIT modules under {out}", hint="give the build's output dir (it has jit/<module>/index.json)")


def resolve_compiler(index: dict, env: Mapping[str, str], memo: dict) -> jkey.JitCompiler | None:
    """The compiler the runtime would use: QOLA_JIT_COMPILER, else the recorded path (or its
    name in PATH). None if there is none."""
    want = env.get("QOLA_JIT_COMPILER") or index["compiler"]["path"]
    path = jkey.which(want, env)
    if path is None and not env.get("QOLA_JIT_COMPILER"):
        path = jkey.which(os.path.basename(want), env)
    if path is None:
        return None
    if path not in memo:
        memo[path] = jkey.probe_compiler(path, env)
    return memo[path]


def select_units(jit_dirs: Sequence[Path], env: Mapping[str, str], pattern: str | None = None) -> list[Unit]:
    memo: dict = {}
    units = []
    for d in jit_dirs:
        index = read_index(d)
        comp = resolve_compiler(index, env, memo)
        for u in index["units"]:
            if pattern and not fnmatch.fnmatch(u["name"], pattern):
                continue
            key = jkey.entry_key(u["content_key"], comp.identity) if comp else u["key"]
            units.append(Unit(index["module"], d, index, u, key, comp))  # type: ignore[arg-type]
    return units


def ensure_headers(cache: JitCache, u: Unit) -> Path:
    """Unpack the module's bundle once into <cache>/headers/<sha> (as the runtime does)."""
    h = u.index["headers"]
    if not h["bundle"]:
        return u.jit_dir
    dest = cache.path / "headers" / h["sha256"]
    if (dest / ".qola-complete").exists():
        return dest
    bundle = u.jit_dir / h["bundle"]
    if jkey.file_sha256(bundle) != h["sha256"]:
        raise QolaError(f"{bundle} does not match {u.jit_dir / 'index.json'}", hint="rebuild the output dir")
    tmp = Path(tempfile.mkdtemp(dir=cache.path / "headers", prefix=f".tmp-{h['sha256']}-"))
    try:
        hdr.unpack_tar_gz(bundle, tmp)
        (tmp / ".qola-complete").write_text("ok\n")
        os.rename(tmp, dest)
    except OSError:
        if not (dest / ".qola-complete").exists():
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def compile_argv(u: Unit, headers: Path, out: Path) -> list[str]:
    subst = {"@QOLA_JIT_HEADERS@": str(headers), "@QOLA_JIT_DIR@": str(u.jit_dir)}
    flags = []
    for f in u.index["flags"]:
        for a, b in subst.items():
            f = f.replace(a, b)
        flags.append(f)
    return [u.compiler.path, *flags, "-o", str(out), str(u.jit_dir / u.unit["source"])]


def build_one(cache: JitCache, u: Unit, env: Mapping[str, str]) -> tuple[str, str]:
    """("built" | "present" | "failed", message). Holds the key's lock while compiling."""
    name = f"{u.module}/{u.unit['name']}"
    if u.compiler is None:
        return "failed", f"{name}: compiler {u.index['compiler']['path']} not found (set QOLA_JIT_COMPILER)"
    with cache.lock(u.key):
        if cache.entry(u.key).problem is None:
            return "present", name
        cache.remove_stale_temps(u.key)
        src = u.jit_dir / u.unit["source"]
        if jkey.file_sha256(src) != u.unit["source_sha256"]:
            return "failed", f"{name}: {src} does not match index.json"
        headers = ensure_headers(cache, u)
        fd, tmp = tempfile.mkstemp(dir=cache.path, prefix=f".tmp-{u.key}-", suffix=".so")
        os.close(fd)
        log = cache.path / "logs" / f"{u.key}.log"
        argv = compile_argv(u, headers, Path(tmp))
        try:
            with open(log, "w") as lf:
                lf.write(f"# qola jit prebuild: unit {u.unit['name']} of {u.module}\n# key {u.key}\n")
                lf.write(f"# {' '.join(argv)}\n")
                lf.flush()
                rc = subprocess.run(argv, env=dict(env), stdin=subprocess.DEVNULL, stdout=lf, stderr=subprocess.STDOUT,
                                    check=False).returncode  # fmt: skip
            if rc != 0 or os.path.getsize(tmp) == 0:
                tail = log.read_text(errors="replace")[-2000:]
                return "failed", f"{name}: compiler exited with {rc}; log: {log}\n{tail}"
            fields = {"unit": u.unit["name"], "module": u.module, "compiler": u.compiler.path,
                      "compiler_id": u.compiler.identity}  # fmt: skip
            entry = cache.publish(u.key, Path(tmp), fields)
            if entry.problem:
                return "failed", f"{name}: entry broken after writing: {entry.problem}"
            log.unlink(missing_ok=True)
            return "built", name
        finally:
            Path(tmp).unlink(missing_ok=True)


def prebuild(units: Sequence[Unit], cache: JitCache, env: Mapping[str, str], jobs: int,
             progress: Callable[[str, str], None] | None = None) -> PrebuildResult:  # fmt: skip
    result = PrebuildResult()

    def work(u: Unit) -> tuple[str, str]:
        try:
            return build_one(cache, u, env)
        except (OSError, QolaError) as exc:
            return "failed", f"{u.module}/{u.unit['name']}: {exc}"

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
