"""The build key: one sha256 over everything that decides a build's output bytes, computed before
anything is generated or compiled (after the plan and the toolchain probe).

It is what ``qola build --prebuilt`` looks an archive up by and what ``manifest.json`` records
(``build_key``, and per part ``build_key_parts``). Its parts (:meth:`BuildKey.explain` prints them,
``qola plan --key --json``):

* ``qola``      qola's version and a digest of its own files (templates, runtime, code);
* ``manifest``  the validated manifest, dumped canonically (comments, whitespace, key order and
                the raw file's hash do not count), less what does not change the output:
                ``[qola].aiter_root`` (a path), ``[build].jobs`` and ``[build].launcher``;
* ``plan``      the resolved plan (sources, flags, include dirs, generators with their variant
                filters, the JIT split, archs, mode, link) with the tree's path written ``<tree>``
                and qola's package dir (its templates and runtime) ``<qola>``;
* ``tree``      the tree's git commit (None for an sdist) and the sha256 of every file the plan
                reads: the module table and ``core.py``, every source and every file under its dir,
                every include dir, each generator script's dir, tuned configs, files named in
                generator commands, the embedded ``hsa/<arch>/<type>`` dirs, ``aiter/configs``;
                named relative to the tree (``<tree>/csrc/…``);
* ``toolchain`` kind, version and ``--version`` output, the sha256 of the compiler, the host C++
                compiler, ``as`` and ``ld`` (by content, not path), the probed flag set, link flags
                and runtime libraries, the compiler environment (:mod:`qola.toolchain.identity`), and
                for a ``[jit]`` build the path of the JIT's compiler (the library runs it by that path);
* ``build``     what the command line adds: isolation on/off;
* ``python``    for Python modules: the interpreter's version and ABI, pybind11's and torch's versions;
* ``env``       the variables the module table reads and ``AITER_CONFIG_*``.

No absolute path of the tree, the build dir or the output dir enters it: the same inputs in
another directory give the same key. ``-j``, the launcher and ``--verbose`` do not count.

The key is derived from a :class:`Material` (JSON: every part but the tree's file hashes, and the
roots to hash): the incremental build path keeps it in its record and rehashes only the tree.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import qola
from qola import __version__
from qola.core.secret import redact

if TYPE_CHECKING:
    from qola.plan.manifest import Manifest
    from qola.plan.model import Plan
    from qola.store.fastpath import RecordedEnv
    from qola.toolchain import Toolchain

FORMAT = 1
TREE = "<tree>"
QOLA = "<qola>"
SKIP_DIRS = frozenset({"__pycache__", ".git"})
# manifest keys that never change the output bytes (a path, parallelism, a compiler launcher)
MANIFEST_IGNORED: dict[str, Any] = {
    "path": True,
    "sha256": True,
    "qola": {"aiter_root"},
    "build": {"jobs", "launcher", "remote"},
    "usage": {"files"},
}
PLAN_IGNORED = ("manifest_path", "manifest_sha256", "warnings", "tree_root", "meta_dir", "pin")
LINK_TOOLS = ("as", "ld")  # run by the compiler drivers from PATH


def canonical(data: Any) -> bytes:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def digest(data: Any) -> str:
    return hashlib.sha256(canonical(data)).hexdigest()


@dataclass(frozen=True)
class BuildKey:
    """The key's parts (JSON data, paths already normalised) and the key they give."""

    parts: Mapping[str, Any]

    @property
    def digests(self) -> dict[str, str]:
        """Part name -> sha256 of that part: two keys differ where these do."""
        return {name: digest(value) for name, value in sorted(self.parts.items())}

    @property
    def key(self) -> str:
        return digest({"format": FORMAT, "parts": self.digests})

    def explain(self) -> dict[str, Any]:
        return {"build_key": self.key, "format": FORMAT, "parts": self.digests, "inputs": dict(self.parts)}


# -- paths ---------------------------------------------------------------------------------------


def _rooted(roots: Iterable[str]) -> list[tuple[re.Pattern[str], str]]:
    """Patterns replacing each root (longest first, whole path components only) by ``<tree>``, and
    qola's own package dir (templates, runtime) by ``<qola>``."""
    named = {r.rstrip("/"): TREE for r in roots if r}
    pkg = Path(qola.__file__).resolve().parent
    named.update({str(pkg): QOLA, str(Path(qola.__file__).parent.absolute()): QOLA})
    return [
        (re.compile(re.escape(root) + r"(?=/|$|[\s'\"=:;,)])"), named[root])
        for root in sorted(named, key=len, reverse=True)
    ]


def _normalise(value: Any, subs: list[tuple[re.Pattern[str], str]]) -> Any:
    if isinstance(value, str):
        for pat, repl in subs:
            value = pat.sub(repl, value)
        return value
    if isinstance(value, Mapping):
        return {str(k): _normalise(v, subs) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_normalise(v, subs) for v in value]
    return value


def _tree_roots(plan: Plan) -> list[str]:
    roots = {plan.tree_root, plan.meta_dir}
    roots |= {os.path.realpath(r) for r in roots}
    return sorted(roots)


# -- hashing ---------------------------------------------------------------------------------------

_BINARIES: dict[tuple[Any, ...], str | None] = {}


def binary_sha256(path: str | None) -> str | None:
    """sha256 of the file ``path`` resolves to (None: absent); cached per (path, size, mtime)."""
    from qola.toolchain.identity import file_id  # lazy: the one stat of a tool

    fid = file_id(path)
    if fid is None or fid[1] is None:
        return None
    ident = tuple(fid)
    real = fid[0]
    if ident not in _BINARIES:
        from qola.core.hashing import file_sha256  # lazy: paid only by the callers that need it

        try:
            _BINARIES[ident] = file_sha256(real)
        except OSError:
            _BINARIES[ident] = None
    return _BINARIES[ident]


MAX_TREE_FILE = 256 << 20  # a file under a source dir larger than this is keyed by its stat, never hashed


def _files_under(path: str, recursive: bool) -> Iterable[str]:
    if os.path.isfile(path):
        yield path
        return
    if not recursive or not os.path.isdir(path):
        return
    seen: set[str] = set()
    for top, dirs, files in os.walk(path, followlinks=True):
        real = os.path.realpath(top)
        if real in seen:  # a symlink loop
            dirs[:] = []
            continue
        seen.add(real)
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS)
        for name in sorted(files):
            full = os.path.join(top, name)
            if os.path.isfile(full) and not name.endswith((".pyc", ".pyo")):
                yield full


def hash_files(roots: Iterable[tuple[str, bool]], tree_roots: Iterable[str]) -> dict[str, str | None]:
    """Label -> sha256 of every file under ``roots`` ((path, recursive)); a root that does not exist
    is recorded as None (its appearance changes the key). Labels are tree-relative (``<tree>/…``)."""
    from qola.core.hashing import TooLarge, file_sha256  # lazy: paid only by the callers that need it

    subs = _rooted(tree_roots)
    out: dict[str, str | None] = {}
    for root, recursive in roots:
        if not os.path.exists(root):
            out.setdefault(_normalise(root, subs), None)
            continue
        for f in _files_under(root, recursive):
            label = _normalise(f, subs)
            if label not in out or out[label] is None:
                try:
                    out[label] = file_sha256(f, MAX_TREE_FILE)
                except TooLarge:  # its size checked before a byte is hashed (a sparse 2 TB file)
                    st = os.stat(f)
                    out[label] = f"unhashed:{st.st_size}:{st.st_mtime_ns}:{st.st_ino}"
                except OSError:
                    out[label] = None
    return dict(sorted(out.items()))


def _qola_files() -> str:
    pkg = Path(qola.__file__).resolve().parent
    files = sorted(p for p in pkg.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    from qola.core.hashing import file_sha256  # lazy: paid only by the callers that need it

    return digest([[p.relative_to(pkg).as_posix(), file_sha256(p)] for p in files])


# -- the parts -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Material:
    """Everything the key needs, as JSON: ``fixed`` parts and the tree files to hash."""

    fixed: Mapping[str, Any]
    roots: tuple[tuple[str, bool], ...]
    tree_roots: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "fixed": dict(self.fixed),
            "roots": [list(r) for r in self.roots],
            "tree_roots": list(self.tree_roots),
        }

    @classmethod
    def of(cls, data: object) -> Material:
        """From :meth:`to_json` (JSON read back: the no-op record's ``key``); KeyError, TypeError or
        ValueError for anything else."""
        if not isinstance(data, dict) or data["format"] != FORMAT:
            raise ValueError("another key format")
        fixed, roots, tree_roots = data["fixed"], data["roots"], data["tree_roots"]
        if not isinstance(fixed, dict) or not isinstance(fixed.get("tree"), dict):
            raise TypeError("fixed: not the key's parts")
        if not isinstance(roots, list) or not isinstance(tree_roots, list):
            raise TypeError("roots: not lists")
        return cls(dict(fixed), tuple((str(p), bool(r)) for p, r in roots), tuple(str(r) for r in tree_roots))

    def key(self) -> BuildKey:
        """The key, with the tree's files hashed now."""
        tree = dict(self.fixed["tree"])
        tree["files"] = hash_files(self.roots, self.tree_roots)
        return BuildKey({**self.fixed, "tree": tree})


def tree_inputs(plan: Plan, table_files: Iterable[str]) -> list[tuple[str, bool]]:
    """The files and dirs of the tree (and outside it) the plan reads: (path, recursive)."""
    roots: list[tuple[str, bool]] = [(f, False) for f in table_files]
    for m in plan.modules:
        roots += [(s, False) for s in m.sources]
        roots += [(str(Path(s).parent), True) for s in m.sources]
        roots += [(d, True) for d in m.include_dirs]
        for g in m.generators:
            if g.script:
                roots += [(str(Path(g.script).parent), True)]
            roots += [(a, False) for a in g.argv[1:] if os.path.isabs(a) and os.path.isfile(a)]
        roots += [(f, False) for c in m.configs for f in (*c.sources, c.untuned) if f]
        roots += [(str(Path(plan.meta_dir) / "hsa" / a / t), True) for a in plan.archs for t in m.embed]
    roots.append((str(Path(plan.tree_root) / "aiter" / "configs"), True))
    qola_pkg = str(Path(qola.__file__).resolve().parent)
    seen, out = set(), []
    for path, rec in roots:
        norm = os.path.normpath(path)
        if os.path.realpath(norm).startswith(qola_pkg + os.sep) or (norm, rec) in seen:
            continue  # qola's own files are the "qola" part
        seen.add((norm, rec))
        out.append((norm, rec))
    return out


def _manifest_part(manifest: Manifest) -> Any:
    data = manifest.model_dump(mode="json", exclude=MANIFEST_IGNORED)
    qola_ = data.get("qola")
    if isinstance(qola_, dict) and isinstance(qola_.get("aiter_url"), str):  # a clone URL's credentials
        qola_["aiter_url"] = redact(qola_["aiter_url"])  # change nothing built: no key or record holds them
    return data


def _plan_part(plan: Plan) -> Any:
    data = {k: v for k, v in plan.to_json().items() if k not in PLAN_IGNORED}
    return _normalise(data, _rooted(_tree_roots(plan)))


def _jit_compiler(plan: Plan, tc: Toolchain, path: str | None) -> str | None:
    """The path a library's on-demand JIT runs (baked into the library: it counts as a path), found
    on ``path`` (the build's PATH, unless the toolchain's children get their own)."""
    if not any(m.jit is not None for m in plan.modules):
        return None
    from qola.jit.key import which  # lazy: paid only by the callers that need it

    name = next((m.jit.compiler for m in plan.modules if m.jit is not None and m.jit.compiler), None)
    path = tc.child_env.get("PATH", path)
    return which(name or tc.compiler, {} if path is None else {"PATH": path}) or name or tc.compiler


def _toolchain_part(tc: Toolchain, env: RecordedEnv, plan: Plan) -> dict[str, Any]:
    from qola.toolchain.identity import COMPILER_ENV, compiler_env  # lazy: paid only by the callers that need it

    given = env.get("PATH")
    path = os.defpath if given is None else given
    return {
        "jit_compiler": _jit_compiler(plan, tc, given),
        "kind": tc.kind,
        "version": tc.version,
        "version_output": tc.version_output,
        "rocm_version": tc.rocm_version,
        "compiler_sha256": binary_sha256(tc.compiler),
        "host_cxx_sha256": binary_sha256(tc.host_cxx),
        "tools_sha256": {t: binary_sha256(shutil.which(t, path=path)) for t in LINK_TOOLS},
        "flags": list(tc.base_flags),
        "lang_args": list(tc.lang_args),
        "link_flags": list(tc.link_flags),
        "libs": list(tc.libs),
        "lib_dirs": list(tc.lib_dirs),
        "dropped_flags": list(tc.dropped_flags),
        "removed_flags": list(tc.removed_flags),
        "child_env": dict(sorted(tc.child_env.items())),
        "env": compiler_env(env.only(COMPILER_ENV)),
    }


def _version_of(dist: str) -> str | None:
    from importlib import metadata  # lazy: paid only by the callers that need it

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _python_part(plan: Plan) -> dict[str, Any] | None:
    pymods = [m for m in plan.modules if m.is_python_module]
    if not pymods:
        return None
    import sysconfig  # lazy: paid only by the callers that need it

    return {
        "implementation": sys.implementation.cache_tag,
        "version": list(sys.version_info[:3]),
        "soabi": sysconfig.get_config_var("SOABI"),
        "pybind11": _version_of("pybind11"),
        "torch": _version_of("torch") if any(not m.torch_exclude for m in pymods) else None,
    }


def _env_part(env: RecordedEnv, table_texts: Iterable[str], plan: Plan) -> dict[str, str | None]:
    from qola.core.rules import referenced_env  # lazy: paid only by the callers that need it

    keys = set(referenced_env(table_texts, {m.name for m in plan.modules})) | {k for k, _ in env.prefixed()}
    part: dict[str, str | None] = _normalise({k: env.get(k) for k in sorted(keys)}, _rooted(_tree_roots(plan)))
    return part


class TableRead(NamedTuple):
    """The tree's module table as read: its files and their texts."""

    files: Iterable[str]
    texts: Iterable[str]


def material(
    manifest: Manifest,
    plan: Plan,
    tc: Toolchain,
    env: RecordedEnv,
    *,
    isolate: bool,
    table: TableRead,
) -> Material:
    """The key's material for a build of ``plan`` with ``tc`` under ``env`` (the recorded variables:
    PATH, the compilers' and what the module table reads, :func:`qola.store.fastpath.env_keys_of`;
    reads the compilers' and qola's files; the tree's are hashed by :meth:`Material.key`)."""
    table_files, table_texts = table
    fixed = {
        "qola": {"version": __version__, "files": _qola_files()},
        "manifest": _manifest_part(manifest),
        "plan": _plan_part(plan),
        "tree": {"commit": plan.tree_commit},
        "toolchain": _toolchain_part(tc, env, plan),
        "build": {"isolate": isolate},
        "python": _python_part(plan),
        "env": _env_part(env, table_texts, plan),
    }
    return Material(fixed, tuple(tree_inputs(plan, table_files)), tuple(_tree_roots(plan)))


def recorded_key(manifest_json: Mapping[str, Any]) -> str | None:
    """The ``build_key`` a manifest.json records (None: none, or not a key)."""
    key = manifest_json.get("build_key") if isinstance(manifest_json, Mapping) else None
    return key if isinstance(key, str) and re.fullmatch(r"[0-9a-f]{64}", key) else None
