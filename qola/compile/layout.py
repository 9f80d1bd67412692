"""Every path of a build: the build dir's tree and the output dir's entry points, spelled once.

::

    BUILD/build.ninja                 the one graph (qola.compile.ninja writes it)
    BUILD/gen/<module>/blob/          generated sources (qola.compile.codegen; stamp.json and staging beside)
    BUILD/gen/configs/                merged tuned configs the generators read
    BUILD/obj/<module>/…              objects: <stem>-<hash of the source path>.o, qola_embedded_<module>.o
    BUILD/include/                    qola_config.h, qola_common.h (the compiles include them)
    BUILD/embed/<module>/             qola_embedded_<module>.{S,h,json}
    BUILD/itfs/<module>/              the cpp_itfs wrapper and public header qola generates (qola.plan.itfs)
    BUILD/fixed/                      the tree's dirs that hold a fixed file, staged (qola.compile.overlay)
    BUILD/link/                       version scripts; link/<module>/ the static archive's work dir
    BUILD/lib/                        libraries and Python modules, before they are published
    BUILD/jit/<md_name>/              JIT stubs and table, compiled into the library
    BUILD/jit/<md_name>/ahead/        recorded copies of instances built ahead ([usage] record_ahead)
    BUILD/jit-out/<md_name>/          deferred instance sources + index: published as OUT/jit/<md_name>
    BUILD/probes/                     cached compiler flag probes
    BUILD/tools/bin/                  tools generators find on PATH (the hipconfig shim)
    BUILD/.gitignore                  "*": git status of a checkout around the build dir never shows it
    BUILD/.qola-noop.json, .qola.lock, the toolchain stamp, .ninja_log   (their modules own them)
    OUT/logs/<module>.log             one log per module (published)

A module that needs one of these paths takes it from :class:`BuildLayout`; names that come from
input (module keys, ``md_name``) go through :func:`qola.core.fsutil.inside`. Standard library only.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from qola.compile.pathmap import PathMap
from qola.core import lock
from qola.core.fsutil import inside
from qola.toolchain import identity

GRAPH = "build.ninja"
TARGETS_FILE = "qola-targets.ninja"  # beside GRAPH: a ninja run's targets past the OS's limits (qola.compile.ninja)
GEN, BLOB, CONFIGS = "gen", "blob", "configs"
OBJ, INCLUDE, EMBED, LINK, LIB = "obj", "include", "embed", "link", "lib"
ITFS = "itfs"
FIXED = "fixed"
JIT_STUBS, JIT_OUT = "jit", "jit-out"
AHEAD = "ahead"  # BUILD/jit/<md_name>/ahead: recorded copies
PROBES, TOOLS_BIN = "probes", "tools/bin"
LOGS = "logs"

NOOP_RECORD = ".qola-noop.json"
# what the no-op fast path (qola.store.fastpath) records
GIT_IGNORE = "# qola's build dir: generated sources and objects, never source; git ignores all of it\n*\n"


def gen_module_dir(gen_root: Path, module: str) -> Path:
    """``gen/<module>``: the blob dir, its stamp and its staging dirs (owned by :mod:`qola.compile.codegen`)."""
    return inside(gen_root, module)


def object_path(module: str, src: str, paths: PathMap) -> str:
    """``obj/<module>/<stem>-<hash of the full path>.o`` (relative to the build dir, as ninja names
    it): equal basenames never collide. The path is hashed with the tree's and the build dir's roots
    named (:meth:`PathMap.name`), so the same unit has the same object name wherever they lie (a
    compile cache keys the line that names it)."""
    digest = hashlib.sha1(paths.name(src).encode()).hexdigest()[:10]
    return f"{OBJ}/{module}/{Path(src).stem}-{digest}.o"


@dataclass(frozen=True)
class BuildLayout:
    """The build dir ``root`` and the output dir ``out`` (both resolved, absolute)."""

    root: Path
    out: Path

    # -- the build dir ------------------------------------------------------------------------
    @property
    def graph(self) -> Path:
        return self.root / GRAPH

    @property
    def git_ignore(self) -> Path:
        """``.gitignore`` (:data:`GIT_IGNORE`: everything), as a venv or meson's build dir has one."""
        return self.root / ".gitignore"

    @property
    def gen_root(self) -> Path:
        return self.root / GEN

    @property
    def configs(self) -> Path:
        return self.root / GEN / CONFIGS

    def blob(self, module: str) -> Path:
        return gen_module_dir(self.gen_root, module) / BLOB

    def obj_dir(self, module: str) -> Path:
        return inside(self.root, OBJ, module)

    def embed_object(self, module: str) -> str:
        """The assembled embed file, relative (a ninja output)."""
        return f"{OBJ}/{module}/qola_embedded_{module}.o"

    @property
    def include(self) -> Path:
        return self.root / INCLUDE

    def embed_dir(self, module: str) -> Path:
        return inside(self.root, EMBED, module)

    @property
    def fixed(self) -> Path:
        """``fixed/``: the overlay of the tree's meta dir that holds qola's fixed copies."""
        return self.root / FIXED

    def itfs_dir(self, module: str) -> Path:
        return inside(self.root, ITFS, module)

    @property
    def link(self) -> Path:
        return self.root / LINK

    def version_script(self, namespace: str) -> Path:
        return inside(self.root, LINK, f"{namespace}.version")

    def python_version_script(self, md_name: str) -> Path:
        return inside(self.root, LINK, f"{md_name}.pyversion")

    def archive_work(self, module: str) -> Path:
        return inside(self.root, LINK, module)

    def artifact_rel(self, file_name: str) -> str:
        """``lib/<file>``, relative (a ninja output; the same path under OUT once published)."""
        return f"{LIB}/{file_name}"

    def artifact(self, file_name: str) -> Path:
        return inside(self.root, LIB, file_name)

    def jit_stubs(self, md_name: str) -> Path:
        return inside(self.root, JIT_STUBS, md_name)

    def jit_ahead(self, md_name: str) -> Path:
        """Where a module's recorded copies of its ahead instances are written (same file names)."""
        return inside(self.root, JIT_STUBS, md_name, AHEAD)

    @property
    def jit_out(self) -> Path:
        return self.root / JIT_OUT

    def jit_tree(self, md_name: str) -> Path:
        return inside(self.root, JIT_OUT, md_name)

    @property
    def probes(self) -> Path:
        return self.root / PROBES

    @property
    def tools_bin(self) -> Path:
        return self.root / TOOLS_BIN

    @property
    def noop_record(self) -> Path:
        return self.root / NOOP_RECORD

    @property
    def toolchain_stamp(self) -> Path:
        return self.root / identity.STAMP

    @property
    def build_lock(self) -> Path:
        return lock.build_lock_path(self.root)

    # -- the output dir -----------------------------------------------------------------------
    @property
    def out_lock(self) -> Path:
        return lock.output_lock_path(self.out)

    @staticmethod
    def log_rel(module: str) -> str:
        """``logs/<module>.log``, relative to OUT (what manifest.json records)."""
        return f"{LOGS}/{module}.log"

    def log(self, module: str) -> Path:
        return self.out / self.log_rel(module)

    @staticmethod
    def jit_rel(md_name: str) -> str:
        """``jit/<md_name>``, relative to OUT: where a module's deferred instances are published."""
        return f"jit/{md_name}"
