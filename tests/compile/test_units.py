"""Which units a library compiles, and for which archs (issue 34): each generated CK file only for
the build archs it holds device code for (its ``…_gfx9`` / ``…_gfx950`` name), a dispatch or API
file for all; a direction the manifest drops brings no dispatch-only unit unless code that stays
calls it. Checked on the graph a dry run writes (a fake hipcc: no ROCm needed)."""

from __future__ import annotations

import os
from pathlib import Path

from support.ck_tree import ck_tree, module
from support.fake_hipcc import fake_hipcc

from qola.pipeline import run as pipeline
from qola.pipeline.run import BuildSpec
from qola.plan import genrules


def dry_run(tmp: Path, archs: list[str], body: str, tree: Path | None = None) -> dict[str, dict[str, str]]:
    """``qola build --dry-run`` of ``body``'s modules on the CK-style tree; each compile edge of
    build.ninja: source file name -> its bindings (flags, archs, module)."""
    tree = tree or ck_tree(tmp / "tree")
    hipcc = fake_hipcc(tmp / "bin" / "hipcc")
    m = tmp / "q.toml"
    m.write_text(f'[qola]\nnamespace = "qk"\n[build]\narchitectures = {archs!r}\nmode = "cpp_itfs"\n'.replace("'", '"'))
    m.write_text(m.read_text() + body)
    spec = BuildSpec(
        manifest=str(m), aiter_root=str(tree), output_dir=str(tmp / "out"), jobs=1, dry_run=True,
        env={**os.environ, "HIPCC": str(hipcc)},
    )  # fmt: skip
    report = pipeline.build(spec)
    assert report.ok, [(r.name, r.error) for r in report.modules]
    return edges((tmp / "out.build" / "build.ninja").read_text())


def edges(text: str) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    current: dict[str, str] | None = None
    for line in text.splitlines():
        if line.startswith("build ") and ": cc " in line:
            src = line.split(": cc ", 1)[1].split(" | ")[0]
            current = out[Path(src).name] = {}
        elif line.startswith("  ") and current is not None:
            key, _, value = line.strip().partition(" = ")
            current[key] = value
        else:
            current = None
    out["rule cc"] = {"command": text.split("rule cc\n  command = ", 1)[1].split("\n", 1)[0]}
    flags = [ln for ln in text.splitlines() if ln.startswith("flags_libmha_ck = ")]
    out["flags_libmha_ck"] = {"value": flags[0] if flags else ""}
    return out


def test_each_generated_file_compiles_for_its_archs(tmp_path):
    """A two-arch build: a ``_gfx9`` kernel file gets no gfx950 pass, a ``_gfx950`` one no gfx942 pass;
    the dispatch and the API source get both. The passes are the edge's own ``$archs`` (the module's
    flags name none), on the compile line within its flags, before ``-x hip -c $in -o $out``."""
    g = dry_run(tmp_path, ["gfx942", "gfx950"], module())
    both = "--offload-arch=gfx942 --offload-arch=gfx950"
    assert g["fmha_fwd_d64_fp16_gfx9.cpp"]["archs"] == "--offload-arch=gfx942"
    assert g["fmha_fwd_d128_fp16_gfx950.cpp"]["archs"] == "--offload-arch=gfx950"
    assert g["fmha_fwd_api.cpp"]["archs"] == both and g["mha_api.cu"]["archs"] == both
    kernels = [name for name in g if name.endswith(("_gfx9.cpp", "_gfx950.cpp"))]
    assert len(kernels) == 12 and all("," not in g[k]["archs"] and " " not in g[k]["archs"] for k in kernels)
    assert "--offload-arch" not in g["flags_libmha_ck"]["value"] and g["flags_libmha_ck"]["value"]
    cmd = g["rule cc"]["command"]
    assert " $flags $archs " in cmd and cmd.index("$archs") < cmd.index("-x hip -c $in -o $out")


def test_a_single_arch_build_compiles_every_file_for_it(tmp_path):
    """gfx942 alone: the generator is told ``--targets=gfx942`` (it writes no ``_gfx950`` twin) and
    every edge, the dispatch included, has the one pass."""
    g = dry_run(tmp_path, ["gfx942"], module())
    units = {k: v for k, v in g.items() if "archs" in v}
    assert units and not [k for k in units if k.endswith("_gfx950.cpp")]
    assert {v["archs"] for v in units.values()} == {"--offload-arch=gfx942"}


def test_source_archs_keeps_feature_suffixes_and_every_arch_for_a_file_serving_none():
    srcs = ["/g/fmha_fwd_d64_gfx9.cpp", "/g/fmha_fwd_d64_gfx950.cpp", "/g/fmha_fwd_api.cpp"]
    assert genrules.source_archs(srcs, ("gfx942:xnack-", "gfx950")) == {
        "/g/fmha_fwd_d64_gfx9.cpp": ("gfx942:xnack-",),
        "/g/fmha_fwd_d64_gfx950.cpp": ("gfx950",),
        "/g/fmha_fwd_api.cpp": ("gfx942:xnack-", "gfx950"),
    }
    # a gfx950 twin in a gfx90a build holds no code for it, but its host code links: compiled as before
    assert genrules.source_archs(srcs[1:2], ("gfx90a",)) == {"/g/fmha_fwd_d64_gfx950.cpp": ("gfx90a",)}
