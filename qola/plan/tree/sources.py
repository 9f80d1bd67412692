"""What a module compiles must be the kernel tree's: sources and the headers they can include.

A tree is input qola does not trust: a source that is a symlink to ``/etc/shadow`` (or a header
``#include``\\ d through a linked file or directory) would be read by the compiler, and its
diagnostics quote the lines they complain about into ``OUT/logs``. So, at plan time:

- every source (after ``..`` and symlinks are resolved) lies under an allowed root: the tree, CK's
  dir (``CK_DIR``, which the environment may point elsewhere), or the directory of a source the
  manifest names by an absolute path outside both (the manifest is the user's); it is opened
  through :func:`qola.plan.tree.files.open_regular` (a regular file, not a FIFO, at most
  :data:`MAX_SOURCE` bytes);
- so does every generator script (``blob_gen_cmd``'s first word: python would quote a linked-in
  file's lines in its SyntaxError);
- under the directories the compiles search inside the tree (include dirs, the sources' own
  dirs) and the generator scripts' dirs (what they import), no symlink resolves outside the allowed
  roots.

Each refusal is a :class:`QolaError` naming the module, the file and where it leads.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from qola.core import rules
from qola.core.errors import QolaError
from qola.plan.tree.files import MiB, open_regular

MAX_SOURCE = 64 * MiB  # one kernel source file (CK's largest: about 1 MiB)
MAX_WALK = 500_000  # entries walked looking for links out of the tree (AITER with CK: about 10,000)
HINT = (
    "a kernel source and every header it includes must be a file of the kernel tree (or CK's dir); "
    "replace the link by the file, or name a file of your own by its absolute path in the manifest"
)


def under(path: str, roots: Iterable[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip(os.sep) + os.sep) for r in roots)


def real_roots(paths: Iterable[str | os.PathLike[str]]) -> tuple[str, ...]:
    """The resolved forms of ``paths``, each once."""
    return tuple(dict.fromkeys(os.path.realpath(p) for p in paths))


def check_sources(
    module: str,
    sources: Iterable[str],
    roots: tuple[str, ...],
    *,
    what: str = "source",
    use: str = "compile it (its compiler messages would quote it into the logs)",
) -> None:
    """Every source (or generator script: ``what``) resolves under ``roots`` and is a regular file of
    at most :data:`MAX_SOURCE`."""
    for src in sources:
        problem = rules.dir_path_problem(src)
        if problem:
            raise QolaError(
                f"module {module}: {what} {src!r} {problem}",
                hint="rename the file (a directory listed in srcs compiles every .cu/.cpp file in it)",
            )
        real = os.path.realpath(src)
        if not under(real, roots):
            raise QolaError(
                f"module {module}: {what} {src} resolves to {real}, outside the kernel tree; refusing to {use}",
                hint=HINT,
            )
        try:
            fd, _ = open_regular(real, limit=MAX_SOURCE, what=f"module {module}'s {what}", nofollow=True, hint=HINT)
        except FileNotFoundError:
            continue  # listed but missing: the plan's own note names it
        os.close(fd)


def check_search_dirs(dirs: Iterable[str], tree_roots: tuple[str, ...], allowed: tuple[str, ...]) -> None:
    """No symlink under ``dirs`` (those inside ``tree_roots``; each walked once, links not followed)
    resolves outside ``allowed``."""
    inside = sorted({os.path.realpath(d) for d in dirs if under(os.path.realpath(d), tree_roots)})
    tops: list[str] = []
    for d in inside:  # a dir under one already walked is covered by it
        if not tops or not under(d, (tops[-1],)):
            tops.append(d)
    walked = 0
    for top in tops:
        for dirpath, dirnames, filenames in os.walk(top):
            dirnames[:] = [n for n in dirnames if n != ".git"]
            for name in dirnames + filenames:
                walked += 1
                path = os.path.join(dirpath, name)
                if walked > MAX_WALK:
                    raise QolaError(
                        f"more than {MAX_WALK:,} files under the compiles' include dirs ({top})",
                        hint="is an include dir the tree's root, or a link to a large directory?",
                    )
                if os.path.islink(path):
                    real = os.path.realpath(path)
                    if not under(real, allowed):
                        raise QolaError(
                            f"{path} is a link to {real}, outside the kernel tree, in a directory the "
                            "compiles search for headers; refusing to build with it",
                            hint=HINT,
                        )


def manifest_roots(named: Iterable[str], tree_roots: tuple[str, ...]) -> tuple[str, ...]:
    """The directories of the sources the manifest names outside the tree (as written): the user's own."""
    out = []
    for src in named:
        absolute = os.path.abspath(src)
        if not under(absolute, tree_roots) and not under(os.path.realpath(absolute), tree_roots):
            out.append(os.path.realpath(os.path.dirname(absolute)))
    return tuple(dict.fromkeys(out))


def search_dirs(sources: Iterable[str], includes: Iterable[str]) -> list[str]:
    """The directories a module's compiles look for quoted and angled includes in."""
    return [*includes, *(str(Path(s).parent) for s in sources)]
