"""Helpers shared by test files (first written in test_variants.py)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from support.common import KERNELS

GEN = KERNELS / "csrc" / "attn" / "generate.py"


NAME_RE = re.compile(
    r"^attn_fwd_d(?P<hdim>\d+)_(?P<dtype>\w+?)_(?P<mode>batch|group)_b\d+x\d+_(?P<mask>n?mask)_(?P<lse>n?lse)$"
)


TOKENS = 'tokens = {mask = {true = "mask", false = "nmask"}, lse = {true = "lse", false = "nlse"}}'


EXAMPLE_VARIANTS = f"""
[[variants]]
module = "module_attn_fwd"
generator = "attn/generate.py"
pattern = "attn_fwd_d{{hdim}}_{{dtype}}_*_{{mask}}_{{lse}}"
options = {{dtype = "fp16", hdim = 128, mask = true}}
{TOKENS}

[[variants]]
module = "module_attn_fwd"
pattern = "attn_fwd_d{{hdim}}_{{dtype}}_*_{{mask}}_{{lse}}"
options = {{dtype = "bf16", lse = false}}
{TOKENS}
"""


def list_example(filt: str | None = None) -> set[str]:
    out = Path(os.environ.get("TMPDIR", "/tmp")) / f"qola-test-list-{os.getpid()}.txt"
    cmd = [sys.executable, str(GEN), "-d", "fwd", "--receipt", "0", "--list_blobs", str(out)]
    subprocess.run(cmd + (["--filter", filt] if filt else []), check=True)
    names = {Path(line).stem for line in out.read_text().split()}
    out.unlink()
    return names - {"attn_fwd_api"}


def expected_example() -> set[str]:
    """Computed independently: parse every unfiltered name and keep those the two variants declare."""
    keep = set()
    for name in list_example():
        m = NAME_RE.match(name)
        assert m, name
        d = m.groupdict()
        if (d["dtype"] == "fp16" and d["hdim"] == "128" and d["mask"] == "mask") or (
            d["dtype"] == "bf16" and d["lse"] == "nlse"
        ):
            keep.add(name)
    return keep
