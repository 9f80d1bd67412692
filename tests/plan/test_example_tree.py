"""The example kernel tree (examples/kernels): generator, module table, config block,
manifests, code-object script (its kernels on a GPU: tests/compile/test_gpu_example_tree.py)."""

from __future__ import annotations

import ast
import fnmatch
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from qola.core import tomlfile

KERNELS = Path(__file__).resolve().parents[2] / "examples" / "kernels"
EXAMPLES = KERNELS.parent
CSRC = KERNELS / "csrc"
GENERATOR = CSRC / "attn" / "generate.py"
BUILD_HSA = KERNELS / "scripts" / "build_hsa.py"
TABLE = KERNELS / "aiter" / "jit" / "optCompilerConfig.json"

# The instance grammar, written out independently of the generator.
TILES = {64: "b64x64", 128: "b64x32"}
ALL_NAMES = {
    f"attn_fwd_d{h}_{dt}_{mode}_{TILES[h]}_{mask}_{lse}"
    for dt, h, mode, mask, lse in itertools.product(
        ("fp16", "bf16", "fp32"), (64, 128), ("batch", "group"), ("mask", "nmask"), ("lse", "nlse")
    )
}


def gen(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(GENERATOR), *args], capture_output=True, text=True, cwd=cwd)


def listed(tmp_path: Path, *args: str) -> list[str]:
    out = tmp_path / "blobs.txt"
    r = gen("-d", "fwd", "--list_blobs", str(out), "--output_dir", str(tmp_path / "gen"), *args)
    assert r.returncode == 0, r.stderr
    return out.read_text().splitlines()


def names_of(paths: list[str]) -> set[str]:
    assert paths[-1].endswith("/attn_fwd_api.cu")
    return {Path(p).stem for p in paths[:-1]}


# --- generator -------------------------------------------------------------------------


def test_generator_is_executable_with_shebang() -> None:
    assert GENERATOR.read_text().startswith("#!/usr/bin/env python3\n")
    assert os.access(GENERATOR, os.X_OK)


@pytest.mark.parametrize("receipt, count", [("0", 48), ("1", 32)])
def test_list_blobs_counts(tmp_path: Path, receipt: str, count: int) -> None:
    paths = listed(tmp_path, "--receipt", receipt)
    assert len(paths) == count + 1  # + the api file
    assert all(p.startswith(str(tmp_path / "gen") + "/") and p.endswith(".cu") for p in paths)
    names = names_of(paths)
    expected = ALL_NAMES if receipt == "0" else {n for n in ALL_NAMES if "_fp32_" not in n}
    assert names == expected


def test_list_blobs_without_output_dir_lists_beside_the_file(tmp_path: Path) -> None:
    out = tmp_path / "sub" / "blobs.txt"
    r = gen("-l", str(out), "-f", "*_d64_fp16_batch_*")
    assert r.returncode == 0, r.stderr
    lines = out.read_text().splitlines()
    assert len(lines) == 5 and all(Path(p).parent == out.parent for p in lines)


@pytest.mark.parametrize(
    "filt",
    [
        "*_bf16_*",
        "*_nmask_lse",
        "*d64*,*fp32*",
        "attn_fwd_d128_*_group_*",
        "*mask*",
        "*_mask_*",
        "*_fp16_batch_b64x64_nmask_nlse, *_bf16_group_*_mask_lse",
        "no_such_instance*",
    ],
)
def test_filter_selects_exactly_the_fnmatching_names(tmp_path: Path, filt: str) -> None:
    patterns = [p.strip() for p in filt.split(",")]
    expected = {n for n in ALL_NAMES if any(fnmatch.fnmatch(n, p) for p in patterns)}
    assert names_of(listed(tmp_path, "--filter", filt)) == expected


def test_filter_and_receipt_combine(tmp_path: Path) -> None:
    expected = {n for n in ALL_NAMES if fnmatch.fnmatch(n, "*_d64_*") and "_fp32_" not in n}
    assert names_of(listed(tmp_path, "-r", "1", "-f", "*_d64_*")) == expected


@pytest.mark.parametrize(
    "args, message",
    [
        (["-d", "bwd", "-o", "x"], "unknown direction"),
        (["-r", "7", "-o", "x"], "unknown receipt"),
        (["-r", "one", "-o", "x"], "must be an integer"),
        (["-d", "fwd"], "--output_dir"),
        (["-o", "x", "--bogus"], "unrecognized arguments"),
    ],
)
def test_bad_args_exit_nonzero_with_a_message(tmp_path: Path, args: list[str], message: str) -> None:
    r = gen(*args, cwd=tmp_path)
    assert r.returncode != 0
    assert message in r.stderr
    assert not (tmp_path / "x").exists()


def test_generated_files_match_their_names_and_are_stable(tmp_path: Path) -> None:
    out = tmp_path / "gen"
    r = gen("-d", "fwd", "-o", str(out), "-f", "*_d128_*", "-r", "0")
    assert r.returncode == 0, r.stderr
    files = sorted(out.iterdir())
    assert len(files) == 24 + 1
    tokens = {"batch": "false", "group": "true", "mask": "true", "nmask": "false", "lse": "true", "nlse": "false"}
    api = (out / "attn_fwd_api.cu").read_text()
    assert "float attn_fwd(attn_fwd_traits t, attn_fwd_args a, qkStream_t s)" in api
    assert api.count("return attn_fwd_<") == 24 and "return ATTN_FWD_NO_INSTANCE;" in api
    for f in files:
        if f.name == "attn_fwd_api.cu":
            continue
        m = re.fullmatch(r"attn_fwd_d(\d+)_(\w+?)_(batch|group)_b(\d+)x(\d+)_(n?mask)_(n?lse)\.cu", f.name)
        assert m, f.name
        hdim, dtype, mode, bm, bn, mask, lse = m.groups()
        traits = f"attn_fwd_traits_<{hdim}, {dtype}_t, {tokens[mode]}, {bm}, {bn}, {tokens[mask]}, {tokens[lse]}>"
        text = f.read_text()
        assert f"template <>\nfloat attn_fwd_<{traits}>(const attn_fwd_args& a, qkStream_t s)" in text
        assert f"float attn_fwd_<{traits}>(const attn_fwd_args&, qkStream_t);" in api  # declared there
        assert f"return attn_fwd_<{traits}>(a, s);" in api
    mtimes = {f: f.stat().st_mtime_ns for f in files}
    assert gen("-o", str(out), "-f", "*_d128_*").returncode == 0
    assert {f: f.stat().st_mtime_ns for f in files} == mtimes  # unchanged content is not rewritten


# --- module table, config block, manifests ---------------------------------------------


def test_module_table_parses_and_points_at_real_files() -> None:
    table = json.loads(TABLE.read_text())
    assert {"module_rmsnorm", "module_softmax", "module_attn_fwd", "libattn_fwd"} <= set(table)
    for name, entry in table.items():
        assert all(isinstance(v, (str, list)) for v in entry.values()), name
        for src in entry["srcs"]:
            m = re.fullmatch(r"f'\{AITER_CSRC_DIR\}/(.+)'", src)
            assert m and (CSRC / m.group(1)).is_file(), (name, src)
        cmds = entry["blob_gen_cmd"] if isinstance(entry["blob_gen_cmd"], list) else [entry["blob_gen_cmd"]]
        for cmd in cmds:
            m = re.match(r"f'\{AITER_CSRC_DIR\}/(\S+) ", cmd)
            assert cmd == "''" or (m and (CSRC / m.group(1)).is_file()), (name, cmd)
    lib = table["libattn_fwd"]
    assert lib["srcs"] == [] and lib["is_python_module"] == "False" and lib["torch_exclude"] == "True"
    assert "--receipt 0 --output_dir {{}}" in lib["blob_gen_cmd"][0]
    for key in ("module_rmsnorm", "module_softmax", "module_attn_fwd"):
        pybind = [s for s in table[key]["srcs"] if "/pybind/" in s]
        assert (
            pybind
            and "PYBIND11_MODULE(TORCH_EXTENSION_NAME, m)"
            in (CSRC / "pybind" / Path(pybind[0].rstrip("'")).name).read_text()
        )


def test_config_env_block_defines_every_name_the_table_uses() -> None:
    src = (KERNELS / "aiter" / "jit" / "core.py").read_text()
    block = src.split("# config_env start here\n", 1)[1].split("# config_env end here", 1)[0]
    body = ast.parse(block).body
    assert all(isinstance(node, ast.Assign) and all(isinstance(t, ast.Name) for t in node.targets) for node in body)
    defined = {t.id for node in body if isinstance(node, ast.Assign) for t in node.targets if isinstance(t, ast.Name)}
    used = set(re.findall(r"AITER_CONFIG_\w+_FILE", TABLE.read_text()))
    assert used and used <= defined
    for path in re.findall(r'f"\{AITER_ROOT_DIR\}/(aiter/configs/\w+\.csv)"', block):
        assert (KERNELS / path).is_file(), path


@pytest.mark.parametrize("name", ["quickstart.toml", "te-manifest.toml", "te-ckjit-manifest.toml"])
def test_manifests_parse(name: str) -> None:
    data = tomlfile.loads((EXAMPLES / name).read_text())
    assert data["build"]["architectures"]
    assert all("name" in m for m in data["modules"])
    if name == "quickstart.toml":
        table = json.loads(TABLE.read_text())
        assert all(m["name"] in table for m in data["modules"])


def test_te_ckjit_manifest_is_te_manifest_with_every_ck_kernel_deferred() -> None:
    """examples/te-ckjit-manifest.toml (TE's CK_JIT mode, docs/coming-from-qola.md) is TE's manifest
    and a [jit] over both modules with nothing ahead: the two cannot drift apart."""
    from qola.plan import manifest as mf

    te, ck = mf.load(EXAMPLES / "te-manifest.toml"), mf.load(EXAMPLES / "te-ckjit-manifest.toml")
    same = {"path", "sha256", "jit"}  # where each was read from, and the one difference
    assert ck.model_dump(exclude=same) == te.model_dump(exclude=same) and te.jit is None
    assert ck.jit is not None and ck.jit.enabled and ck.jit.compiler is None
    assert sorted(ck.jit.modules or []) == sorted(m.name for m in te.modules) == ["libmha_bwd", "libmha_fwd"]
    assert ck.jit.aot == mf.JitAot()  # nothing ahead but the dispatch, AITER's own sources and the asm v3


# --- code objects ------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_build_hsa_sm90(tmp_path: Path) -> None:
    cmd = [sys.executable, str(BUILD_HSA), "--arch", "sm_90", "--output", str(tmp_path)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    cos = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.co"))
    assert cos == [
        "sm_90/vec_add/vec_add_bf16.co",
        "sm_90/vec_add/vec_add_fp16.co",
        "sm_90/vec_add/vec_add_fp32.co",
        "sm_90/vec_scale/vec_scale_fp32.co",
        "sm_90/vec_scale/vec_scale_fp32x4.co",
    ]
    for co in tmp_path.rglob("*.co"):
        assert co.read_bytes()[:4] == b"\x7fELF"  # a cubin
    rows = (tmp_path / "sm_90" / "vec_scale" / "vec_scale.csv").read_text().splitlines()
    assert rows == [
        "dtype,vec,knl_name,co_name",
        "fp32,1,vec_scale_fp32,vec_scale_fp32.co",
        "fp32,4,vec_scale_fp32x4,vec_scale_fp32x4.co",
    ]
    again = subprocess.run(cmd, capture_output=True, text=True)
    assert again.returncode == 0 and "built" not in again.stdout  # up to date: nothing rebuilt


def test_build_hsa_rejects_bad_arch(tmp_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, str(BUILD_HSA), "--arch", "sm90", "--output", str(tmp_path)], capture_output=True, text=True
    )
    assert r.returncode == 2 and "unknown arch" in r.stderr


@pytest.mark.hip
@pytest.mark.slow
def test_hipcc_compiles_an_instance_and_the_api(tmp_path: Path) -> None:
    r = gen("-o", str(tmp_path), "-f", "attn_fwd_d64_bf16_group_*_mask_lse")
    assert r.returncode == 0, r.stderr
    env = dict(os.environ, HIP_PLATFORM="amd")
    for src in sorted(tmp_path.glob("*.cu")):
        cmd = [
            "hipcc",
            "-std=c++17",
            "--offload-arch=gfx90a",
            f"-I{CSRC / 'include'}",
            f"-I{CSRC / 'attn'}",
            "-c",
            str(src),
            "-o",
            str(src.with_suffix(".o")),
        ]
        p = subprocess.run(cmd, capture_output=True, text=True, env=env)
        assert p.returncode == 0, p.stdout + p.stderr
