"""One compile as a Remote Execution API action: the compiler launcher of ``qola build --remote``.

ninja runs ``<build>/remote/cc <compiler> <args…>`` (a script :mod:`qola.store.remote` writes) for every
compile; this module, run as ``python -m qola.compile.remote_launch CONFIG -- <compiler> <args…>``:

1. asks the compiler for the compile's dependencies (``-M``, on the client, as ccache/sccache do);
2. sends the sources and headers under the kernel tree (``t/``), the build dir (``b/``) and extra
   include roots (``x<i>/``) as the action's input root; toolchain files (``/usr``, the ROCm or CUDA
   install) stay on the worker, whose compiler the action's platform property pins;
3. runs the compile there through buildbox's ``trexe`` (the REAPI client; no protocol code here) as
   ``bash -c`` over the command with those roots spelled ``@S@/t`` …: the worker's staging dir
   replaces ``@S@``, so the prefix maps, ``-cuid`` and nvcc's source names see the same mapped
   paths as a local compile and the object has the same bytes; the depfile is rewritten to
   ``/qola-remote/…`` there (the cached result names no worker's dir) and back to the client's
   dirs here;
4. moves the outputs into place only when the action succeeded and every output arrived (a failed
   or partial download leaves nothing), and appends ``remote``/``cached``/``local`` to the build's
   tally (:mod:`qola.compile.tally`).

An unreachable service, refused credentials or a worker lost mid-action is an error naming the
endpoint, unless the build allows a local fallback (``--remote-fallback``): the compile then runs
here and is counted ``local`` with the reason. A compile that fails on the worker fails the build
as a local one would (its diagnostics are printed); it is never retried locally.

Standard library, :mod:`qola.core` and :mod:`qola.toolchain.portable` only (it runs once per compile); what the service returns is
read through the one checked open (:mod:`qola.core.inputs`) and refused unless a regular file.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from typing import Any

from qola.compile import tally
from qola.core import fsutil, inputs, proc
from qola.core.errors import QolaError
from qola.toolchain.portable import depfile_named, option, split_depfile

STAGE = "@S@"
DEP_ROOT = "/qola-remote"
OUT_OBJ, OUT_DEP = ".qola-out/o", ".qola-out/o.d"  # in the action, relative to its working dir b/
# A file compiled from the build dir may spell __FILE__ (AITER's generated asm_fmha_fwd_v3_<arch>.cpp
# does, through a tree macro); the line's own prefix map of the build dir (docs/design-notes.md),
# spelled for the staging dir, turns it into /qola/build. Should an object still hold the worker's
# staging path (a path the maps miss), the action exits with this code, and the compile is sent
# again mapping the staging dir to the client's build dir.
NAMES_BUILD_DIR = 86
SCRIPT = (
    's=${PWD%/b}; c=$1; d=$2; o=$3; shift 3; for a do shift; set -- "$@" "${a//@S@/$s}"; done; '
    'mkdir -p "${o%/*}" 2>/dev/null; "$@" || exit $?; '
    f'[ -z "$c" ] || ! grep -qaF "$s/b/" "$o" || exit {NAMES_BUILD_DIR}; '
    '[ -z "$d" ] || [ ! -f "$d" ] || sed -i "s|$s/|' + DEP_ROOT + '/|g" "$d"'
)


_PATH_FLAGS = ("-I", "-L", "-isystem", "-iquote", "-idirafter", "-include", "-imacros", "-o", "-MF")


class Infra(Exception):
    """The REAPI service failed (not the compile)."""


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def deps_argv(argv: Sequence[str], depfile: str) -> list[str]:
    """The compile ``argv`` turned into a dependency listing into ``depfile`` (no object)."""
    out: list[str] = []
    skip = False
    for i, a in enumerate(argv):
        if skip:
            skip = False
            continue
        if a in ("-o", "-MF", "-MT") and i + 1 < len(argv):
            skip = True
            continue
        if a in ("-MD", "-MMD", "-c"):
            continue
        out.append(a)
    return [*out, "-M", "-MF", depfile]


class Mapper:
    """Client paths <-> slots of the input root (``t``, ``b``, ``x0`` …)."""

    def __init__(self, roots: Mapping[str, str], system: Sequence[str]):
        self.roots = sorted(((p.rstrip("/") or "/", s) for s, p in roots.items()), key=lambda r: -len(r[0]))
        self.system = tuple(system)

    def slot(self, path: str) -> str | None:
        for root, s in self.roots:
            if _under(path, root):
                return s + path[len(root) :]
        return None

    def is_system(self, path: str) -> bool:
        return any(_under(path, p) for p in self.system)

    def spell(self, arg: str) -> str:
        """``arg`` with every client root in it replaced by its ``@S@/slot``."""
        for root, s in self.roots:
            i = arg.find(root)
            while i >= 0:
                end = i + len(root)
                before = arg[:i]
                if (not before or before[-1] in "=,:" or before in _PATH_FLAGS) and (
                    end == len(arg) or arg[end] in "/=,:"
                ):
                    arg = before + f"{STAGE}/{s}" + arg[end:]
                    i = arg.find(root, i + len(STAGE) + 1 + len(s))
                else:
                    i = arg.find(root, end)
        return arg

    def back(self, text: str) -> str:
        for root, s in self.roots:
            text = text.replace(f"{DEP_ROOT}/{s}/", root + "/")
        return text


def extra_roots(argv: Sequence[str], cwd: str, known: Mapping[str, str], system: Sequence[str]) -> dict[str, str]:
    """Include dirs outside the tree, the build dir and the toolchain: slots ``x0``, ``x1`` …"""
    out: dict[str, str] = {}
    m = Mapper(known, system)
    for i, a in enumerate(argv):
        d = None
        for flag in ("-I", "-isystem", "-iquote"):
            if a == flag and i + 1 < len(argv):
                d = argv[i + 1]
            elif a.startswith(flag) and len(a) > len(flag) and flag == "-I":
                d = a[2:]
        if d is None:
            continue
        d = os.path.normpath(os.path.join(cwd, d))
        if m.slot(d) is None and not m.is_system(d) and d not in out.values():
            out[f"x{len(out)}"] = d
    return out


def record(build_dir: str, where: str, obj: str, why: str = "") -> None:
    """Where one compile ran, in the build's tally (:func:`qola.compile.tally.record`)."""
    tally.record(os.path.join(build_dir, "remote"), where, obj, why)


def action(
    cfg: Mapping[str, Any], argv: Sequence[str], cwd: str, map_build: bool = False
) -> tuple[list[str], list[str], Mapper]:
    """(trexe's arguments before ``--``, the remote command, the mapper) for compile ``argv``;
    ``map_build``: the worker's staging dir is mapped back to the client's build dir (see
    :data:`NAMES_BUILD_DIR`), else the command fails with that code if the object holds it."""
    build = cfg["build_dir"]
    roots = {"t": cfg["tree"], "b": build}
    roots.update(extra_roots(argv, cwd, roots, cfg["system"]))
    m = Mapper(roots, cfg["system"])
    obj, dep = option(argv, "-o"), depfile_named(argv)
    if obj is None:
        raise Infra("no -o in the compile command")
    deps = _deps(cfg, argv, cwd)
    anchor = os.path.join(build, "remote", "anchor")  # empty: the working dir b/ exists in every input root
    if not os.path.exists(anchor):
        fsutil.write_if_changed(anchor, b"")
    inputs: list[str] = [f"--input-path={anchor}:b/.qola-remote"]
    for d in dict.fromkeys(os.path.normpath(os.path.join(cwd, p)) for p in deps):
        slot = m.slot(d)
        if slot is not None and ":" in d:  # trexe's --input-path is LOCAL:REMOTE
            raise Infra(f"{d}: a path with ':' cannot be sent by trexe")
        if slot is not None:
            inputs.append(f"--input-path={d}:{slot}")
        elif not m.is_system(d):
            raise Infra(f"{d} is outside the tree, the build dir and the toolchain: it cannot be sent")
    outs = [OUT_OBJ, *([OUT_DEP] if dep else [])]
    args = [
        cfg["trexe"],
        *cfg["endpoint"],
        "--working-dir=b",
        *inputs,
        *(f"--output-path={o}" for o in outs),
        f"--platform-properties={cfg['property']}",
        *(f"--env={k}={v}" for k, v in sorted(cfg["env"].items())),
    ]
    spelled = [m.spell(a) for a in _canonical_outputs(argv)]
    # an include root outside the tree and the build dir (pybind11's, say), and the build dir when a
    # file there names itself, keep the path a local compile writes into __FILE__: the worker's
    # staging dir must not reach the object
    mapped = [slot for slot in roots if slot.startswith("x") or (slot == "b" and map_build)]
    maps = [f.format(old=f"{STAGE}/{slot}", new=roots[slot]) for slot in mapped for f in cfg["map_flags"]]
    spelled[1:1] = maps
    command = [
        "/bin/bash",
        "-c",
        SCRIPT,
        "qola-remote",
        "" if map_build else "check",
        outs[1] if dep else "",
        outs[0],
        *spelled,
    ]
    return args, command, m


def _deps(cfg: Mapping[str, Any], argv: Sequence[str], cwd: str) -> list[str]:
    """The files compile ``argv`` reads (the compiler's own dependency scan, run locally)."""
    with tempfile.TemporaryDirectory(prefix="qola-deps-", dir=os.path.join(cfg["build_dir"], "remote")) as tmp:
        listing = os.path.join(tmp, "d")
        try:
            got = proc.run(deps_argv(argv, listing), cwd=cwd, out=proc.SEPARATE, timeout=cfg["timeout"])
        except proc.TimeoutExpired as exc:
            raise _LocalError(f"the dependency scan {proc.why_ended(exc)}\n") from None
        if got.returncode != 0:  # the compile itself is broken: let the compiler say why, locally
            raise _LocalError(got.stderr)
        return split_depfile(_read(listing, MAX_META, "the dependency listing").decode("utf-8", "surrogateescape"))


def _canonical_outputs(argv: Sequence[str]) -> list[str]:
    """``argv`` writing its object and depfile to fixed names: the object's name in the build dir
    (which qola derives from the source's path) then stays out of the action, and a second
    client whose tree lies elsewhere asks for the same action."""
    out = list(argv)
    for i in range(len(out) - 1):
        if out[i] in ("-o", "-MT"):
            out[i + 1] = OUT_OBJ
        elif out[i] == "-MF":
            out[i + 1] = OUT_DEP
    return out


class _LocalError(Exception):
    pass


def _seconds(meta: Mapping[str, Any], a: str, b: str) -> float | None:
    from datetime import datetime

    try:
        t = [datetime.fromisoformat(str(meta[k]).replace("Z", "+00:00")) for k in (a, b)]
    except (KeyError, ValueError):
        return None
    return round((t[1] - t[0]).total_seconds(), 3)


def timings(data: Mapping[str, Any]) -> dict[str, float | None]:
    """The service's timestamps of one action as durations: queued, inputs fetched by the worker,
    executed, outputs uploaded by the worker."""
    meta = data.get("executionMetadata") or {}
    return {
        "queue": _seconds(meta, "queuedTimestamp", "workerStartTimestamp"),
        "fetch": _seconds(meta, "inputFetchStartTimestamp", "inputFetchCompletedTimestamp"),
        "exec": _seconds(meta, "executionStartTimestamp", "executionCompletedTimestamp"),
        "upload": _seconds(meta, "outputUploadStartTimestamp", "outputUploadCompletedTimestamp"),
    }


def remote(
    cfg: Mapping[str, Any], argv: Sequence[str], cwd: str, times: dict[str, Any] | None = None
) -> tuple[int, str]:
    """Run ``argv`` as an action: (its exit code, "remote" | "cached"); ``times`` gets where the
    time went (client dependency scan, the whole trexe call, the service's own durations)."""
    code, where = _remote(cfg, argv, cwd, times, map_build=False)
    if code == NAMES_BUILD_DIR:
        code, where = _remote(cfg, argv, cwd, times, map_build=True)
    return code, where


def _remote(
    cfg: Mapping[str, Any], argv: Sequence[str], cwd: str, times: dict[str, Any] | None, *, map_build: bool
) -> tuple[int, str]:
    build = cfg["build_dir"]
    t0 = time.monotonic()
    args, command, m = action(cfg, argv, cwd, map_build)
    t1 = time.monotonic()
    obj, dep = option(argv, "-o") or "", depfile_named(argv)
    with tempfile.TemporaryDirectory(prefix="qola-dl-", dir=os.path.join(build, "remote")) as tmp:
        meta = os.path.join(tmp, "meta.json")
        dl = os.path.join(tmp, "out")
        try:
            got = proc.run(
                [*args, f"--result-metadata-file={meta}", f"--d={dl}", "--", *command],
                out=proc.SEPARATE,
                timeout=cfg["timeout"],
            )
        except proc.TimeoutExpired as exc:
            raise Infra(f"no result within {cfg['timeout']:.0f} s (is a worker with this toolchain up?)") from exc
        try:
            data = json.loads(_read(meta, MAX_META, "trexe's result metadata"))
            result = data["actionResultMetadata"]
        except (Infra, OSError, ValueError, KeyError, TypeError) as exc:
            raise Infra(
                f"trexe exited {got.returncode} without a result: {errors(got.stderr or got.stdout or '')}"
            ) from exc
        if times is not None:
            times.update({"deps": round(t1 - t0, 3), "trexe": round(time.monotonic() - t1, 3), **timings(data)})
        code = int(result.get("exitCode", 0) or 0)
        if code == NAMES_BUILD_DIR and not map_build:
            return code, "remote"
        sys.stdout.write(got.stdout)
        sys.stderr.write(_strip_log(got.stderr))
        if code != 0:
            return code, "remote"
        pairs = [(os.path.join(dl, OUT_OBJ), os.path.join(cwd, obj))]
        pairs += [(os.path.join(dl, OUT_DEP), os.path.join(cwd, dep))] if dep else []
        _check_outputs(dl, [src for src, _ in pairs])
        if dep:
            src = pairs[1][0]
            raw = _read(src, MAX_DEPFILE, "the action's depfile", follow=False)
            text = m.back(raw.decode("utf-8", "surrogateescape"))
            text = text.replace(OUT_OBJ + ":", (option(argv, "-MT") or obj) + ":", 1)
            fsutil.atomic_write(pairs[1][1], text.encode("utf-8", "surrogateescape"))  # a new file, never src
            pairs = pairs[:1]
        for src, dst in pairs:
            fsutil.commit(src, dst)
        return 0, "cached" if result.get("cachedResult") else "remote"


MAX_OBJECT = 4 << 30  # one object file returned by the service
MAX_DEPFILE = 64 << 20  # its depfile
MAX_META = 16 << 20  # trexe's result metadata, the launcher's config, a dependency listing


def _read(path: str, limit: int, what: str, *, follow: bool = True) -> bytes:
    """``path`` through the one checked open (a regular file of at most ``limit`` bytes); a refusal
    is the service's failure (:class:`Infra`)."""
    try:
        return inputs.read_checked(path, limit=limit, what=what, follow=follow)
    except FileNotFoundError:
        raise Infra(f"{what} did not arrive") from None
    except QolaError as exc:
        raise Infra(exc.message) from None


def _check_outputs(dl: str, outputs: Sequence[str]) -> None:
    """Every output the service returned must be a regular file (never a symbolic link: to a file of
    the client's, it would be rewritten or moved into the build dir) under real directories of the
    download dir, of a sane size — checked before any is read, rewritten or committed."""
    missing = 0
    for src in outputs:
        rel = os.path.relpath(src, dl)
        parent = dl
        try:
            for part in rel.split(os.sep)[:-1]:
                parent = os.path.join(parent, part)
                inputs.check_type(parent, want="dir", what="the action's output dir", follow=False)
            limit = MAX_DEPFILE if src.endswith(OUT_DEP) else MAX_OBJECT
            inputs.check_type(src, want="file", what=f"the action's output {rel}", follow=False, limit=limit)
        except FileNotFoundError:
            missing += 1
        except QolaError as exc:
            raise Infra(f"refused: {exc.message}") from None
    if missing:
        raise Infra(f"the action succeeded but {missing} output(s) did not arrive")


def errors(text: str) -> str:
    """The messages of trexe's ``[ERROR]`` log lines (the last two), without their prefixes."""
    found = [line.split("[ERROR] ", 1)[1].strip() for line in text.splitlines() if "[ERROR] " in line]
    return "; ".join(list(dict.fromkeys(found))[-2:])[:600] or " ".join(text.split()[-40:])


def _strip_log(text: str) -> str:
    """trexe's own log lines left out: the compiler's diagnostics stay."""
    return "".join(line for line in text.splitlines(keepends=True) if not line.startswith("20") or "] [" not in line)


def main(argv: Sequence[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m qola.compile.remote_launch CONFIG -- COMPILER ARGS...", file=sys.stderr)
        return 2
    try:
        cfg = json.loads(_read(argv[0], MAX_META, "the launcher's config"))
    except (Infra, ValueError) as exc:
        print(f"qola --remote: {argv[0]}: {exc}", file=sys.stderr)
        return 2
    compile_argv, cwd = list(argv[2:]), os.getcwd()
    obj = option(compile_argv, "-o") or "?"
    times: dict[str, Any] = {}
    try:
        code, where = remote(cfg, compile_argv, cwd, times)
    except _LocalError as exc:
        sys.stderr.write(str(exc))
        record(cfg["build_dir"], "failed", obj, "dependency scan failed")
        return 1
    except (Infra, OSError) as exc:
        why = f"{exc}"
        if not cfg.get("fallback"):
            print(
                f"qola --remote: {obj}: the REAPI service at {cfg['url']} failed: {why}\n"
                "  nothing was compiled locally (--remote-fallback allows it)",
                file=sys.stderr,
            )
            record(cfg["build_dir"], "failed", obj, why)
            return 1
        print(
            f"qola --remote: {obj}: the REAPI service failed ({why}); compiling locally (--remote-fallback)",
            file=sys.stderr,
        )
        try:
            done = proc.run(compile_argv, cwd=cwd, timeout=cfg["timeout"])
        except proc.TimeoutExpired as exc:
            print(f"qola --remote: {obj}: the local compile {proc.why_ended(exc)}", file=sys.stderr)
            record(cfg["build_dir"], "failed", obj, "local compile timed out")
            return 124
        sys.stdout.write(done.stdout or "")
        code = done.returncode
        record(cfg["build_dir"], "local", obj, why)
        return code
    record(cfg["build_dir"], where if code == 0 else "failed", obj, json.dumps(times, separators=(",", ":")))
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
