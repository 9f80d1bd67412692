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
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from qola import embed

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


def hex_header(blobs: list[embed.Blob]) -> str:
    """The hex-array approach: one array per file, then a map over them."""
    lines = ["#pragma once", "#include <string>", "#include <string_view>", "#include <unordered_map>",
             "namespace hex_hsa {"]
    names = []
    for b in blobs:
        name = "data_" + re.sub(r"\W", "_", b.key)
        names.append((b.key, name, b.size))
        data = b.path.read_bytes()
        body = ",\n".join(",".join(f"0x{x:02x}" for x in data[i:i + 16]) for i in range(0, len(data), 16))
        lines.append(f"alignas(4096) inline const unsigned char {name}[] = {{\n{body}\n}};")
    lines.append("inline const std::unordered_map<std::string, std::string_view> embedded_hsa_map = {")
    lines += [f'    {{"{k}", std::string_view(reinterpret_cast<const char*>({n}), {s})}},' for k, n, s in names]
    lines += ["};", "}  // namespace hex_hsa", ""]
    return "\n".join(lines)


HEX_USE = """#include "hex_embed.h"
const void* hex_find(const std::string& key, size_t* size)
{
    auto it = hex_hsa::embedded_hsa_map.find(key);
    if(it == hex_hsa::embedded_hsa_map.end()) return nullptr;
    *size = it->second.size();
    return it->second.data();
}
"""


def run_qola(blobs: list[embed.Blob], work: Path, tag: str) -> dict:
    t = time.perf_counter()
    # hashing (dedupe) is part of qola's generator: redo it, as collect() would
    blobs = [embed.Blob(b.key, b.path, b.size, embed.sha256_file(b.path)) for b in blobs]
    files = embed.write(embed.render(blobs, "bench", tag), work / tag)
    gen = time.perf_counter() - t
    obj = work / tag / f"{tag}.o"
    wall, rss = measure(embed.assemble_command(files.asm, obj))
    size = obj.stat().st_size
    obj.unlink()
    return {"gen": gen, "compile": wall, "rss": rss, "obj": size}


def run_hex(blobs: list[embed.Blob], work: Path, cxx: str) -> dict:
    d = work / "hex"
    d.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    (d / "hex_embed.h").write_text(hex_header(blobs))
    gen = time.perf_counter() - t
    (d / "use.cpp").write_text(HEX_USE)
    wall, rss = measure([cxx, "-std=c++17", "-O2", "-c", d / "use.cpp", "-o", d / "use.o"])
    size = (d / "use.o").stat().st_size
    header_size = (d / "hex_embed.h").stat().st_size
    for f in ("use.o", "hex_embed.h"):
        (d / f).unlink()
    return {"gen": gen, "compile": wall, "rss": rss, "obj": size, "header": header_size}


def _default_root() -> str | None:
    cache = os.environ.get("QOLA_TEST_CACHE") or os.path.expanduser("~/.cache/qola-test")
    found = sorted(p for p in glob.glob(os.path.join(cache, "amd_aiter-*")) if os.path.isdir(p))
    return found[-1] if found else None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--aiter-root", default=_default_root(), help="AITER tree root or its hsa/ dir")
    p.add_argument("--arch", action="append", dest="archs", help="default: gfx942 and gfx950")
    p.add_argument("--subset", type=int, default=0, help="first N code objects for the hex path (0: all)")
    p.add_argument("--skip-hex", action="store_true")
    p.add_argument("--cxx", default="g++")
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args(argv)
    if not args.aiter_root:
        p.error("no AITER tree found; pass --aiter-root")
    archs = args.archs or ["gfx942", "gfx950"]

    blobs = embed.collect(args.aiter_root, archs, None)
    subset = blobs[: args.subset] if args.subset else blobs
    rows = []
    with tempfile.TemporaryDirectory(prefix="qola-bench-embed-") as tmp:
        work = Path(tmp)
        rows.append(("qola .incbin (all)", blobs, run_qola(blobs, work, "full")))
        if subset is not blobs:
            rows.append(("qola .incbin (subset)", subset, run_qola(subset, work, "subset")))
        if not args.skip_hex:
            rows.append(("hex arrays + unordered_map (subset)" if subset is not blobs else "hex arrays + unordered_map",
                         subset, run_hex(subset, work, args.cxx)))

    print(f"archs {', '.join(archs)}; {platform.node()} {os.cpu_count()} cpus; "
          f"cc/g++: {subprocess.run([args.cxx, '-dumpfullversion'], capture_output=True, text=True).stdout.strip()}")
    print("\n| approach | code objects | bytes embedded | generate (s) | compile (s) | compile peak RSS (MiB) | object (MiB) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    result = []
    for name, bl, r in rows:
        nbytes = sum(b.size for b in bl)
        print(f"| {name} | {len(bl)} | {nbytes:,} | {r['gen']:.2f} | {r['compile']:.2f} | {r['rss']:.0f} | {r['obj'] / 2**20:.1f} |")
        result.append({"approach": name, "files": len(bl), "bytes": nbytes, **r})
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
