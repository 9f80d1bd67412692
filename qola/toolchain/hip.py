"""HIP (ROCm): find hipcc or amdclang++, read its version, build AITER's flag set.

The flags follow what AITER's JIT passes (``aiter/jit/core.py`` ``build_module``
and ``aiter/jit/utils/cpp_extension.py``): the torch-extension defines and code
model flags that are always given, then AITER's own HIP set — including the
flags it adds by HIP version — de-duplicated and sorted as AITER does, each
optional one kept only if the compiler accepts it (AITER's ``hip_flag_checker``:
preprocess ``/dev/null`` with the flag; we also make unknown ``-W`` options fatal
there so they are dropped instead of warning on every file).
"""

from __future__ import annotations

import glob
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from qola.core.errors import QolaError
from qola.toolchain.archs import arch_base
from qola.toolchain.base import NO_CHOICE, Toolchain, ToolchainChoice, VersionCheck
from qola.toolchain.env import ToolchainEnv
from qola.toolchain.host import (
    Env,
    executable,
    find_host_cxx,
    first_executable,
    identity_of,
    run_checked,
    which,
)
from qola.toolchain.probe import Probes
from qola.toolchain.versions import check_accepted, hip_version_key, parse_hip_version, rocm_release

CHILD_ENV = {"HIP_PLATFORM": "amd"}  # Debian's hipcc falls back to nvcc without it
HIPCC_FALLBACKS = ("/opt/rocm/bin/hipcc", "/usr/bin/hipcc")
CLANG_FALLBACKS = ("/opt/rocm/llvm/bin/amdclang++",)
INSTALL_HINT = (
    "install ROCm's HIP compiler: `apt-get install hipcc` (Debian/Ubuntu) or ROCm from "
    "repo.radeon.com; or point qola at one: HIPCC=/path/to/hipcc or ROCM_PATH=/path/to/rocm"
)

# Given to every HIP compile, in AITER's order: its common flags and -O3/-std, torch's
# COMMON_HIP_FLAGS and COMMON_HIPCC_FLAGS (visibility hidden: AITER_SYMBOL_VISIBLE unset).
ALWAYS = (
    "-DWITH_HIP", "-fPIC", "-std=c++20", "-O3",
    "-D__HIP_PLATFORM_AMD__=1", "-DUSE_ROCM=1", "-DHIPBLAS_V2",
    "-DCUDA_HAS_FP16=1", "-D__HIP_NO_HALF_OPERATORS__=1", "-D__HIP_NO_HALF_CONVERSIONS__=1",
    "-mcmodel=large", "-fno-unique-section-names", "-ffunction-sections", "-fdata-sections",
    "-fvisibility=hidden", "-fvisibility-inlines-hidden",
)  # fmt: skip
# AITER's flags_hip. The -U pair comes later than the -D pair above, so half
# operators and conversions end up enabled, as in AITER.
AITER_HIP = (
    "-DLEGACY_HIPBLAS_DIRECT", "-DUSE_PROF_API=1", "-D__HIP_PLATFORM_HCC__=1",
    "-D__HIP_PLATFORM_AMD__=1", "-U__HIP_NO_HALF_CONVERSIONS__", "-U__HIP_NO_HALF_OPERATORS__",
    "-mllvm --amdgpu-kernarg-preload-count=16",
    "-Wno-unused-result", "-Wno-switch-bool", "-Wno-vla-cxx-extension",
    "-Wno-undefined-func-template", "-Wno-macro-redefined",
    "-Wno-missing-template-arg-list-after-template-kw", "-fgpu-flush-denormals-to-zero",
)  # fmt: skip
AFTER = ("-fno-gpu-rdc",)
# (test, threshold, flags): composable_kernel's version gates, as AITER copies them.
BY_VERSION = (
    ("<=", (6, 3, 42132, 0), ("-mllvm --amdgpu-enable-max-ilp-scheduling-strategy=1",)),
    (">", (5, 5, 0, 0), ("-mllvm --lsr-drop-solution=1",)),
    (">", (5, 7, 23302, 0), ("-fno-offload-uniform-block",)),
    (">", (6, 1, 40090, 0), ("-mllvm -enable-post-misched=0",)),
    (">", (6, 2, 41132, 0), ("-mllvm -amdgpu-early-inline-all=true", "-mllvm -amdgpu-function-calls=false")),
    (">", (6, 2, 41133, 0), ("-mllvm -amdgpu-coerce-illegal-types=1",)),
)
# clang derives __hip_cuid_<hash> (a symbol in the host object and in every code object) from the
# input's path and options unless given one
UNIT_FLAGS = ("-cuid={uid}",)
PROBE_TAIL = ("-Werror=unknown-warning-option", "-x", "hip", "-E", "-P", "/dev/null", "-o", "/dev/null")


def candidates(env: Env) -> list[tuple[str | None, str]]:
    """(path, why) in the order a build tries them: ``HIPCC``, then the ROCm install AITER's
    ``_find_rocm_home`` names (``ROCM_HOME``, else ``ROCM_PATH``: ck-jit's interceptor lives at
    ``$ROCM_PATH/bin/hipcc``), ``HIP_PATH``, hipcc on PATH, the usual install locations, amdclang++."""
    rocm = {key: env.get(key, "").strip() for key in ("ROCM_HOME", "ROCM_PATH", "HIP_PATH")}
    root = rocm["ROCM_HOME"] or rocm["ROCM_PATH"] or rocm["HIP_PATH"]
    found: list[tuple[str | None, str]] = [(env.get("HIPCC") or None, "HIPCC")]
    found += [(os.path.join(v, "bin", "hipcc") if v else None, f"${k}/bin/hipcc ({k})") for k, v in rocm.items()]
    found += [(which("hipcc", env), "hipcc on PATH")]
    found += [(p, "a default ROCm location") for p in HIPCC_FALLBACKS]
    found += [
        (which("amdclang++", env), "amdclang++ on PATH"),
        (os.path.join(root, "llvm", "bin", "amdclang++") if root else None, "the ROCm root's amdclang++"),
    ]
    found += [(p, "a default ROCm location") for p in CLANG_FALLBACKS]
    found += [(which("clang++", env) if root else None, "clang++ on PATH, beside a named ROCm")]
    return found


def locate_why(env: Env, compiler: str | None = None) -> tuple[str, str]:
    """(hipcc or amdclang++ / clang++ used with -x hip as an absolute path, how it was found)."""
    if compiler:
        found = executable(compiler) or (which(compiler, env) if os.sep not in compiler else None)
        if not found:
            raise QolaError(f"HIP compiler {compiler!r} does not exist or is not executable", hint=INSTALL_HINT)
        return found, "given"
    skipped: list[str] = []
    for path, why in candidates(env):
        hit = executable(path) if path else None
        if hit:
            note = f" ({'; '.join(skipped)})" if skipped else ""
            return hit, why + note
        if path and why.startswith("$"):
            skipped.append(f"{path} is not an executable")
    raise QolaError(
        "no HIP compiler found (looked for $HIPCC, $ROCM_HOME/bin/hipcc, $ROCM_PATH/bin/hipcc, $HIP_PATH/bin/hipcc, "
        f"hipcc on PATH, {', '.join(HIPCC_FALLBACKS)}, amdclang++)",
        hint=INSTALL_HINT,
    )


def locate(env: Env, compiler: str | None = None) -> str:
    """hipcc (or amdclang++ / clang++ used with -x hip), as an absolute path (:func:`locate_why`)."""
    return locate_why(env, compiler)[0]


def is_clang(compiler: str) -> bool:
    return "clang" in os.path.basename(compiler)


def rocm_root(compiler: str, env: Env) -> str:
    for key in ("ROCM_HOME", "ROCM_PATH", "HIP_PATH"):
        if env.get(key) and os.path.isdir(env[key]):
            return os.path.abspath(env[key])
    real = Path(os.path.realpath(compiler))
    if real.parent.name == "bin" and real.parent.parent.name == "llvm":
        return str(real.parent.parent.parent)  # <rocm>/llvm/bin/amdclang++
    if not is_clang(compiler):
        return str(real.parent.parent)  # <rocm>/bin/hipcc, /usr/bin/hipcc -> /usr
    if os.path.isdir("/opt/rocm"):
        return "/opt/rocm"
    hipconfig = which("hipconfig", env)  # e.g. Debian: /usr/bin/hipconfig -> /usr
    return str(Path(os.path.realpath(hipconfig)).parent.parent) if hipconfig else str(real.parent.parent)


def _lib_dir(root: str) -> str | None:
    for sub in ("lib", "lib64"):
        if glob.glob(os.path.join(root, sub, "libamdhip64.so*")):
            return os.path.join(root, sub)
    return None  # e.g. Debian: /usr/lib/<triplet>, on the linker's default path


def _clang_flags(root: str) -> list[str]:
    """What hipcc would add for a bare clang: the ROCm root and, in Debian's layout,
    the device bitcode library directory."""
    flags = [f"--rocm-path={root}"]
    if not os.path.isdir(os.path.join(root, "amdgcn", "bitcode")):
        found = sorted(glob.glob(os.path.join(root, "lib", "*", "amdgcn", "bitcode")))
        if found:
            flags.append(f"--hip-device-lib-path={found[0]}")
    return flags


def read_version(compiler: str, root: str, env: Env) -> tuple[str, str, str]:
    """(version_output, dotted HIP version, suffix) of ``compiler`` — the one HIP version probe
    (parsed by :func:`qola.toolchain.versions.parse_hip_version`); ``env`` is the child's."""
    output = run_checked([compiler, "--version"], env)
    if is_clang(compiler):
        hipconfig = first_executable([os.path.join(root, "bin", "hipconfig"), which("hipconfig", env)])
        if hipconfig:
            output += "HIP version: " + run_checked([hipconfig, "--version"], env).strip() + "\n"
    parsed = parse_hip_version(output)
    if not parsed:
        raise QolaError(
            f"cannot read the HIP version of {compiler} (no 'HIP version:' in its --version output "
            "and no hipconfig beside it)",
            hint="use ROCm's hipcc, or set ROCM_PATH to the ROCm install that clang belongs to",
        )
    return output, parsed[0], parsed[1]


def installed_version(env: Env) -> str | None:
    """The dotted HIP version of the compiler a build with ``env`` would use (:func:`locate`), or
    None when there is none or it cannot tell (planning without a toolchain)."""
    try:
        path = locate(env)
        tenv = ToolchainEnv.of(env)
        return read_version(path, rocm_root(path, tenv), tenv.with_child(CHILD_ENV))[1]
    except QolaError:
        return None


def arch_flags(archs: Sequence[str]) -> list[str]:
    """One device pass per arch (``--offload-arch=gfx942``): what :func:`hip_flag_set` adds for the
    build's archs and what a compile edge names for the archs its file serves (``qola.compile.steps``)."""
    return [f"--offload-arch={a}" for a in archs]


# A HIP source with no device code compiled without device passes: clang's spelling since HIP began
# (an alias of --offload-host-only in clang 14+). qola's own cpp_itfs wrapper only forwards host
# calls; its object is byte-identical with and without the device passes (hipcc 7.0.2, measured),
# and with the ``--offload-arch`` flags kept before this one.
HOST_ONLY = "--cuda-host-only"


def hip_flag_set(version_key: tuple[int, int, int, int], archs: Sequence[str], env: Env) -> list[str]:
    """AITER's flags_hip for this HIP version and these archs: sorted, de-duplicated,
    unprobed. Entries like ``-mllvm X`` are one string (split them for argv)."""
    flags = list(AITER_HIP)
    for test, threshold, extra in BY_VERSION:
        if (version_key <= threshold) if test == "<=" else (version_key > threshold):
            flags += extra
    try:
        fp4 = int(env.get("AITER_FP4x2", "1"))
    except ValueError:
        fp4 = 1
    # AITER's build_module: when get_gfx() is gfx950, and get_gfx() is the LAST entry of GPU_ARCHS
    # (chip_info.get_gfx_custom_op_core splits on ';' and takes [-1]): "gfx950;gfx942" has no fp4 type
    if fp4 > 0 and archs and arch_base(archs[-1]) == "gfx950":
        flags.append("-D__Float4_e2m1fn_x2")
    flags += arch_flags(archs)
    return sorted(set(flags))


def _needs_probe(flag: str) -> bool:
    return not flag.startswith(("-D", "-U"))


def find_hip(
    archs: Sequence[str],
    *,
    env: Env,
    accepted_versions: Sequence[str] | None,
    cache_dir: str | os.PathLike[str],
    choice: ToolchainChoice = NO_CHOICE,
) -> Toolchain:
    """``choice.assume_version`` (planning, e.g. ``--dry-run``): take AITER's flag set for that HIP
    version, skip the version check and every probe, keep every flag — nothing is compiled with it.
    ``choice.drop_hip_flags``: entries of that flag set to leave out (:func:`without`)."""
    env = ToolchainEnv.of(env)  # what the search reads, resolved once; the probes' environment
    drop = choice.drop_hip_flags
    path, why = locate_why(env, choice.compiler)
    root = rocm_root(path, env)
    child = env.with_child(CHILD_ENV)
    output, dotted, suffix = read_version(path, root, child)
    release = rocm_release(root)
    if choice.assume_version is not None:
        return _planning(_Found(path, root, output), choice.assume_version, archs, env, drop)
    identity = identity_of(path, output)
    pre = _clang_flags(root) if is_clang(path) else []
    wanted = without(hip_flag_set(hip_version_key(dotted, suffix), archs, env), drop, f"HIP {dotted}")
    probes = Probes(cache_dir, identity, child)
    ok = _probed(probes, (path, pre, dotted), archs, wanted)
    kept = [f for f in wanted if (not _needs_probe(f) or ok[f]) and f not in ALWAYS]
    dropped = tuple(f for f in wanted if _needs_probe(f) and not ok[f])
    flags = [*pre, *ALWAYS, *(tok for f in kept for tok in f.split()), *AFTER]
    lib_dir = _lib_dir(root)
    return Toolchain(
        kind="hip",
        compiler=path,
        version=dotted,
        version_output=output,
        identity=identity,
        archs=tuple(archs),
        host_cxx=find_host_cxx(env),
        child_env=dict(CHILD_ENV),
        root=root,
        base_flags=tuple(flags),
        lang_args=("-x", "hip"),
        link_flags=(*([f"-L{lib_dir}"] if lib_dir else []), "-lamdhip64"),
        libs=("amdhip64",),
        lib_dirs=(lib_dir,) if lib_dir else (),
        dropped_flags=dropped,
        removed_flags=tuple(drop),
        rocm_version=release,
        unit_flags=UNIT_FLAGS,
        version_check=_version_check(path, dotted, release, accepted_versions),
        found_by=why,
    )


def _version_check(path: str, dotted: str, release: str | None, accepted: Sequence[str] | None) -> VersionCheck | None:
    """The manifest's ``rocm_versions`` against the compiler found: recorded, not enforced."""
    found = [dotted] + ([release] if release else [])
    mismatch = check_accepted("hip", path, found, accepted, enforce=False)
    if accepted is None:
        return None
    status = "mismatch" if mismatch else "match"
    return VersionCheck(
        "rocm_versions", tuple(accepted), {"hip": dotted, "rocm_release": release}, status, mismatch or None
    )


def _probed(
    probes: Probes, compiler: tuple[str, list[str], str], archs: Sequence[str], wanted: list[str]
) -> dict[str, bool]:
    """Which of the archs' flags and the optional ``wanted`` flags the compiler takes (probed, cached);
    an arch it cannot compile for is an error."""
    path, pre, dotted = compiler
    passes = arch_flags(archs)
    ok = probes.supported(passes, lambda f: [path, *pre, f, *PROBE_TAIL])
    bad = [f.split("=", 1)[1] for f in passes if not ok[f]]
    if bad:
        probes.save()
        raise QolaError(
            f"{path} (HIP {dotted}) cannot compile for {', '.join(bad)}",
            hint="use a ROCm release that knows these targets (set HIPCC=/path/to/hipcc or ROCM_PATH), "
            "or drop them from [build] architectures",
        )
    probe_arch = f"--offload-arch={archs[0]}"
    optional = [f for f in wanted if _needs_probe(f) and f not in passes]
    ok.update(probes.supported(optional, lambda f: [path, *pre, probe_arch, *f.split(), *PROBE_TAIL]))
    probes.save()
    return ok


def without(wanted: list[str], drop: Sequence[str], where: str) -> list[str]:
    """``wanted`` (AITER's flag set) less the ``drop`` entries, each of which must be one of them,
    spelled as AITER does (``"-mllvm -amdgpu-early-inline-all=true"``): a typo or a flag this
    version does not pass is an error, not a silent no-op."""
    unknown = [f for f in drop if f not in wanted]
    if unknown:
        listed = "\n".join(f"    {f!r}" for f in wanted if not f.startswith("--offload-arch="))
        raise QolaError(
            f"[build] drop_hip_flags: {', '.join(map(repr, unknown))} is not in AITER's flag set for {where}",
            hint=f"name entries exactly as listed here:\n{listed}",
        )
    return [f for f in wanted if f not in drop]


@dataclass(frozen=True)
class _Found:
    """The compiler found: its path, the ROCm root, its ``--version`` output."""

    path: str
    root: str
    output: str


def _planning(found: _Found, version: str, archs: Sequence[str], env: Env, drop: Sequence[str] = ()) -> Toolchain:
    path, root, output = found.path, found.root, found.output
    pre = _clang_flags(root) if is_clang(path) else []
    wanted = without(hip_flag_set(hip_version_key(version), archs, env), drop, f"HIP {version}")
    kept = [f for f in wanted if f not in ALWAYS]
    flags = [*pre, *ALWAYS, *(tok for f in kept for tok in f.split()), *AFTER]
    return Toolchain(
        kind="hip",
        compiler=path,
        version=version,
        version_output=output,
        identity=identity_of(path, output),
        archs=tuple(archs),
        host_cxx=find_host_cxx(env),
        child_env=dict(CHILD_ENV),
        root=root,
        base_flags=tuple(flags),
        lang_args=("-x", "hip"),
        link_flags=("-lamdhip64",),
        libs=("amdhip64",),
        removed_flags=tuple(drop),
        unit_flags=UNIT_FLAGS,
    )
