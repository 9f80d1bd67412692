"""CUDA: find nvcc, read its version and toolkit layout, build the flag set."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence

from qola.core.errors import QolaError
from qola.toolchain.archs import cuda_base_code, cuda_gencode
from qola.toolchain.base import Toolchain
from qola.toolchain.env import ToolchainEnv
from qola.toolchain.host import (
    Env,
    executable,
    find_host_cxx,
    first_executable,
    identity_of,
    run_capture,
    run_checked,
    which,
)
from qola.toolchain.probe import Probes
from qola.toolchain.versions import check_accepted, parse_nvcc_version

FALLBACKS = ("/usr/local/cuda/bin/nvcc",)
INSTALL_HINT = (
    "install the CUDA toolkit (nvcc), e.g. from developer.nvidia.com/cuda-downloads or "
    "`apt-get install cuda-toolkit`; or point qola at one: CUDACXX=/path/to/nvcc or CUDA_HOME=/path/to/cuda"
)
# -std=c++17 -O3, position-independent host code, constexpr host functions usable in
# device code, hidden visibility (only what the version script exports leaves a .so).
BASE = (
    "-std=c++17", "-O3", "-Xcompiler", "-fPIC", "--expt-relaxed-constexpr", "-DUSE_CUDA=1",
    "-Xcompiler", "-fvisibility=hidden", "-Xcompiler", "-fvisibility-inlines-hidden",
)  # fmt: skip
# cudafe++ and cicc name the unit's anonymous namespace and module id after the CRC32 of
# --orig_src_path_name, which nvcc sets to the source's absolute path; given again, the later one
# wins, in both (they must agree: the host stub registers the device kernel by that name)
UNIT_FLAGS = ("-Xcudafe", "--orig_src_path_name={name}", "-Xcicc", "--orig_src_path_name={name}")
RUNTIME = ("-lcudart_static", "-ldl", "-lrt", "-lpthread")
# What each compile edge names right before ``-c`` (its ``$archs``): a unit with device code goes
# through nvcc's device passes (``-x cu``); one without (qola.compile.devicescan) goes to the host
# compiler with CUDA's include dirs (``-x c++``: :func:`host_only`).
DEVICE_PASSES = ("-x", "cu")
# what would declare a kernel or device data, put in sections of qola's own in a host-only object
# (qola.compile.hostonly finds them: such a unit is compiled again with DEVICE_PASSES)
MARKED = (
    '-D__global__=__attribute__((section(".qola_cuda_global")))',
    '-D__constant__=__attribute__((section(".qola_cuda_data")))',
    '-D__managed__=__attribute__((section(".qola_cuda_data")))',
)


def host_only(include_dir: str) -> tuple[str, ...]:
    """A unit's passes without device code: the host compiler (``-x c++``), the toolkit's
    cuda_runtime.h included first as nvcc includes it for a .cu (by its absolute path: ``-include``
    looks in the working dir first, the build dir), and :data:`MARKED`."""
    return ("-x", "c++", "-include", os.path.join(include_dir, "cuda_runtime.h"), *MARKED)


def locate(env: Env, compiler: str | None = None) -> str:
    if compiler:
        found = executable(compiler) or (which(compiler, env) if os.sep not in compiler else None)
        if not found:
            raise QolaError(f"CUDA compiler {compiler!r} does not exist or is not executable", hint=INSTALL_HINT)
        return found
    homes = [env.get(k) for k in ("CUDA_HOME", "CUDA_PATH")]
    found = first_executable(
        [
            env.get("CUDACXX"),
            *(os.path.join(h, "bin", "nvcc") for h in homes if h),
            which("nvcc", env),
            *FALLBACKS,
        ]
    )
    if not found:
        raise QolaError(
            f"no CUDA compiler found (looked for $CUDACXX, $CUDA_HOME/bin/nvcc, $CUDA_PATH/bin/nvcc, "
            f"nvcc on PATH, {', '.join(FALLBACKS)})",
            hint=INSTALL_HINT,
        )
    return found


def _gpu_codes(nvcc: str, env: Env) -> list[str] | None:
    proc = run_capture([nvcc, "--list-gpu-code"], env)
    if proc.returncode != 0:
        return None  # an nvcc too old to list them: let the compile say it
    return sorted(set(re.findall(r"sm_[0-9]+[a-z]?", proc.stdout or "")))


def _layout(nvcc: str, env: Env) -> dict[str, str]:
    """The toolkit root and target dir, as nvcc itself resolves them (a wrapper
    script in /usr/local/bin still points into the real toolkit)."""
    out = run_checked([nvcc, "--dryrun", "-x", "cu", "-c", os.devnull, "-o", os.devnull], env)
    found: dict[str, str] = {}
    for key in ("TOP", "_TARGET_DIR_"):
        values = re.findall(rf"^#\$ {key}=(\S*)\s*$", out, re.M)
        values = [v for v in values if v]
        if values:
            found[key] = values[-1]
    top = os.path.normpath(found.get("TOP") or os.path.join(os.path.dirname(os.path.realpath(nvcc)), ".."))
    return {"root": top, "target_dir": found.get("_TARGET_DIR_", "")}


def lib_dir(root: str, target_dir: str) -> str:
    candidates = [os.path.join(root, target_dir, "lib")] if target_dir else []
    candidates += [os.path.join(root, "lib64"), os.path.join(root, "lib")]
    for cand in candidates:
        if os.path.exists(os.path.join(cand, "libcudart_static.a")):
            return cand
    return candidates[0]


def read_version(path: str, env: Env) -> tuple[str, str]:
    """(version_output, ``X.Y``) of nvcc ``path`` — the one CUDA version probe."""
    output = run_checked([path, "--version"], env)
    version = parse_nvcc_version(output)
    if not version:
        raise QolaError(
            f"cannot read the CUDA version of {path} (no 'release X.Y' in its --version output)",
            hint="is this NVIDIA's nvcc? " + INSTALL_HINT,
        )
    return output, version


def find_cuda(
    archs: Sequence[str],
    *,
    env: Env,
    accepted_versions: Sequence[str] | None,
    cache_dir: str | os.PathLike[str],
    compiler: str | None = None,
) -> Toolchain:
    env = ToolchainEnv.of(env)  # what the search reads, resolved once; the probes' environment
    path = locate(env, compiler)
    child = env
    output, version = read_version(path, child)
    check_accepted("cuda", path, [version], accepted_versions)
    identity = identity_of(path, output)

    probes = Probes(cache_dir, identity, child)
    codes = probes.fact("gpu_codes", lambda: _gpu_codes(path, child))
    layout = probes.fact("layout", lambda: _layout(path, child))
    probes.save()
    if codes:
        bad = [a for a in archs if cuda_base_code(a) not in codes]
        if bad:
            raise QolaError(
                f"{path} (CUDA {version}) cannot compile for {', '.join(bad)}; it knows {', '.join(codes)}",
                hint="use a CUDA toolkit that supports these architectures (set CUDACXX=/path/to/nvcc or "
                "CUDA_HOME), "
                "or drop them from [build] architectures",
            )

    flags = list(BASE)
    if env.get("CUDAHOSTCXX"):
        flags += ["-ccbin", env["CUDAHOSTCXX"]]
    for arch in archs:
        flags += cuda_gencode(arch)
    libs_at = lib_dir(layout["root"], layout.get("target_dir", ""))
    include_dir = os.path.join(layout["root"], layout.get("target_dir", ""), "include")
    return Toolchain(
        kind="cuda",
        compiler=path,
        version=version,
        version_output=output,
        identity=identity,
        archs=tuple(archs),
        host_cxx=find_host_cxx(env),
        child_env={},
        root=layout["root"],
        base_flags=tuple(flags),
        lang_args=DEVICE_PASSES,
        host_only=host_only(include_dir),
        link_flags=(f"-L{libs_at}", *RUNTIME),
        libs=("cudart",),
        lib_dirs=(libs_at,),
        host_wrap=("-Xcompiler",),
        unit_flags=UNIT_FLAGS,
        # nvcc names its intermediate files after its pid (tmpxft_<pid>_…), and those names land in
        # the objects' local FILE symbols: links and static archives drop local symbols
        discard_locals=True,
    )
