"""A small tree with a CK-style fMHA generator (``generate.py`` beside ``codegen/ops``, as qola's
``genrules.flavor_of`` recognises CK's): one kernel file per kernel and arch family
(``…_gfx9``, ``…_gfx950``, CK's names and guards) plus the dispatch ``fmha_<direction>_api.cpp``; and
an API source that calls the directions it is told to (AITER's ``mha_fwd.cpp`` calls every one).
The generator appends each invocation's argv to the file named by ``$CK_GEN_CALLS`` when set."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from support.common import KERNELS

GENERATE = r"""
import argparse, fnmatch, json, os, pathlib, sys

if os.environ.get("CK_GEN_CALLS"):
    with open(os.environ["CK_GEN_CALLS"], "a") as fh:
        fh.write(json.dumps(sys.argv[1:]) + "\n")
p = argparse.ArgumentParser()
p.add_argument("-d", "--direction", default="fwd")
p.add_argument("-o", "--output_dir")
p.add_argument("-l", "--list_blobs")
p.add_argument("-f", "--filter", default="")
p.add_argument("-r", "--receipt", default="0")
p.add_argument("--targets", default="gfx9,gfx950")
a = p.parse_args()
GUARD = {"gfx9": "defined(__gfx9__) && !defined(__gfx950__)", "gfx950": "defined(__gfx950__)"}
fams = list(dict.fromkeys("gfx950" if t == "gfx950" else "gfx9" for t in a.targets.split(",") if t))
names = [f"fmha_{a.direction}_d{h}_fp16" for h in (64, 128)]
if a.filter:
    names = [n for n in names if any(fnmatch.fnmatch(n, pat) for pat in a.filter.split("@"))]
files = {}
for n in names:
    for f in fams:
        files[f"{n}_{f}.cpp"] = (
            f"#if !defined(__HIP_DEVICE_COMPILE__) || ({GUARD[f]})\n"
            f"float {n}_{f}_run(int x) {{ return (float)x; }}\n#endif\n"
        )
calls = "".join(f"float {n}_{f}_run(int);\n" for n in names for f in fams)
body = " + ".join(f"{n}_{fams[0]}_run(x)" for n in names) or "-1"
files[f"fmha_{a.direction}_api.cpp"] = f"{calls}float fmha_{a.direction}(int x) {{ return {body}; }}\n"
if a.list_blobs:
    pathlib.Path(a.list_blobs).write_text("".join(f"{a.output_dir or '.'}/{k}\n" for k in files))
    sys.exit(0)
out = pathlib.Path(a.output_dir)
out.mkdir(parents=True, exist_ok=True)
for k, v in files.items():
    (out / k).write_text(v)
"""

CK_DIR = "3rdparty/ck/example/ck_tile/01_fmha"

# an AITER-style asm API generator: one file per arch it has kernels for, named for that exact arch
ASM_GEN = r"""
import argparse, pathlib
p = argparse.ArgumentParser()
p.add_argument("--output_dir")
a = p.parse_args()
out = pathlib.Path(a.output_dir)
out.mkdir(parents=True, exist_ok=True)
(out / "asm_fmha_fwd_v3_gfx942.cpp").write_text("float asm_fmha_fwd_v3_gfx942(int x) { return (float)x; }\n")
"""


def api_source(calls: tuple[str, ...]) -> str:
    """AITER's API source as a test wants it: it calls the dispatch of each direction in ``calls``
    from ``qk_mha_api`` (a C entry point of namespace ``qk``: exported)."""
    decls = "".join(f"float fmha_{d}(int);\n" for d in calls)
    body = " + ".join(f"fmha_{d}(x)" for d in calls) or "0"
    return f'{decls}extern "C" __attribute__((visibility("default"))) float qk_mha_api(int x) {{ return {body}; }}\n'


def ck_tree(root: Path, calls: tuple[str, ...] = ("fwd", "fwd_splitkv", "batch_prefill")) -> Path:
    """A copy of the example tree with the CK-style generator under ``3rdparty/ck`` and
    ``csrc/api/mha_api.cu`` calling the directions in ``calls``."""
    shutil.copytree(KERNELS, root, ignore=shutil.ignore_patterns("hsa", "__pycache__"))
    ck = root / CK_DIR
    (ck / "codegen" / "ops").mkdir(parents=True)
    (ck / "codegen" / "ops" / "__init__.py").write_text("")
    (ck / "generate.py").write_text(GENERATE)
    (root / "csrc" / "asm_gen.py").write_text(ASM_GEN)
    (root / "csrc" / "api").mkdir()
    (root / "csrc" / "api" / "mha_api.cu").write_text(api_source(calls))
    return root


def module(
    drop: tuple[str, ...] = (),
    directions: tuple[str, ...] = ("fwd", "fwd_splitkv", "batch_prefill"),
    srcs: tuple[str, ...] = ("csrc/api/mha_api.cu",),
    asm: bool = False,
) -> str:
    """A manifest's ``[[modules]]`` entry for ``libmha_ck``: ``srcs`` (the API source) and one generator
    command per direction, ``drop`` dropped (``asm``: and the asm generator, writing a ``_gfx942`` file)."""
    cmds = ", ".join(f'"{CK_DIR}/generate.py -d {d} --output_dir {{}}"' for d in directions)
    cmds += ', "csrc/asm_gen.py --output_dir {}"' if asm else ""
    body = f'\n[[modules]]\nname = "libmha_ck"\nsrcs = {json.dumps(list(srcs))}\nis_python_module = false\n'
    body += f"blob_gen_cmd = [{cmds}]\n"
    return body + (f"drop_directions = {json.dumps(list(drop))}\n" if drop else "")
