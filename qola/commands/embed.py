"""``qola embed``: code objects → ``qola_embedded_<module>.{S,h,json}``."""

from __future__ import annotations

import argparse

from qola.hooks import embed


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "embed",
        help="embed hsa code objects: one .S of .incbin + a lookup header",
        description="Write qola_embedded_<module>.S (.incbin of every hsa/<arch>/<type>/**/*.co, "
        "deduplicated, plus a sorted index), qola_embedded_<module>.h (C lookup and "
        "AITER_EMBEDDED_HSA_MAP) and qola_embedded_<module>.json (the index). "
        "Assemble the .S with the host compiler: cc -c -x assembler qola_embedded_<module>.S "
        "(add -Wa,--MD,FILE for a depfile naming every embedded file).",
    )
    p.add_argument(
        "--hsa-dir",
        required=True,
        metavar="DIR",
        help="the hsa/ directory, or a tree root holding hsa/ or aiter_meta/hsa/",
    )
    p.add_argument(
        "--arch",
        action="append",
        required=True,
        metavar="ARCH",
        dest="archs",
        help="target architecture (repeatable), e.g. gfx942",
    )
    types = p.add_mutually_exclusive_group(required=True)
    types.add_argument(
        "--subdirs",
        nargs="+",
        metavar="TYPE",
        help="kernel types: directories under hsa/<arch>/ (searched recursively)",
    )
    types.add_argument("--all-types", action="store_true", help="every code object under hsa/<arch>/")
    p.add_argument("--output-dir", required=True, metavar="DIR")
    p.add_argument("--namespace", default="qola", help="C/C++ namespace prefix (default: qola)")
    p.add_argument("--module", default="asm", help="module name used in file and symbol names (default: asm)")
    p.add_argument(
        "--align",
        type=int,
        default=embed.ALIGN,
        help=f"byte alignment of every blob, a power of two (default: {embed.ALIGN})",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    embed.check_names(args.namespace, args.module, args.align)
    blobs = embed.collect(args.hsa_dir, args.archs, None if args.all_types else args.subdirs)
    sources = embed.render(blobs, args.namespace, args.module, args.align)
    files = embed.write(sources, args.output_dir)
    idx = sources.index
    print(f"embedded {idx['keys']} code objects ({idx['unique']} unique, {idx['bytes']} bytes)")
    for path in (files.asm, files.header, files.index):
        print(f"  {path}")
    return 0
