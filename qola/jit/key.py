"""JIT cache keys — the one definition shared with the C++ runtime (qola_jit.cpp); the domain
tags are :mod:`qola.jit.format`'s, the spec is docs/jit-cache.md.

    headers_digest = sha256("qola-jit-headers-v1\\n" + for each (relpath, bytes) sorted by relpath:
                            relpath "\\n" sha256(bytes) "\\n")
    content_key    = sha256("qola-jit-content-v1\\n" "lang " lang "\\n" "arch " arch "\\n"
                            "flags " N "\\n" (flag "\\n")*N "source " sha256(source) "\\n"
                            "headers " headers_digest "\\n")
    compiler_id    = sha256("qola-jit-compiler-v1\\n" path "\\n" + stdout of `path --version`)
    key            = sha256("qola-jit-key-v1\\n" content_key "\\n" compiler_id "\\n")

``content_key`` is computed at build time and compiled into the library's table; the
runtime finishes the key with the identity of the compiler it would use *now*, so a
changed compiler (path, version, or the file itself) never reuses an old entry. Flags
are the unexpanded templates (``@QOLA_JIT_HEADERS@``), so keys do not depend on where
headers are unpacked. All values are lowercase hex.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from qola.core import deadlines, proc
from qola.core.errors import QolaError
from qola.jit import format as fmt
from qola.toolchain.env import ToolchainEnv


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def headers_digest(files: Iterable[tuple[str, bytes]]) -> str:
    """Digest of a header closure: (path inside the bundle, content) pairs, any order."""
    hashed = []
    for rel, data in files:
        if "\n" in rel:
            raise ValueError(f"newline in header path {rel!r}")
        hashed.append((os.fsencode(rel), sha256_hex(data)))
    return digest_of_hashes(hashed)


def digest_of_hashes(files: Iterable[tuple[bytes, str]]) -> str:
    """The header digest from (path, sha256 hex of its content) pairs, any order (sorted here by
    the path's bytes, as the runtime sorts them): the one definition behind :func:`headers_digest`
    and :func:`qola.jit.headers.tree_digest`."""
    h = hashlib.sha256(fmt.TAG_HEADERS.encode())
    for rel, digest in sorted(files):
        h.update(rel + b"\n" + digest.encode() + b"\n")
    return h.hexdigest()


def content_key(*, source: bytes, headers: str, flags: Sequence[str], arch: str, lang: str) -> str:
    for value in (*flags, arch, lang):
        if "\n" in value:
            raise ValueError(f"newline in JIT key input {value!r}")
    text = (
        fmt.TAG_CONTENT
        + f"lang {lang}\narch {arch}\nflags {len(flags)}\n"
        + "".join(f"{f}\n" for f in flags)
        + f"source {sha256_hex(source)}\nheaders {headers}\n"
    )
    return sha256_hex(text.encode())


def compiler_identity(path: str, version_stdout: bytes) -> str:
    return sha256_hex(fmt.TAG_COMPILER.encode() + os.fsencode(path) + b"\n" + version_stdout)


def entry_key(content: str, compiler_id: str) -> str:
    return sha256_hex(f"{fmt.TAG_KEY}{content}\n{compiler_id}\n".encode())


@dataclass(frozen=True)
class JitCompiler:
    """A compiler as the runtime sees it: the path it runs and its identity."""

    path: str
    identity: str
    version: str  # first line of --version, for messages


def which(name: str, env: Mapping[str, str]) -> str | None:
    """PATH search exactly like the runtime's (absolute PATH entries only, no normalisation)."""
    if "/" in name:
        return name if _executable(name) else None
    for d in env.get("PATH", "").split(":"):
        if not d.startswith("/"):
            continue
        cand = d + ("" if d.endswith("/") else "/") + name
        if _executable(cand):
            return cand
    return None


def _executable(path: str) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


def probe_compiler(name: str, env: Mapping[str, str] | ToolchainEnv) -> JitCompiler:
    """Find ``name`` (path or PATH name) and compute its identity by running ``--version``
    (stdout only; stderr is ignored, as the runtime does). ``env`` is the child's environment, or
    the toolchain's view (PATH and the probe's timeout read from it, run under its children's)."""
    if isinstance(env, ToolchainEnv):
        path_var, child, limit = env.get("PATH"), env.child, env.probe_timeout
    else:
        path_var, child, limit = env.get("PATH"), proc.ChildEnv.of(env), lambda: deadlines.timeout(deadlines.PROBE, env)
    path = which(name, {} if path_var is None else {"PATH": path_var})
    if path is None:
        raise QolaError(f"JIT compiler {name!r} not found", hint="give an absolute path or put it in PATH")
    done = proc.run_checked(
        [path, "--version"],
        env=child,
        out=proc.Output(stderr=proc.DEVNULL, text=False),
        timeout=limit(),
        hint="is the compiler installed correctly?",
    )
    first = done.stdout.decode(errors="replace").strip().splitlines()
    return JitCompiler(path=path, identity=compiler_identity(path, done.stdout), version=first[0] if first else "")
