"""Embedding benchmark (issue 5): qola's .incbin assembly vs a header of hex ``unsigned char`` arrays.

For the real AITER hsa set (every .co for the given archs) it measures, in one run:

* qola: ``embed.collect + render + write`` (wall) and ``cc -c`` of the .S (wall, peak RSS);
* hex arrays: generating a header of ``alignas(4096) inline const unsigned char data_x[] = {0x..}``
  plus an ``std::unordered_map<std::string, std::string_view>`` (wall) and ``g++ -std=c++17 -O2 -c``
  of a file that uses it (wall, peak RSS).

``--subset N`` takes the first N code objects (in key order) for the hex path and for a qola
run on the same files; qola also runs on the full set. Nothing is extrapolated: each row says how
many files and bytes it measured. Peak RSS is the largest child process's max RSS (the compiler
proper), read with getrusage(RUSAGE_CHILDREN) in a fresh wrapper process per step.

    python bench/embed.py --aiter-root ~/.cache/qola-test/amd_aiter-0.1.7.post2.dev18 --subset 250

``--aiter-tarball`` takes the ``amd-aiter`` sdist itself and unpacks only ``aiter_meta/hsa/<arch>/``
of the chosen archs into a temp dir, so the bench runs on a host with no unpacked tree, no network
and nothing but the standard library (qola from this checkout)::

    PYTHONPATH=src python3 bench/embed.py --aiter-tarball .carry/amd_aiter-0.1.7.post2.dev18.tar.gz

Rows are printed (and ``--json`` rewritten) as each one finishes.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

try:
    from qola.hooks import embed
except ImportError:  # run from a checkout without PYTHONPATH=src
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from qola.hooks import embed

# Runs a command in a fresh process so RUSAGE_CHILDREN covers that command's processes only.
_WRAP = (
    "import resource, subprocess, sys, time\n"
    "t = time.perf_counter()\n"
    "rc = subprocess.run(sys.argv[1:]).returncode\n"
    "wall = time.perf_counter() - t\n"
    "print(wall, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, rc)\n"
)


def measure(cmd: list[str]) -> tuple[float, float]:
    """(wall seconds, peak RSS MiB) of ``cmd``; raises if it fails."""
    out = subprocess.run([sys.executable, "-c", _WRAP, *map(str, cmd)], capture_output=True, text=True)
    wall, rss_kib, rc = out.stdout.split()[-3:]
    if int(rc) != 0:
        raise SystemExit(f"failed ({rc}): {' '.join(map(str, cmd))}\n{out.stderr[-3000:]}")
    return float(wall), int(rss_kib) / 1024


_HEX = [f"0x{x:02x}" for x in range(256)]


def write_hex_header(blobs: list[embed.Blob], path: Path) -> None:
    """The hex-array approach: one array per file, then a map over them (written as it goes)."""
    names = []
    with open(path, "w") as out:
        out.write(
            "\n".join(
                [
                    "#pragma once",
                    "#include <string>",
                    "#include <string_view>",
                    "#include <unordered_map>",
                    "namespace hex_hsa {",
                    "",
                ]
            )
        )
        for b in blobs:
            name = "data_" + re.sub(r"\W", "_", b.key)
            names.append((b.key, name, b.size))
            data = b.path.read_bytes()
            body = ",\n".join(",".join(map(_HEX.__getitem__, data[i : i + 16])) for i in range(0, len(data), 16))
            out.write(f"alignas(4096) inline const unsigned char {name}[] = {{\n{body}\n}};\n")
        out.write("inline const std::unordered_map<std::string, std::string_view> embedded_hsa_map = {\n")
        out.writelines(
            f'    {{"{k}", std::string_view(reinterpret_cast<const char*>({n}), {s})}},\n' for k, n, s in names
        )
        out.write("};\n}  // namespace hex_hsa\n")


HEX_USE = """#include "hex_embed.h"
const void* hex_find(const std::string& key, size_t* size)
{
    auto it = hex_hsa::embedded_hsa_map.find(key);
    if(it == hex_hsa::embedded_hsa_map.end()) return nullptr;
    *size = it->second.size();
    return it->second.data();
}
"""


def run_qola(blobs: list[embed.Blob], work: Path, tag: str, cc: str) -> dict:
    t = time.perf_counter()
    # hashing (dedupe) is part of qola's generator: redo it, as collect() would
    blobs = [embed.Blob(b.key, b.path, b.size, embed.sha256_file(b.path)) for b in blobs]
    files = embed.write(embed.render(blobs, "bench", tag), work / tag)
    gen = time.perf_counter() - t
    obj = work / tag / f"{tag}.o"
    wall, rss = measure(embed.assemble_command(files.asm, obj, cc=cc))
    size = obj.stat().st_size
    obj.unlink()
    return {"gen": gen, "compile": wall, "rss": rss, "obj": size}


def run_hex(blobs: list[embed.Blob], work: Path, cxx: str) -> dict:
    d = work / "hex"
    d.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    write_hex_header(blobs, d / "hex_embed.h")
    gen = time.perf_counter() - t
    (d / "use.cpp").write_text(HEX_USE)
    wall, rss = measure([cxx, "-std=c++17", "-O2", "-c", d / "use.cpp", "-o", d / "use.o"])
    size = (d / "use.o").stat().st_size
    header_size = (d / "hex_embed.h").stat().st_size
    for f in ("use.o", "hex_embed.h"):
        (d / f).unlink()
    return {"gen": gen, "compile": wall, "rss": rss, "obj": size, "header": header_size}


def unpack_hsa(tarball: Path, archs: list[str], dest: Path) -> tuple[Path, int, float]:
    """Extract only ``<top>/aiter_meta/hsa/<arch>/**`` (regular files) of the sdist into ``dest``.

    Returns (dest/aiter_meta/hsa, files written, seconds). Paths are checked; links are skipped.
    """
    t = time.perf_counter()
    hsa = dest / "aiter_meta" / "hsa"
    n = 0
    with tarfile.open(tarball, "r:*") as tar:
        for m in tar:  # streams: one pass over the gzip
            parts = m.name.removeprefix("./").split("/")
            if (
                len(parts) < 5
                or parts[1:3] != ["aiter_meta", "hsa"]
                or parts[3] not in archs
                or not m.isfile()
                or any(x in ("", ".", "..") for x in parts[3:])
            ):
                continue
            target = hsa.joinpath(*parts[3:])
            target.parent.mkdir(parents=True, exist_ok=True)
            src = tar.extractfile(m)
            with open(target, "wb") as out:
                shutil.copyfileobj(src, out, 1 << 20)
            n += 1
    missing = [a for a in archs if not (hsa / a).is_dir()]
    if missing:
        raise SystemExit(f"{tarball}: no aiter_meta/hsa/{'|'.join(missing)}/ in the archive")
    return hsa, n, time.perf_counter() - t


def _default_root() -> str | None:
    cache = os.environ.get("QOLA_TEST_CACHE") or os.path.expanduser("~/.cache/qola-test")
    found = sorted(p for p in glob.glob(os.path.join(cache, "amd_aiter-*")) if os.path.isdir(p))
    return found[-1] if found else None


def _first_line(cmd: list[str]) -> str:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        return (out.stdout or out.stderr).strip().splitlines()[0]
    except (OSError, IndexError, subprocess.SubprocessError):
        return "?"


def host_info(cc: str, cxx: str) -> dict:
    mem = "?"
    try:
        with open("/proc/meminfo") as f:
            kib = next(int(ln.split()[1]) for ln in f if ln.startswith("MemTotal:"))
        mem = f"{kib / 2**20:.0f} GiB"
    except (OSError, StopIteration, ValueError):
        pass
    return {
        "node": platform.node(),
        "cpus": os.cpu_count(),
        "memory": mem,
        "python": platform.python_version(),
        "cc": _first_line([cc, "--version"]),
        "cxx": _first_line([cxx, "--version"]),
        "as": _first_line(["as", "--version"]),
    }


ROW_HEAD = (
    "| approach | code objects | bytes embedded | generate (s) | compile (s) | compile peak RSS (MiB) "
    "| object (MiB) |\n|---|---:|---:|---:|---:|---:|---:|"
)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    src = p.add_mutually_exclusive_group()
    src.add_argument("--aiter-root", help="AITER tree root or its hsa/ dir (default: the test cache's sdist)")
    src.add_argument(
        "--aiter-tarball",
        type=Path,
        help="the amd-aiter sdist (.tar.gz): unpack only aiter_meta/hsa/<arch>/ into a temp dir",
    )
    p.add_argument("--arch", action="append", dest="archs", help="default: gfx942 and gfx950")
    p.add_argument("--subset", type=int, default=0, help="first N code objects for the hex path (0: all)")
    p.add_argument("--skip-hex", action="store_true")
    p.add_argument("--cc", default="cc", help="driver for the .S (GNU as behind it)")
    p.add_argument("--cxx", default="g++")
    p.add_argument("--work-dir", help="parent of the temp dirs (default: the system's temp dir)")
    p.add_argument("--json", help="also write the results here (rewritten after each row)")
    args = p.parse_args(argv)
    archs = args.archs or ["gfx942", "gfx950"]
    if args.aiter_tarball is None and not args.aiter_root:
        args.aiter_root = _default_root()
        if not args.aiter_root:
            p.error("no AITER tree found; pass --aiter-root or --aiter-tarball")
    if args.aiter_tarball is not None and not args.aiter_tarball.is_file():
        p.error(f"--aiter-tarball: no such file: {args.aiter_tarball}")

    info = host_info(args.cc, args.cxx)
    print(
        f"archs {', '.join(archs)}; {info['node']}: {info['cpus']} cpus, {info['memory']}, "
        f"Python {info['python']}\ncc: {info['cc']}\ng++: {info['cxx']}\nas: {info['as']}",
        flush=True,
    )
    result: dict = {"archs": archs, "host": info, "rows": []}

    def row(name: str, bl: list[embed.Blob], r: dict) -> None:
        nbytes = sum(b.size for b in bl)
        print(
            f"| {name} | {len(bl)} | {nbytes:,} | {r['gen']:.2f} | {r['compile']:.2f} | {r['rss']:.0f} "
            f"| {r['obj'] / 2**20:.1f} |",
            flush=True,
        )
        result["rows"].append({"approach": name, "files": len(bl), "bytes": nbytes, **r})
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=1) + "\n")

    with tempfile.TemporaryDirectory(prefix="qola-bench-embed-", dir=args.work_dir) as tmp:
        work = Path(tmp) / "work"
        work.mkdir()
        root = args.aiter_root
        if args.aiter_tarball is not None:
            root, n, secs = unpack_hsa(args.aiter_tarball, archs, Path(tmp) / "tree")
            print(
                f"unpacked {n} files of aiter_meta/hsa/{{{','.join(archs)}}} from {args.aiter_tarball} in {secs:.1f} s",
                flush=True,
            )
            result["tarball"] = {"path": str(args.aiter_tarball), "files": n}
        blobs = embed.collect(root, archs, None)
        subset = blobs[: args.subset] if args.subset else blobs
        print(
            f"{len(blobs)} code objects, {sum(b.size for b in blobs):,} bytes "
            f"({len({b.sha256 for b in blobs})} unique)\n\n{ROW_HEAD}",
            flush=True,
        )
        row("qola .incbin (all)", blobs, run_qola(blobs, work, "full", args.cc))
        if subset is not blobs:
            row("qola .incbin (subset)", subset, run_qola(subset, work, "subset", args.cc))
        if not args.skip_hex:
            print(
                f"(hex: generating and compiling {len(subset)} arrays with {args.cxx} -O2; minutes on the full set)",
                file=sys.stderr,
                flush=True,
            )
            row(
                "hex arrays + unordered_map (subset)" if subset is not blobs else "hex arrays + unordered_map",
                subset,
                run_hex(subset, work, args.cxx),
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
