"""No-op fast path for ``qola build``: standard library only, so an up-to-date build answers in
milliseconds instead of paying for the manifest schema, the resolver and the toolchain probe.

After a fully successful build, :func:`record` stores a digest over everything the graph was
derived from: the command line and working dir, the environment variables that can change it,
and the (size, mtime) of every input file and directory that ninja itself does not track (the
manifest, the module table, generator scripts, source and include dirs, hsa dirs, compilers,
qola's own files) plus every file it published. :func:`up_to_date` recomputes that digest and
asks ``ninja -n`` whether any edge is dirty; only when both agree is the build skipped.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

RECORD = ".qola-noop.json"
ENV_KEYS = ("GPU_ARCHS", "MAX_JOBS", "CK_DIR", "PATH", "HIPCC", "ROCM_PATH", "HIP_PATH", "HIP_PLATFORM",
            "CUDA_HOME", "CUDA_PATH", "CXX", "CC", "CUDAHOSTCXX", "QOLA_JIT_COMPILER", "PYTHONPATH")
_ENV_REF = re.compile(r"""(?:environ\.get|getenv)\(\s*\\?['"]([A-Za-z_][A-Za-z0-9_]*)""")


def env_keys_of(texts: Iterable[str]) -> list[str]:
    """The fixed keys plus every variable an expression text reads with os.environ.get / os.getenv."""
    keys = set(ENV_KEYS)
    for text in texts:
        keys.update(_ENV_REF.findall(text))
    return sorted(keys)


def _stat(path: str) -> list:
    try:
        st = os.stat(path)
    except OSError:
        return [path, None]
    return [path, st.st_size, st.st_mtime_ns]


def digest(argv: Sequence[str], env: Mapping[str, str], env_keys: Sequence[str], files: Sequence[str]) -> str:
    payload = {
        "argv": list(argv), "cwd": os.getcwd(),
        "env": {k: env.get(k) for k in env_keys},
        "files": [_stat(f) for f in files],
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def published_files(out: Path) -> list[str]:
    return sorted(str(p) for p in out.rglob("*") if p.is_file()) if out.is_dir() else []


def record(build_dir: Path, out: Path, argv: Sequence[str], env: Mapping[str, str], env_keys: Sequence[str],
           inputs: Iterable[str]) -> None:
    files = sorted(set(inputs)) + published_files(out)
    data = {"argv": list(argv), "env_keys": list(env_keys), "files": files,
            "digest": digest(argv, env, env_keys, files)}
    tmp = build_dir / f"{RECORD}.tmp"
    tmp.write_text(json.dumps(data))
    os.replace(tmp, build_dir / RECORD)


def forget(build_dir: Path) -> None:
    try:
        (build_dir / RECORD).unlink()
    except OSError:
        pass


def up_to_date(build_dir: Path, out: Path, argv: Sequence[str], env: Mapping[str, str], ninja: str) -> bool:
    try:
        data = json.loads((build_dir / RECORD).read_text())
    except (OSError, ValueError):
        return False
    if data.get("argv") != list(argv) or published_files(out) != [f for f in data["files"] if
                                                                     f.startswith(str(out) + os.sep)]:
        return False
    if digest(argv, env, data.get("env_keys", []), data.get("files", [])) != data.get("digest"):
        return False
    try:
        proc = subprocess.run([ninja, "-C", str(build_dir), "-n"], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.SubprocessError):
        return False
    return proc.returncode == 0 and "no work to do" in proc.stdout


def input_files(*, manifest: str, tree_files: Iterable[str], dirs: Iterable[str], generator_scripts: Iterable[str],
                tools: Iterable[str | None]) -> list[str]:
    """Everything the graph depends on that ninja does not track itself."""
    files = [manifest, *tree_files]
    pkg = Path(__file__).resolve().parent
    files += [str(p) for p in pkg.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    for d in dirs:
        if os.path.isdir(d):
            files.append(d)
            files += [str(p) for p in Path(d).rglob("*") if p.is_dir()] if d.endswith("/hsa") else []
    for script in generator_scripts:
        p = Path(script)
        if p.suffix == ".py" and p.exists():
            files += [str(f) for f in p.parent.rglob("*.py") if "__pycache__" not in f.parts]
            files.append(str(p.parent))
    files += [os.path.realpath(t) for t in tools if t]
    return files
