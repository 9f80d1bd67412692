"""The example kernel tree (examples/kernels): generator, module table, config block,
manifests, code-object script; compiled and run on a GPU where one is present."""

from __future__ import annotations

import ast
import fnmatch
import importlib.util
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python < 3.11
    import tomli as tomllib

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


def gen(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
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


def test_generator_is_executable_with_shebang():
    assert GENERATOR.read_text().startswith("#!/usr/bin/env python3\n")
    assert os.access(GENERATOR, os.X_OK)


@pytest.mark.parametrize("receipt, count", [("0", 48), ("1", 32)])
def test_list_blobs_counts(tmp_path: Path, receipt: str, count: int):
    paths = listed(tmp_path, "--receipt", receipt)
    assert len(paths) == count + 1  # + the api file
    assert all(p.startswith(str(tmp_path / "gen") + "/") and p.endswith(".cu") for p in paths)
    names = names_of(paths)
    expected = ALL_NAMES if receipt == "0" else {n for n in ALL_NAMES if "_fp32_" not in n}
    assert names == expected


def test_list_blobs_without_output_dir_lists_beside_the_file(tmp_path: Path):
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
def test_filter_selects_exactly_the_fnmatching_names(tmp_path: Path, filt: str):
    patterns = [p.strip() for p in filt.split(",")]
    expected = {n for n in ALL_NAMES if any(fnmatch.fnmatch(n, p) for p in patterns)}
    assert names_of(listed(tmp_path, "--filter", filt)) == expected


def test_filter_and_receipt_combine(tmp_path: Path):
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
def test_bad_args_exit_nonzero_with_a_message(tmp_path: Path, args: list[str], message: str):
    r = gen(*args, cwd=tmp_path)
    assert r.returncode != 0
    assert message in r.stderr
    assert not (tmp_path / "x").exists()


def test_generated_files_match_their_names_and_are_stable(tmp_path: Path):
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


def test_module_table_parses_and_points_at_real_files():
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


def test_config_env_block_defines_every_name_the_table_uses():
    src = (KERNELS / "aiter" / "jit" / "core.py").read_text()
    block = src.split("# config_env start here\n", 1)[1].split("# config_env end here", 1)[0]
    defined = {t.id for node in ast.parse(block).body for t in node.targets}
    used = set(re.findall(r"AITER_CONFIG_\w+_FILE", TABLE.read_text()))
    assert used and used <= defined
    for path in re.findall(r'f"\{AITER_ROOT_DIR\}/(aiter/configs/\w+\.csv)"', block):
        assert (KERNELS / path).is_file(), path


@pytest.mark.parametrize("name", ["quickstart.toml", "te-manifest.toml", "te-ckjit-manifest.toml"])
def test_manifests_parse(name: str):
    data = tomllib.loads((EXAMPLES / name).read_text())
    assert data["build"]["architectures"]
    assert all("name" in m for m in data["modules"])
    if name == "quickstart.toml":
        table = json.loads(TABLE.read_text())
        assert all(m["name"] in table for m in data["modules"])


def test_te_ckjit_manifest_is_te_manifest_with_every_ck_kernel_deferred():
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
def test_build_hsa_sm90(tmp_path: Path):
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


def test_build_hsa_rejects_bad_arch(tmp_path: Path):
    r = subprocess.run(
        [sys.executable, str(BUILD_HSA), "--arch", "sm90", "--output", str(tmp_path)], capture_output=True, text=True
    )
    assert r.returncode == 2 and "unknown arch" in r.stderr


@pytest.mark.hip
@pytest.mark.slow
def test_hipcc_compiles_an_instance_and_the_api(tmp_path: Path):
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


# --- GPU: build the pybind modules with nvcc directly and check the numbers -----------------


def _torch_cuda():
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


@pytest.fixture(scope="module")
def built_modules(tmp_path_factory):
    torch = _torch_cuda()
    if torch is None or shutil.which("nvcc") is None:
        pytest.skip("needs torch with CUDA and nvcc")
    import pybind11

    major, minor = torch.cuda.get_device_capability()
    root = tmp_path_factory.mktemp("example_tree")
    gen_dir = root / "gen"
    r = gen("-d", "fwd", "--receipt", "0", "--output_dir", str(gen_dir))
    assert r.returncode == 0, r.stderr
    includes = [
        f"-I{CSRC / 'include'}",
        f"-I{CSRC / 'attn'}",
        f"-I{pybind11.get_include()}",
        f"-I{sysconfig.get_paths()['include']}",
    ]
    base = ["nvcc", "-std=c++17", f"-arch=sm_{major}{minor}", "-O2", "-Xcompiler", "-fPIC", *includes]
    modules = {
        "module_rmsnorm": [CSRC / "kernels" / "rmsnorm.cu", CSRC / "pybind" / "rmsnorm_pybind.cu"],
        "module_softmax": [CSRC / "kernels" / "softmax.cu", CSRC / "pybind" / "softmax_pybind.cu"],
        "module_attn_fwd": [CSRC / "pybind" / "attn_fwd_pybind.cu", *sorted(gen_dir.glob("*.cu"))],
    }
    extra = {"module_rmsnorm": ['-DQK_RMSNORM_TUNED_CSV="/x/rmsnorm_tuned.csv"']}

    def compile_one(job):
        name, src = job
        obj = root / name / (src.stem + ".o")
        obj.parent.mkdir(exist_ok=True)
        cmd = [*base, f"-DTORCH_EXTENSION_NAME={name}", *extra.get(name, []), "-c", str(src), "-o", str(obj)]
        p = subprocess.run(cmd, capture_output=True, text=True)
        assert p.returncode == 0, " ".join(cmd) + "\n" + p.stdout + p.stderr
        return name, obj

    jobs = [(name, src) for name, srcs in modules.items() for src in srcs]
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        objs = list(pool.map(compile_one, jobs))
    loaded = {}
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    for name in modules:
        so = root / f"{name}{suffix}"
        cmd = ["nvcc", "-shared", "-o", str(so), *[str(o) for n, o in objs if n == name]]
        p = subprocess.run(cmd, capture_output=True, text=True)
        assert p.returncode == 0, p.stdout + p.stderr
        spec = importlib.util.spec_from_file_location(name, so)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        loaded[name] = mod
    return torch, loaded


TOL = {"fp32": 2e-5, "fp16": 2e-3, "bf16": 2e-2}
TORCH_DTYPES = ("fp32", "fp16", "bf16")


def _dt(torch, name):
    return {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[name]


@pytest.mark.gpu
@pytest.mark.slow
def test_rmsnorm_and_softmax_on_gpu(built_modules):
    torch, mods = built_modules
    assert mods["module_rmsnorm"].tuned_config() == "/x/rmsnorm_tuned.csv"
    for dtype in TORCH_DTYPES:
        for rows, cols in ((7, 4096), (3, 1000), (1, 1)):
            x = torch.randn(rows, cols, device="cuda", dtype=_dt(torch, dtype))
            w = torch.randn(cols, device="cuda", dtype=_dt(torch, dtype))
            out = torch.empty_like(x)
            mods["module_rmsnorm"].rmsnorm(
                out.data_ptr(),
                x.data_ptr(),
                w.data_ptr(),
                rows,
                cols,
                1e-6,
                dtype,
                128,
                torch.cuda.current_stream().cuda_stream,
            )
            xf = x.float()
            ref = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()
            torch.testing.assert_close(out.float(), ref, atol=TOL[dtype] * 10, rtol=TOL[dtype])
            mods["module_softmax"].softmax(out.data_ptr(), x.data_ptr(), rows, cols, 0.5, dtype)
            torch.cuda.synchronize()
            torch.testing.assert_close(out.float(), torch.softmax(xf * 0.5, -1), atol=TOL[dtype], rtol=TOL[dtype])
    with pytest.raises(RuntimeError, match="dtype=fp8"):
        mods["module_softmax"].softmax(out.data_ptr(), x.data_ptr(), 1, 1, 1.0, "fp8")


def _ref_attn(torch, q, k, v, scale, causal):
    """q [sq, hq, d], k/v [sk, hk, d] -> out [sq, hq, d] fp32, lse [hq, sq]."""
    hq, hk = q.shape[1], k.shape[1]
    k = k.float().repeat_interleave(hq // hk, dim=1)
    v = v.float().repeat_interleave(hq // hk, dim=1)
    s = torch.einsum("qhd,khd->hqk", q.float(), k) * scale
    sq, sk = q.shape[0], k.shape[0]
    if causal:
        i = torch.arange(sq, device=q.device)[:, None]
        j = torch.arange(sk, device=q.device)[None, :]
        s = s.masked_fill(j > i + (sk - sq), float("-inf"))
    lse = torch.logsumexp(s, -1)
    p = torch.softmax(s, -1).nan_to_num(0.0)
    return torch.einsum("hqk,khd->qhd", p, v), lse


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.parametrize("dtype", TORCH_DTYPES)
@pytest.mark.parametrize("hdim", [64, 96, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_attn_fwd_batch_on_gpu(built_modules, dtype, hdim, causal):
    torch, mods = built_modules
    b, sq, sk, hq, hk = 2, 77, 130, 4, 2
    t = _dt(torch, dtype)
    q = torch.randn(b, sq, hq, hdim, device="cuda", dtype=t)
    k = torch.randn(b, sk, hk, hdim, device="cuda", dtype=t)
    v = torch.randn(b, sk, hk, hdim, device="cuda", dtype=t)
    out = torch.empty_like(q)
    lse = torch.empty(b, hq, sq, device="cuda", dtype=torch.float32)
    scale = hdim**-0.5
    mods["module_attn_fwd"].attn_fwd(
        q.data_ptr(),
        k.data_ptr(),
        v.data_ptr(),
        out.data_ptr(),
        b,
        sq,
        sk,
        hq,
        hk,
        hdim,
        scale,
        dtype,
        causal,
        lse.data_ptr(),
    )
    torch.cuda.synchronize()
    for i in range(b):
        ro, rl = _ref_attn(torch, q[i], k[i], v[i], scale, causal)
        torch.testing.assert_close(out[i].float(), ro, atol=TOL[dtype] * 5, rtol=TOL[dtype])
        torch.testing.assert_close(lse[i], rl, atol=1e-3, rtol=1e-4)


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.parametrize("dtype", TORCH_DTYPES)
@pytest.mark.parametrize("causal", [False, True])
def test_attn_fwd_group_on_gpu(built_modules, dtype, causal):
    torch, mods = built_modules
    seqs_q, seqs_k = [5, 70, 1, 130, 40], [5, 100, 3, 130, 20]  # the last: sk < sq, rows see no key
    hq, hk, hdim = 3, 1, 128
    t = _dt(torch, dtype)
    cu_q = torch.tensor([0, *itertools.accumulate(seqs_q)], device="cuda", dtype=torch.int32)
    cu_k = torch.tensor([0, *itertools.accumulate(seqs_k)], device="cuda", dtype=torch.int32)
    q = torch.randn(sum(seqs_q), hq, hdim, device="cuda", dtype=t)
    k = torch.randn(sum(seqs_k), hk, hdim, device="cuda", dtype=t)
    v = torch.randn(sum(seqs_k), hk, hdim, device="cuda", dtype=t)
    out = torch.full_like(q, float("nan"))
    lse = torch.empty(hq, sum(seqs_q), device="cuda", dtype=torch.float32)
    scale = 0.1
    mods["module_attn_fwd"].attn_fwd(
        q.data_ptr(),
        k.data_ptr(),
        v.data_ptr(),
        out.data_ptr(),
        len(seqs_q),
        max(seqs_q),
        0,
        hq,
        hk,
        hdim,
        scale,
        dtype,
        causal,
        lse.data_ptr(),
        cu_q.data_ptr(),
        cu_k.data_ptr(),
    )
    torch.cuda.synchronize()
    for i in range(len(seqs_q)):
        qs, qe = int(cu_q[i]), int(cu_q[i + 1])
        ks, ke = int(cu_k[i]), int(cu_k[i + 1])
        ro, rl = _ref_attn(torch, q[qs:qe], k[ks:ke], v[ks:ke], scale, causal)
        torch.testing.assert_close(out[qs:qe].float(), ro, atol=TOL[dtype] * 5, rtol=TOL[dtype])
        torch.testing.assert_close(lse[:, qs:qe], rl, atol=1e-3, rtol=1e-4)


@pytest.mark.gpu
@pytest.mark.slow
def test_attn_fwd_errors_on_gpu(built_modules):
    torch, mods = built_modules
    x = torch.zeros(1, 1, 1, 256, device="cuda", dtype=torch.float16)
    with pytest.raises(RuntimeError, match="no instance built"):
        mods["module_attn_fwd"].attn_fwd(
            x.data_ptr(), x.data_ptr(), x.data_ptr(), x.data_ptr(), 1, 1, 1, 1, 1, 256, 1.0, "fp16"
        )
    with pytest.raises(ValueError, match="invalid arguments"):
        mods["module_attn_fwd"].attn_fwd(
            x.data_ptr(), x.data_ptr(), x.data_ptr(), x.data_ptr(), 1, 1, 1, 3, 2, 64, 1.0, "fp16"
        )
