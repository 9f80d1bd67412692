"""A kernel tree whose CK-shaped fMHA generator either knows receipt 700 or ignores receipts it does
not know, as CK's ``generate.py`` before rocm-libraries PR #6867 does (issue 31). The generator is
the project's own: it lists kernel names in CK's token layout (``_vr_``/``_vc_``, ``lse``/``nlse``,
``dropout_wg16_storerandval``, …), takes ``-d``, ``--receipt``, ``--filter`` (``@`` per kernel kind),
``--list_blobs`` and ``--output_dir``, and writes one small file per kernel plus the dispatch file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

CK = "3rdparty/composable_kernel/example/ck_tile/01_fmha"

GENERATOR = r"""import argparse, fnmatch, itertools, os
KNOWN = {known}  # the receipts this generator knows (anything else: every kernel but fp32)
DTYPES = ["fp16", "bf16", "fp32"]
HDIMS = [64, 128]
MODES = ["batch", "group"]

SINK = {sink}  # fwd kernels come with and without a softmax sink (``_sink``/``_nsink``)
UPSTREAM_700 = {upstream}  # receipt 700 as upstream CK has it (0003 alone): no sink kernels

def fwd():
    for h, dt, m, v, lg, lse, sk, sq, sn in itertools.product(
            HDIMS, DTYPES, MODES, "rc", "tf", "tf", "tf", "tf", "tf" if SINK else "f"):
        n = lambda f, tok: tok if f == "t" else "n" + tok
        sink = f"_{{n(sn, 'sink')}}" if SINK else ""
        name = (f"fmha_fwd_d{{h}}_{{dt}}_{{m}}_b128x64_qr_v{{v}}_pssk_{{n(lg, 'logits')}}_nbias_nmask_"
                f"{{n(lse, 'lse')}}_ndropout_{{n(sk, 'skip')}}{{sink}}_{{n(sq, 'squant')}}")
        yield 0, name, dict(dtype=dt, vlayout=v, logits=lg, lse=lse, skip=sk, squant=sq, sink=sn)

def bwd():
    for h, dt, m in itertools.product(HDIMS, DTYPES, MODES):
        yield 0, f"fmha_bwd_dot_do_o_d{{h}}_{{dt}}_{{m}}_o1", dict(dtype=dt, dropout="no")
        for det in ("deterministic", "ndeterministic"):
            yield 1, f"fmha_bwd_convert_dq_d{{h}}_{{dt}}_{{m}}_b64_{{det}}", dict(dtype=dt, dropout="no")
            for dr in ("ndropout", "dropout_wg16", "dropout_wg16_storerandval", "dropout_wg32"):
                drop = "no" if dr == "ndropout" else dr
                yield 2, f"fmha_bwd_d{{h}}_{{dt}}_{{m}}_b16_nbias_ndbias_nmask_{{dr}}_{{det}}", dict(dtype=dt, dropout=drop)

def simple(prefixes):
    def kernels():
        for h, dt in itertools.product(HDIMS, DTYPES):
            for k, p in enumerate(prefixes):
                yield k, f"{{p}}_d{{h}}_{{dt}}_batch_nlse", dict(dtype=dt)
    return kernels

DIRS = {{"fwd": fwd, "bwd": bwd, "fwd_splitkv": simple(["fmha_fwd_splitkv_combine", "fmha_fwd_splitkv"]),
        "batch_prefill": simple(["fmha_batch_prefill"])}}

def keep(d, r, o):
    if r == 700 and 700 in KNOWN:
        if d == "fwd":
            return (o["dtype"] != "fp32" and o["vlayout"] == "r" and o["lse"] == "t" and o["skip"] == "f"
                    and o["logits"] == "f" and o["squant"] == "f" and not (UPSTREAM_700 and o["sink"] == "t"))
        if d == "bwd":
            return o["dtype"] != "fp32" and o["dropout"] in ("no", "dropout_wg32", "dropout_wg16")
        return False
    if r == 600 and 600 in KNOWN:
        return o["dtype"] != "fp32" and o.get("vlayout", "r") == "r"
    return o["dtype"] != "fp32"

p = argparse.ArgumentParser()
p.add_argument("-d", "--direction", default="fwd")
p.add_argument("-r", "--receipt", default=0)
p.add_argument("-f", "--filter", default="")
p.add_argument("-l", "--list_blobs")
p.add_argument("-o", "--output_dir")
a = p.parse_args()
pats = a.filter.split("@") if a.filter else []
names = [n for k, n, o in DIRS[a.direction]() if keep(a.direction, int(a.receipt), o)
         and (not pats or fnmatch.fnmatch(n, pats[min(k, len(pats) - 1)]))]
files = [f"{{n}}.cpp" for n in names] + [f"fmha_{{a.direction}}_api.cpp"]
if a.list_blobs:
    with open(a.list_blobs, "a") as f:
        f.write("".join(f"gen/{{x}}\n" for x in files))
else:
    os.makedirs(a.output_dir, exist_ok=True)
    for x in files:
        with open(os.path.join(a.output_dir, x), "w") as f:
            f.write("// fixture\n")
"""


def _cmd(direction: str, receipt: int) -> str:
    return f"f'{{CK_DIR}}/example/ck_tile/01_fmha/generate.py -d {direction} --receipt {receipt} --output_dir {{{{}}}}'"


def _entry(src: str, dirs: list[str], receipt: int = 600) -> dict[str, Any]:
    return {
        "srcs": [f"f'{{AITER_CSRC_DIR}}/cpp_itfs/{src}'"],
        "flags_extra_cc": [],
        "flags_extra_hip": [],
        "extra_ldflags": "None",
        "extra_include": ["f'{CK_DIR}/example/ck_tile/01_fmha'"],
        "verbose": "False",
        "blob_gen_cmd": [_cmd(d, receipt) for d in dirs],
    }


def write_tree(
    root: Path, known: tuple[int, ...], *, sink: bool = False, table_receipt: int = 600, upstream_700: bool = False
) -> Path:
    """The tree at ``root``; its generator knows the receipts ``known`` (() : none, as an old CK).
    ``sink``: fwd kernels also come with a softmax sink (a CK knowing 700 keeps them, as QoLA's
    0011 has it, unless ``upstream_700``: upstream CK's rule, 0003 alone, no sink kernels);
    ``table_receipt``: the receipt the tree's table gives its commands."""
    table = {
        "libmha_fwd": _entry("mha_fwd.cu", ["fwd", "fwd_splitkv", "batch_prefill"], table_receipt),
        "libmha_bwd": _entry("mha_bwd.cu", ["bwd"], table_receipt),
    }
    files = {
        "aiter/jit/optCompilerConfig.json": json.dumps(table, indent=1),
        f"{CK}/generate.py": GENERATOR.format(known=set(known) or "set()", sink=sink, upstream=upstream_700),
        f"{CK}/codegen/ops/__init__.py": "",  # CK's layout: what makes qola treat it as CK's generator
        "csrc/cpp_itfs/mha_fwd.cu": "int fixture_fwd() { return 1; }\n",
        "csrc/cpp_itfs/mha_bwd.cu": "int fixture_bwd() { return 2; }\n",
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def manifest(path: Path, receipt: int | None, extra: str = "") -> Path:
    r = "" if receipt is None else f"receipt = {receipt}\n"
    path.write_text(
        '[qola]\nnamespace = "te"\n[build]\narchitectures = ["gfx942"]\nmode = "pybind"\n'
        f'[[modules]]\nname = "libmha_fwd"\n{r}[[modules]]\nname = "libmha_bwd"\n{r}{extra}'
    )
    return path
