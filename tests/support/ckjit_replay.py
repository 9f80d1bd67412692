"""The rest of ROCm/ck-jit's life after its build, acting as its code does (the rule is stated in
tests/support/ckjit_rule.py, "what it records, and how it is replayed later"): the install of the
recorded kernels (:func:`install`), then each kernel compiled as its runtime does at first use
(:func:`runtime_compile`: ``ck_jit_compile.sh``'s direct mode, flags word-split from one string, run
from the install's root) and as TE's CI prebuild does (:func:`prebuild_compile`: the flag list, include
dirs made absolute against the root, run from an empty directory). The caller moves qola's build
dir and output away first: a recorded flag that names a file there fails here as it fails there.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from support.ckjit_rule import family_flags


@dataclass(frozen=True)
class Kernel:
    name: str  # the blob's file name (ck_jit/blobs/<name>)
    argv: tuple[str, ...]  # its recorded flags, as the install writes them


def install(ndjson: Path, aiter_dir: Path, jit_dir: Path) -> list[Kernel]:
    """The install's ``ck_jit/``: each blob's source copied flat into ``blobs/``, each relative ``-I``
    dir copied from the AITER dir, each blob's flags kept to its arch family; the kernels."""
    entries = [json.loads(line) for line in ndjson.read_text().splitlines() if line.strip()]
    (jit_dir / "blobs").mkdir(parents=True, exist_ok=True)
    rel_dirs = {a[2:] for e in entries for a in e["argv"] if a.startswith("-I") and not os.path.isabs(a[2:])}
    kernels = []
    for e in entries:
        if e["kind"] != "blob":
            continue
        name = os.path.basename(e["source"])
        shutil.copy2(e["source"], jit_dir / "blobs" / name)
        kernels.append(Kernel(name, tuple(family_flags(e["argv"], name))))
    for rel in sorted(rel_dirs):
        src, dst = aiter_dir / rel, jit_dir / rel
        if src.is_dir() and not dst.exists():
            shutil.copytree(src, dst)
    return kernels


def _link_tail(rocm_lib: str | None, soname: str) -> list[str]:
    return [
        *([f"-L{rocm_lib}"] if rocm_lib else []),
        "-lamdhip64",
        "-Wl,--allow-shlib-undefined",
        f"-Wl,-soname,{soname}",
    ]


def runtime_compile(
    k: Kernel, root: Path, out: Path, hipcc: str, env: Mapping[str, str], rocm_lib: str | None = None
) -> subprocess.CompletedProcess[str]:
    """``ck_jit_compile.sh --blob-source <name> --blob-flags "<flags>" --output <out>`` as the runtime
    calls it: the flags as one string, word-split by bash, from ``root`` (it makes the output's dir)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    script = 'cd "$1" && "$2" -shared -fPIC $3 "$1/blobs/$4" $5 -o "$6"'
    tail = " ".join(_link_tail(rocm_lib, out.name))
    argv = ["bash", "-c", script, "ck_jit_compile", str(root), hipcc, " ".join(k.argv), k.name, tail, str(out)]
    return subprocess.run(argv, env=dict(env), capture_output=True, text=True)


def prebuild_compile(
    k: Kernel, root: Path, cache: Path, cwd: Path, hipcc: str, env: Mapping[str, str], rocm_lib: str | None = None
) -> tuple[subprocess.CompletedProcess[str], Path]:
    """``ck_jit_prebuild.py build --root <root> --cache-dir <cache>`` for one kernel, started in ``cwd``;
    (the compile, the library it wrote). As its ``compile_blob`` does, the first recorded flag is
    skipped (it skips "argv[0], the compiler", which the installed entry no longer holds: qola's
    ``-DWITH_HIP`` is lost there), so a line whose first flag mattered fails here as it fails there."""
    flags: list[str] = []
    for a in k.argv[1:]:
        for flag in ("-isystem", "-I"):
            if a.startswith(flag) and not os.path.isabs(a[len(flag) :]):
                a = flag + os.path.normpath(root / a[len(flag) :])
                break
        flags.append(a)
    stem = k.name.split(".")[0]
    tmp = cache / f"tmp-{stem}.so.tmp"
    cmd = [hipcc, "-shared", "-fPIC", *flags, str(root / "blobs" / k.name), *_link_tail(rocm_lib, f"{stem}.so")]
    cache.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run([*cmd, "-o", str(tmp)], cwd=cwd, env=dict(env), capture_output=True, text=True)
    lib = cache / f"{stem}.so"
    if proc.returncode == 0:
        os.replace(tmp, lib)
    return proc, lib


def defined_functions(lib: Path) -> list[str]:
    """The defined function symbols of ``lib``'s dynamic symbol table (what the runtime scans)."""
    from elftools.elf.elffile import ELFFile
    from elftools.elf.sections import SymbolTableSection

    with lib.open("rb") as f:
        sec = ELFFile(f).get_section_by_name(".dynsym")
        assert isinstance(sec, SymbolTableSection), lib
        return [
            s.name for s in sec.iter_symbols() if s["st_info"]["type"] == "STT_FUNC" and s["st_shndx"] != "SHN_UNDEF"
        ]


def archs_named(k: Kernel) -> list[str]:
    """The archs the kernel's recorded flags compile for."""
    out: list[str] = []
    for i, a in enumerate(k.argv):
        if a.startswith("--offload-arch="):
            out.append(a.split("=", 1)[1])
        elif a == "--offload-arch" and i + 1 < len(k.argv):
            out.append(k.argv[i + 1])
    return out


def replay_all(kernels: Sequence[Kernel], root: Path, work: Path, hipcc: str, env: Mapping[str, str]) -> dict[str, Any]:
    """Every kernel compiled both ways, the prebuild from an empty directory: {name: {"runtime": the
    library or the compiler's error text, "prebuild": likewise}}."""
    empty, rt_dir = work / "empty", work / "runtime"
    empty.mkdir(parents=True, exist_ok=True)
    rt_dir.mkdir(parents=True, exist_ok=True)
    done: dict[str, Any] = {}
    for k in kernels:
        lib = rt_dir / f"{k.name.split('.')[0]}.so"
        rt = runtime_compile(k, root, lib, hipcc, env)
        pre, pre_lib = prebuild_compile(k, root, work / "prebuild", empty, hipcc, env)
        done[k.name] = {
            "runtime": lib if rt.returncode == 0 else rt.stderr,
            "prebuild": pre_lib if pre.returncode == 0 else pre.stderr,
        }
    return done
