"""The JIT cache format, defined once — every name, tag, field, mode and limit that qola's Python
side and the C++ runtime (``qola/runtime/jit``) must agree on.

The spec is ``docs/jit-cache.md``. The runtime spells the same constants once, in
``qola_jit_format.h``; ``tests/jit/test_jit_format.py`` reads that header and the runtime's sources
and fails if any value differs from this module or is spelled inline elsewhere. Everything here is
a constant or a pure function of its arguments (no file system, no environment).

Layout of a cache dir (default ``$XDG_CACHE_HOME/qola/jit``)::

    <key>.so  <key>.meta                 an entry: the shared object, then its .meta
    .tmp-<name>-XXXXXX[.ext]             temp files (compiles, unpacks, atomic writes)
    locks/<key>.lock  locks/headers-<sha>.lock
    logs/<key>.log    logs/headers-<sha>.log
    headers/<sha>/    (+ .qola-complete) an unpacked, verified header bundle
    compilers/<sha256(path)[:32]>.id     compiler identity memos (runtime only)
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping
from pathlib import Path

# -- keys (qola.jit.key): sha256 over a domain tag and '\n'-separated fields, lowercase hex ---------
TAG_HEADERS = "qola-jit-headers-v1\n"
TAG_CONTENT = "qola-jit-content-v1\n"
TAG_COMPILER = "qola-jit-compiler-v1\n"
TAG_KEY = "qola-jit-key-v1\n"
KEY_LEN = 64  # a key, a content key, a compiler identity, a sha256: 64 lowercase hex digits
HEX64 = re.compile(r"[0-9a-f]{64}")
SHORT = 16  # digits of a key shown to people (`qola jit ls`)


def short(key: str) -> str:
    """The prefix of ``key`` shown in listings."""
    return key[:SHORT]


# -- an entry: <key>.so + <key>.meta -----------------------------------------------------------
SO_SUFFIX = ".so"
META_SUFFIX = ".meta"
META_HEAD = "qola-jit-entry 1\n"
# one "<field> <value>\n" line each, in this order, after META_HEAD ('\n'-separated; the first
# space splits; values hold no newline)
META_FIELDS = (
    "key",
    "size",
    "sha256",
    "unit",
    "module",
    "compiler",
    "compiler_id",
    "content_key",
    "source_sha256",
    "headers_sha256",
    "created",
)
PROVENANCE = ("content_key", "source_sha256", "compiler_id")  # 64 hex each; headers_sha256: 64 hex or ""
MAX_SIZE_DIGITS = 19  # the size field: at most 19 decimal digits


def so_name(key: str) -> str:
    return key + SO_SUFFIX


def meta_name(key: str) -> str:
    return key + META_SUFFIX


def parse_meta(text: str) -> dict[str, str]:
    """Fields of a .meta, exactly as the runtime reads them ('\\n'-separated, first space splits;
    the first line is the head)."""
    fields = {}
    for line in text.split("\n")[1:]:
        k, sep, v = line.partition(" ")
        if sep:
            fields[k] = v
    return fields


def render_meta(fields: Mapping[str, str]) -> str:
    """A .meta holding ``fields`` (names from :data:`META_FIELDS`), written in that order."""
    unknown = set(fields) - set(META_FIELDS)
    if unknown:
        raise ValueError(f"not .meta fields: {sorted(unknown)}")
    for k, v in fields.items():
        if "\n" in str(v):
            raise ValueError(f"bad .meta field {k!r}: {v!r}")
    return META_HEAD + "".join(f"{k} {fields[k]}\n" for k in META_FIELDS if k in fields)


# -- the cache dir -----------------------------------------------------------------------------
LOGS, HEADERS, COMPILERS, LOCKS = SUBDIRS = ("logs", "headers", "compilers", "locks")
TEMP_PREFIX = ".tmp-"  # every temp file or dir starts so; then the name it belongs to, then "-"
TEMP_RE = re.compile(re.escape(TEMP_PREFIX) + r"([0-9a-f]{64})")  # the temps that belong to a key or a header bundle
STALE_INFIX = "-stale-"  # headers/.tmp-<sha>-stale-<pid>: a bad tree moved aside
LOCK_SUFFIX = ".lock"
LOG_SUFFIX = ".log"
HEADERS_LOCK_PREFIX = "headers-"  # the lock (and log) of header bundle <sha>: headers-<sha>
COMPLETE = ".qola-complete"  # in headers/<sha>/: the unpack finished (left out of the digest)
COMPLETE_TEXT = "ok\n"
NETWORK_LOCK_DIR = "/tmp/qola-jit-locks-"  # + uid: where locks go when the cache is on a network fs
MEMO_HEAD = "qola-jit-compiler 1\n"  # compilers/<memo>: "path <p>\nsig <s>\nid <64 hex>\n" follow
MEMO_SUFFIX = ".id"
MEMO_NAME_LEN = 32  # hex digits of sha256(compiler path) in a memo's name


def temp_prefix(name: str) -> str:
    """Prefix of a temp file belonging to ``name`` (a key, a header sha, a file being written)."""
    return f"{TEMP_PREFIX}{name}-"


def lock_name(name: str) -> str:
    return name + LOCK_SUFFIX


def log_name(name: str) -> str:
    return name + LOG_SUFFIX


def headers_lock(sha: str) -> str:
    """The lock (and log) name of header bundle ``sha``."""
    return HEADERS_LOCK_PREFIX + sha


def stale_aside(sha: str, pid: int) -> str:
    """headers/<this>: an unpacked tree that failed its check, moved aside before removal."""
    return f"{TEMP_PREFIX}{sha}{STALE_INFIX}{pid}"


def memo_name(compiler_path: str) -> str:
    return hashlib.sha256(os.fsencode(compiler_path)).hexdigest()[:MEMO_NAME_LEN] + MEMO_SUFFIX


def network_lock_dir(uid: int) -> Path:
    return Path(f"{NETWORK_LOCK_DIR}{uid}")


# -- modes, staleness, limits --------------------------------------------------------------------
DIR_MODE = 0o700  # the cache dir and its subdirs (created so; refused if group/other-writable)
FILE_MODE = 0o644  # .so, .meta, memos, .qola-complete
PRIVATE_MODE = 0o600  # locks, logs
NETWORK_STALE_S = 3600  # network fs: a temp younger than this may be another host's compile
LOCKLESS_STALE_S = 600  # a temp without a lock (Python: an atomic write) is stale after this
KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
MAX_META = 64 * KiB  # <key>.meta
MAX_MEMO = 4 * KiB  # compilers/<memo>
MAX_INDEX = 64 * MiB  # OUT/jit/<module>/index.json
MAX_SOURCE = 256 * MiB  # a unit's source, one header, the header bundle
MAX_OBJECT = 8 * GiB  # a compiled entry, a library
MAX_TREE_ENTRIES = 200_000  # an unpacked header tree
MAX_TREE_DEPTH = 64

# file systems where flock does not coordinate hosts (statfs f_type -> name): locks go local
NETWORK_FS = {
    0x6969: "nfs", 0x517B: "smb", 0xFF534D42: "cifs", 0xFE534D42: "smb2", 0x00C36400: "ceph",
    0x0BD00BD0: "lustre", 0x47504653: "gpfs", 0x5346414F: "afs", 0x01021997: "9p", 0x65735546: "fuse",
    0x19830326: "beegfs", 0xAAD7AAEA: "panfs", 0x20030528: "orangefs", 0x7461636F: "ocfs2", 0x01161970: "gfs2",
}  # fmt: skip

# -- where the cache is, and the runtime's other settings -----------------------------------------
ENV_CACHE_DIR = "QOLA_JIT_CACHE_DIR"
ENV_JIT = "QOLA_JIT"  # "0": never compile
ENV_COMPILER = "QOLA_JIT_COMPILER"
ENV_PREBUILT = "QOLA_JIT_PREBUILT_DIR"  # ':'-separated read-only dirs of entries
ENV_SOURCE_DIR = "QOLA_JIT_SOURCE_DIR"  # instead of <libdir>/<jit_dir_rel>: <this>/<module>
ENV_VERBOSE = "QOLA_JIT_VERBOSE"
ENV = (ENV_CACHE_DIR, ENV_JIT, ENV_COMPILER, ENV_PREBUILT, ENV_SOURCE_DIR, ENV_VERBOSE)
XDG_SUBDIR = "/qola/jit"  # under $XDG_CACHE_HOME (absolute only)
HOME_SUBDIR = "/.cache/qola/jit"  # else under $HOME
PREBUILT = "prebuilt"  # OUT/jit/prebuilt: shipped entries, looked at before the cache


def default_cache_dir(env: Mapping[str, str]) -> Path:
    """QOLA_JIT_CACHE_DIR, else $XDG_CACHE_HOME/qola/jit (absolute only), else ~/.cache/qola/jit."""
    if env.get(ENV_CACHE_DIR):
        return Path(env[ENV_CACHE_DIR])
    xdg = env.get("XDG_CACHE_HOME", "")
    if xdg.startswith("/"):
        return Path(xdg + XDG_SUBDIR)
    home = env.get("HOME") or os.path.expanduser("~")
    return Path(home + HOME_SUBDIR)


# -- recorded usage and the coverage contract (docs/usage.md; qola.store.usage reads the records) ------
ENV_USAGE_DIR = "QOLA_USAGE_DIR"  # opt-in: the runtime writes one record file per process there
ENV_COVERAGE = "QOLA_JIT_COVERAGE"  # "strict": a miss is an error; "report": compiled, reported once
USAGE_HEAD = "qola-usage 1"  # first field of every record line
USAGE_PREFIX = "qola-usage-"  # record files: <prefix><host>-<pid>-<random><suffix>
USAGE_SUFFIX = ".rec"
USAGE_MAX_LINE = 1024  # bytes of one record (one write(), under PIPE_BUF)
USAGE_MAX_FILE = 1 << 20  # a process stops recording when its file reaches this size
USAGE_SUM_LEN = 16  # hex digits of sha256(line before the sum) that end a record
# a record: tab-separated, in this order, then the sum, then "\n"
USAGE_FIELDS = ("head", "event", "module", "md_name", "unit", "arch", "build_key", "host", "pid", "time")
USAGE_EVENTS = ("prebuilt", "cache", "compile", "refused", "failed", "ahead")
USAGE_AHEAD = "ahead"  # the event of a unit built ahead into a recorded library ([usage] record_ahead)

# -- OUT/jit/<module>/ and the library's table -----------------------------------------------------
HEADERS_TOKEN = "@QOLA_JIT_HEADERS@"  # in a unit's flags: the unpacked bundle
DIR_TOKEN = "@QOLA_JIT_DIR@"  # in a unit's flags: OUT/jit/<module>
INDEX = "index.json"
INDEX_FORMAT = "qola-jit-index"
INDEX_VERSION = 1
BUNDLE = "headers.tar.gz"
SOURCES = "src"  # OUT/jit/<module>/src/<unit><ext>
SECTION = ".qola_jit"  # ELF section holding the library's table as text
RECORD_HEAD = "qola-jit-table 1\n"
# the C structs of the generated table (qola_jit.h), field by field in declaration order
ENTRY_STRUCT = ("name", "entry_symbol", "source_rel", "source_sha256", "content_key", "flags", "arch", "n_funcs")
MODULE_STRUCT = (
    "name",
    "jit_dir_rel",
    "lang",
    "compiler",
    "compiler_id",
    "headers",
    "headers_sha256",
    "headers_digest",
    "entries",
    "n_entries",
    "record",
    "manifest_name",
    "build_key",
    "ahead",
    "n_ahead",
)
