"""On the real AITER tree (the amd-aiter sdist): AITER's ``mha_fwd_generate.py`` imports ``chip_info``
from ``aiter/jit/utils/`` (``sys.path.insert``), and its ``cpp_extension`` runs ``hipconfig --version``
at import. A change to ``get_gfx_list`` alone reruns that generator (its dispatch loses the gfx950
v3 path, as a fresh build's does) and not CK's ``generate.py``, which never imports it (issue 41:
before, the incremental run kept the old ``mha_fwd.cpp``, rc 0). All the module's generators write one blob dir: only those that imported it rerun, and the one
file they changed is the only one with a new inode or mtime (what ninja recompiles). Generation
only, TE's two-arch shape."""

from __future__ import annotations

import dataclasses
import os
import shutil
from pathlib import Path

import pytest

from qola.compile.codegen import GenJob, GenResult, run_generators
from qola.plan.genrules import aiter_env
from qola.plan.manifest import parse
from qola.plan.planner import PlanInputs, make_plan
from qola.plan.tree.aiter import open_tree

pytestmark = pytest.mark.aiter
ARCHS = ("gfx942", "gfx950")


def test_a_changed_chip_info_reruns_exactly_the_generators_that_imported_it(aiter_root: Path, tmp_path: Path) -> None:
    tree = tmp_path / "tree"  # links to the cached sdist's files; the one file changed is replaced, never written
    shutil.copytree(aiter_root, tree, copy_function=os.link, ignore=shutil.ignore_patterns("__pycache__"))
    manifest = parse(
        '[qola]\nnamespace = "te"\n[build]\narchitectures = ["gfx942", "gfx950"]\nmode = "cpp_itfs"\n'
        '[[modules]]\nname = "libmha_fwd"\nreceipt = 700\ndrop_directions = ["fwd_splitkv", "batch_prefill"]\n',
        "te.toml",
    )
    plan = make_plan(manifest, open_tree(tree), PlanInputs(archs=ARCHS, env={}, hip_version="6.4"))
    gens = plan.modules[0].generators
    ck = next(g for g in gens if g.direction == "fwd")
    given = aiter_env(plan.archs, plan.meta_dir)
    env = {"PATH": os.environ["PATH"], **given}
    narrowed = tuple(dataclasses.replace(g, filter="fmha_fwd_d128_bf16_batch_*") if g is ck else g for g in gens)
    job = GenJob("libmha_fwd", narrowed, env=tuple(given.items()))  # the module's generators, in one blob dir

    def generate() -> GenResult:
        return run_generators(job, tmp_path / "gen", env=env, hsa_dir=Path(plan.meta_dir) / "hsa")

    first = generate()
    assert not first.skipped and len(first.commands) == len(gens) and first.sources
    mha = first.blob_dir / "mha_fwd.cpp"
    before, ids = mha.read_text(), _ids(first.blob_dir)
    assert "gfx950" in before
    assert generate().skipped  # nothing changed: every generator reused
    chip = tree / "aiter" / "jit" / "utils" / "chip_info.py"
    text = chip.read_text()
    changed = text.replace(
        '    return [g.strip() for g in gfx_env.split(";") if g.strip()]',
        '    return [g.strip() for g in gfx_env.split(";") if g.strip() and g.strip() != "gfx950"]',
    )
    assert changed != text
    chip.unlink()  # a hard link to the cache: replace it
    chip.write_text(changed)
    again = generate()
    rerun = again.commands
    assert any("mha_fwd_generate.py" in c for c in rerun)  # the generators that imported it rerun ...
    assert not any(ck.script in c for c in rerun) and any(ck.script in c for c in again.reused)  # ... CK's is reused
    assert mha.read_text() != before and "gfx950" not in mha.read_text()
    now = _ids(first.blob_dir)
    touched = sorted(n for n in now if now[n] != ids.get(n))
    assert touched == ["mha_fwd.cpp"]  # the one file it changed: all that recompiles
    assert generate().skipped


def _ids(blob: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(blob)): (p.stat().st_ino, p.stat().st_mtime_ns) for p in blob.rglob("*") if p.is_file()}
