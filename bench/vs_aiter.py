"""qola against AITER's own compile commands, on the same files, in one run (issue 34, item 4).

Two slices of Transformer Engine's manifest shape (``tests/support/rocm_aiter.py`` ``manifest()``:
libmha_fwd + libmha_bwd, cpp_itfs, narrowed by variants to a few CK fMHA instances: forward d32 bf16
batch lse, and one backward dq_dk_dv tile with the dot_do_o / convert_dq kernels CK pairs with it):
slice A for gfx942, slice B for gfx942 + gfx950. For each slice:

1. **qola**: ``python -m qola build -j J`` into a fresh build dir, with a fresh ``XDG_CACHE_HOME`` (the
   generator-listing cache is cold too). Its CPU includes the plan and the generators; a separate
   ``--dry-run`` (own fresh dirs) gives that part alone.
2. **AITER (reference)**: every file qola's generators wrote for the slice (``gen/<module>/blob``,
   the same generator commands and filters, so the same kernel instances, dispatch and API units,
   including the dispatch-only units of the directions TE drops; both modules list no ``srcs`` in
   this sdist's ``aiter/jit/optCompilerConfig.json``), copied to ``<module>/blob`` and compiled one
   hipcc per file, J in parallel, module after module (``build_module`` builds one module per ninja
   graph), then linked. The generators are not run or timed on this side (AITER's build runs them
   too: leaving them out favours AITER). qola's own wrapper unit (``qola_<module>_itfs.cu``) and its
   embed assembly have no AITER twin: counted on qola's side only.

The reference command lines, and the sdist facts each part comes from (read, not copied):

- ``aiter/jit/core.py`` ``build_module``: ``flags_cc = -O3 -std=c++20``; the fixed ``flags_hip`` list
  (``-DLEGACY_HIPBLAS_DIRECT -DUSE_PROF_API=1 -D__HIP_PLATFORM_HCC__=1 -D__HIP_PLATFORM_AMD__=1
  -U__HIP_NO_HALF_CONVERSIONS__ -U__HIP_NO_HALF_OPERATORS__ -mllvm --amdgpu-kernarg-preload-count=16``,
  the ``-Wno-*`` and ``-fgpu-flush-denormals-to-zero``); the flags gated on ``hipconfig --version``
  (``get_hip_version``: max-ilp up to 6.3.42132, lsr-drop-solution, ``-fno-offload-uniform-block``,
  post-misched, early-inline-all + function-calls=false, coerce-illegal-types); ``-D__Float4_e2m1fn_x2``
  only when the build machine's own GPU is gfx950 (``get_gfx``; taken as not here); the module's
  ``flags_extra_hip``; ``--offload-arch=`` for every arch of ``GPU_ARCHS``
  (``validate_and_update_archs``) on every file; ``sorted(set(...))``; then ``hip_flag_checker`` (a
  flag hipcc rejects on ``-x hip -E -P /dev/null`` is dropped; run here untimed). Include dirs:
  ``CK_HELPER_DIR``, CK ``include``, CK ``library/include``, ``csrc/include``, ``<op_dir>/blob``, the
  module's ``extra_include``, ``csrc/include/torch`` (not ``is_standalone``).
- ``aiter/jit/optCompilerConfig.json``: libmha_fwd / libmha_bwd ``flags_extra_hip``, ``extra_include``,
  ``torch_exclude: True`` (no torch includes, defines or libraries), ``extra_ldflags: None``.
- ``aiter/jit/utils/cpp_extension.py`` ``_write_ninja_file_to_build_library``: hip flags are
  ``-DWITH_HIP`` + ``-I`` includes + ``-fPIC -std=c++20`` + ``flags_cc`` + ``COMMON_HIP_FLAGS`` +
  ``COMMON_HIPCC_FLAGS`` (``-fvisibility=hidden -fvisibility-inlines-hidden`` unless
  ``AITER_SYMBOL_VISIBLE``) + ``flags_hip`` + ``_get_rocm_arch_flags`` (``-fno-gpu-rdc`` when an
  offload arch is given); ``_is_cuda_file`` is always true, so every source goes through
  ``_write_ninja_file``'s ``cuda_compile`` rule: ``<ROCM_HOME>/bin/hipcc $cuda_cflags -c $in -o $out``,
  objects ``<stem>.cuda.o``; the link rule ``$cxx @$out.rsp $ldflags -o $out`` with ``get_cxx_compiler``
  (``$CXX`` else ``c++``) and ``-shared`` + ``_prepare_ldflags`` (``-mcmodel=large -ffunction-sections
  -fdata-sections -Wl,--gc-sections -Wl,--cref -L<ROCM_HOME>/lib -lamdhip64``).

Both sides drop ``-mllvm -amdgpu-early-inline-all=true`` (the manifest's ``drop_hip_flags``; here,
from the reference): Debian's clang 21 is upstream LLVM, and with it a CK fMHA backward kernel
compiles for tens of minutes (tests/support/rocm_aiter.py ``DROP``). The backward module uses the
manifest's ``blob_gen_cmd`` (CK's API only, no pre/post generator, no v3 asm API) on both sides.

CPU is the children's user + system time (``getrusage(RUSAGE_CHILDREN)`` deltas; per reference unit,
``wait4``); units are the compile edges in qola's ``.ninja_log`` and the reference's hipcc runs;
kernels per arch are the ``.kd`` symbols of every HIP code object in each library's ``.hip_fatbin``
(``qola.output.kernels.device_code_objects``), compared name by name. Logs, the manifests and
``results.json`` (per-unit CPU of the reference) go under the work dir. Run it in the ROCm 7 chroot:

    bash scripts/rocm7.sh run python bench/vs_aiter.py [--work-dir build/vs_aiter] [-j 2] [--slices AB]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shlex
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from qola.output.kernels import device_code_objects  # noqa: E402

MODULES = ("libmha_fwd", "libmha_bwd")
SLICES = {"A": ("gfx942",), "B": ("gfx942", "gfx950")}
DROPPED = ("-mllvm -amdgpu-early-inline-all=true",)  # as tests/support/rocm_aiter.py DROP
# build_module's fixed hip flags, and the ones gated on the HIP version: (flag, lowest, highest) exclusive
BUILD_MODULE_HIP = (
    "-DLEGACY_HIPBLAS_DIRECT", "-DUSE_PROF_API=1", "-D__HIP_PLATFORM_HCC__=1", "-D__HIP_PLATFORM_AMD__=1",
    "-U__HIP_NO_HALF_CONVERSIONS__", "-U__HIP_NO_HALF_OPERATORS__", "-mllvm --amdgpu-kernarg-preload-count=16",
    "-Wno-unused-result", "-Wno-switch-bool", "-Wno-vla-cxx-extension", "-Wno-undefined-func-template",
    "-Wno-macro-redefined", "-Wno-missing-template-arg-list-after-template-kw", "-fgpu-flush-denormals-to-zero",
)  # fmt: skip
VERSION_GATED = (  # (flag, applies when version > this, and version <= this (None: no bound))
    ("-mllvm --amdgpu-enable-max-ilp-scheduling-strategy=1", None, (6, 3, 42132)),
    ("-mllvm --lsr-drop-solution=1", (5, 5, 0), None),
    ("-fno-offload-uniform-block", (5, 7, 23302), None),
    ("-mllvm -enable-post-misched=0", (6, 1, 40090), None),
    ("-mllvm -amdgpu-early-inline-all=true", (6, 2, 41132), None),
    ("-mllvm -amdgpu-function-calls=false", (6, 2, 41132), None),
    ("-mllvm -amdgpu-coerce-illegal-types=1", (6, 2, 41133), None),
)
COMMON_HIP = ("-fPIC", "-D__HIP_PLATFORM_AMD__=1", "-DUSE_ROCM=1", "-DHIPBLAS_V2")
COMMON_HIPCC = (
    "-DCUDA_HAS_FP16=1", "-D__HIP_NO_HALF_OPERATORS__=1", "-D__HIP_NO_HALF_CONVERSIONS__=1", "-mcmodel=large",
    "-fno-unique-section-names", "-ffunction-sections", "-fdata-sections",
)  # fmt: skip
LDFLAGS = ("-mcmodel=large", "-ffunction-sections", "-fdata-sections", "-Wl,--gc-sections", "-Wl,--cref")


def hip_version(text: str) -> tuple[int, ...]:
    """``hipconfig --version`` (``6.4.43484-9999``) as a tuple, as build_module reads its last word."""
    return tuple(int(p) for p in re.findall(r"\d+", text.split()[-1].split("-")[0])[:3])


def aiter_hip_flags(version: tuple[int, ...], archs: tuple[str, ...], extra_hip: list[str]) -> list[str]:
    """build_module's ``flags_hip`` for this HIP version and archs, less ``DROPPED`` (before the checker)."""
    flags = list(BUILD_MODULE_HIP)
    for flag, above, upto in VERSION_GATED:
        if (above is None or version > above) and (upto is None or version <= upto):
            flags.append(flag)
    flags += extra_hip + [f"--offload-arch={a}" for a in archs]
    return [f for f in sorted(set(flags)) if f not in DROPPED]


def aiter_compile(src: Path, obj: Path, includes: list[Path], flags_hip: list[str], rocm: Path) -> str:
    """The cuda_compile line AITER's ninja file holds for one source (a shell line, as ninja runs it)."""
    visible = os.environ.get("AITER_SYMBOL_VISIBLE", "0") not in ("", "0")
    cflags = [f"-I{shlex.quote(str(i))}" for i in includes] + ["-fPIC", "-std=c++20", "-O3", "-std=c++20"]
    hipcc = ["-DWITH_HIP", *cflags, *COMMON_HIP, *COMMON_HIPCC]
    hipcc += [] if visible else ["-fvisibility=hidden", "-fvisibility-inlines-hidden"]
    hipcc += [*flags_hip, "-fno-gpu-rdc"]
    return f"{rocm / 'bin' / 'hipcc'} {' '.join(hipcc)} -c {shlex.quote(str(src))} -o {shlex.quote(str(obj))}"


def aiter_link(rsp: Path, out: Path, rocm: Path) -> str:
    ld = ["-shared", *LDFLAGS, f"-L{rocm / 'lib'}", "-lamdhip64"]
    return f"{os.environ.get('CXX', 'c++')} @{rsp} {' '.join(ld)} -o {out}"


def module_config(aiter: Path, module: str) -> tuple[list[str], list[Path]]:
    """(flags_extra_hip, extra_include) of one module, evaluated as compile_ops evaluates them."""
    meta = aiter / "aiter_meta"
    cfg = json.loads((aiter / "aiter" / "jit" / "optCompilerConfig.json").read_text())[module]
    if cfg.get("srcs"):
        raise SystemExit(f"vs_aiter: {module} lists srcs {cfg['srcs']}; this script handles generated files only")
    ns = {"os": os, "CK_DIR": str(meta / "3rdparty" / "composable_kernel"), "AITER_CSRC_DIR": str(meta / "csrc")}
    hip = [eval(e, ns) for e in cfg["flags_extra_hip"]]  # the config's own f-strings, as AITER evaluates them
    return hip, [Path(eval(e, ns)) for e in cfg["extra_include"]]


def child_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_unit(cmd: str, log: Path) -> tuple[float, float]:
    """(CPU, wall) of one shell command run to completion (wait4 on it); a failure stops the bench."""
    t0 = time.perf_counter()
    with open(log, "wb") as fh:
        proc = subprocess.Popen(cmd, shell=True, stdout=fh, stderr=subprocess.STDOUT)
        _, status, ru = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"vs_aiter: a reference command failed ({proc.returncode}); see {log}")
    return ru.ru_utime + ru.ru_stime, time.perf_counter() - t0


def accepted(flags: list[str], log: Path, seen: dict[str, bool]) -> list[str]:
    """hip_flag_checker's filter: each flag hipcc takes on an empty preprocess (untimed; ``seen`` caches)."""
    with open(log, "a") as fh:
        for f in flags:
            if f not in seen:
                rc = subprocess.run(f"hipcc {f} -x hip -E -P /dev/null -o /dev/null", shell=True, stdout=fh, stderr=fh)
                seen[f] = rc.returncode == 0
                fh.write(f"{f}: {'kept' if seen[f] else 'dropped'}\n")
    return [f for f in flags if seen[f]]


def run_qola(args: list[str], env: dict, log: Path) -> tuple[float, float]:
    cpu0, t0 = child_cpu(), time.perf_counter()
    with open(log, "wb") as fh:
        rc = subprocess.run([sys.executable, "-m", "qola", *args], stdout=fh, stderr=subprocess.STDOUT, env=env)
    wall, cpu = time.perf_counter() - t0, child_cpu() - cpu0
    if rc.returncode != 0:
        raise SystemExit(f"vs_aiter: qola failed; see {log}")
    return cpu, wall


def ninja_units(build_dir: Path) -> list[str]:
    """Outputs of the compile edges ninja ran (``.ninja_log`` v5: start, end, mtime, output, hash)."""
    rows = [ln.split("\t") for log in build_dir.rglob(".ninja_log") for ln in log.read_text().splitlines()[1:]]
    return sorted({r[3] for r in rows if len(r) > 3 and r[3].endswith(".o")})


def qola_side(slice_: str, archs: tuple[str, ...], aiter: Path, work: Path, jobs: int) -> dict:
    from support.rocm_aiter import FWD, manifest  # lazy: tests/ is on the path only for this script

    d = work / f"qola-{slice_}"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    m = manifest(d / "te.toml", "te", archs, bwd=True, fwd_variant=FWD)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    common = ["build", "-m", str(m), "-a", str(aiter), "-j", str(jobs), "--skip-checkout", "--allow-unpinned"]
    env_dry = {**env, "XDG_CACHE_HOME": str(d / "cache-dry")}
    plan_cpu, plan_wall = run_qola([*common, "-o", str(d / "out-dry"), "--build-dir", str(d / "bd-dry"), "--dry-run"],
                                   env_dry, work / f"qola-{slice_}-dry.log")  # fmt: skip
    env_build = {**env, "XDG_CACHE_HOME": str(d / "cache")}
    cpu, wall = run_qola([*common, "-o", str(d / "out"), "--build-dir", str(d / "bd"), "-v"], env_build,
                         work / f"qola-{slice_}-build.log")  # fmt: skip
    libs = {mod: d / "out" / "lib" / f"te_{mod}.so" for mod in MODULES}
    return {"cpu": cpu, "wall": wall, "plan_cpu": plan_cpu, "plan_wall": plan_wall,
            "units": ninja_units(d / "bd"), "libs": libs, "gen": d / "bd" / "gen"}  # fmt: skip


def aiter_side(slice_: str, archs: tuple[str, ...], aiter: Path, gen: Path, work: Path, jobs: int) -> dict:
    meta = aiter / "aiter_meta"
    ck = meta / "3rdparty" / "composable_kernel"
    rocm = Path(shutil.which("hipcc") or "/usr/bin/hipcc").resolve().parent.parent
    version = hip_version(subprocess.run(["hipconfig", "--version"], capture_output=True, text=True).stdout)
    d = work / f"aiter-{slice_}"
    shutil.rmtree(d, ignore_errors=True)
    logs = d / "logs"
    logs.mkdir(parents=True)
    jobs_cmds: dict[str, list[tuple[str, str]]] = {}
    seen: dict[str, bool] = {}
    for mod in MODULES:
        extra_hip, extra_inc = module_config(aiter, mod)
        flags = accepted(aiter_hip_flags(version, archs, extra_hip), logs / "flag_checker.log", seen)
        blob = d / mod / "blob"
        shutil.copytree(gen / mod / "blob", blob)
        incs = [meta / "3rdparty" / "ck_helper", ck / "include", ck / "library" / "include", meta / "csrc" / "include",
                blob, *extra_inc, meta / "csrc" / "include" / "torch"]  # fmt: skip
        (d / mod / "build").mkdir()
        srcs = sorted(p for p in blob.rglob("*") if p.suffix in (".cpp", ".cu"))
        jobs_cmds[mod] = [(s.name, aiter_compile(s, d / mod / "build" / f"{s.stem}.cuda.o", incs, flags, rocm))
                          for s in srcs]  # fmt: skip
    units: dict[str, dict] = {}
    cpu0, t0 = child_cpu(), time.perf_counter()
    libs = {}
    for mod, cmds in jobs_cmds.items():  # build_module: one module's graph after the other
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            futs = {name: pool.submit(run_unit, cmd, logs / f"{mod}-{name}.log") for name, cmd in cmds}
            for name, fut in futs.items():
                c, w = fut.result()
                units[f"{mod}/{name}"] = {"cpu": round(c, 2), "wall": round(w, 2), "cmd": dict(cmds)[name]}
        objs = sorted((d / mod / "build").glob("*.cuda.o"))
        rsp = d / mod / "build" / f"{mod}.so.rsp"
        rsp.write_text(" ".join(str(o) for o in objs))
        libs[mod] = d / mod / "build" / f"{mod}.so"
        run_unit(aiter_link(rsp, libs[mod], rocm), logs / f"{mod}-link.log")
    wall, cpu = time.perf_counter() - t0, child_cpu() - cpu0
    return {"cpu": cpu, "wall": wall, "units": units, "libs": libs}


def kernels(libs: dict[str, Path]) -> dict[str, dict[str, list[str]]]:
    return {mod: device_code_objects(p) for mod, p in libs.items()}


def table(rows: list[dict]) -> str:
    head = ("| slice | archs | units qola / AITER | CPU s qola (plan) / AITER | CPU ratio | wall s qola / AITER "
            "| wall ratio | .so bytes qola / AITER (fwd; bwd) | HIP kernels per arch (fwd+bwd) |\n"
            "|---|---|---:|---:|---:|---:|---:|---|---|")  # fmt: skip
    out = [head]
    for r in rows:
        q, a = r["qola"], r["aiter"]
        sizes = "; ".join(f"{r['sizes'][m][0]:,} / {r['sizes'][m][1]:,}" for m in MODULES)
        kern = ", ".join(f"{arch}: {n}" for arch, n in r["kernels_per_arch"].items())
        kern += "; **same names on both sides**" if r["kernels_equal"] else f"; **DIFFER**: {r['kernel_diff']}"
        out.append(
            f"| {r['slice']} | {'+'.join(r['archs'])} | {len(q['units'])} / {len(a['units'])} "
            f"| {q['cpu']:.0f} ({q['plan_cpu']:.0f}) / {a['cpu']:.0f} | {q['cpu'] / a['cpu']:.2f}× "
            f"| {q['wall']:.0f} / {a['wall']:.0f} | {q['wall'] / a['wall']:.2f}× | {sizes} | {kern} |"
        )
    return "\n".join(out)


def compare(qk: dict, ak: dict) -> tuple[bool, dict[str, int], str]:
    """(same kernel names per module and arch, kernels per arch over both modules, what differs)."""
    diff, per_arch = [], {}
    for mod in MODULES:
        for arch in sorted(set(qk[mod]) | set(ak[mod])):
            q, a = set(qk[mod].get(arch, ())), set(ak[mod].get(arch, ()))
            per_arch[arch] = per_arch.get(arch, 0) + len(q)
            if q != a:
                diff.append(f"{mod} {arch}: qola-only {len(q - a)}, AITER-only {len(a - q)}")
    return not diff, per_arch, "; ".join(diff)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work-dir", type=Path, default=REPO / "build" / "vs_aiter", help="logs, builds, results.json")
    ap.add_argument("--aiter-root", type=Path, help="the unpacked amd-aiter sdist (default: tests/support/aiter_sdist)")
    ap.add_argument("-j", "--jobs", type=int, default=2, help="parallel compiles, both sides (default 2)")
    ap.add_argument("--slices", default="AB", help="A: gfx942; B: gfx942+gfx950 (default AB)")
    args = ap.parse_args(argv)
    if args.aiter_root is None:
        from support.aiter_sdist import aiter_root  # lazy: tests/ is on the path only for this script

        args.aiter_root = aiter_root()
    work = args.work_dir.resolve()
    work.mkdir(parents=True, exist_ok=True)
    rows = []
    for s in args.slices:
        archs = SLICES[s]
        print(f"[vs_aiter] slice {s} ({'+'.join(archs)}): qola build", flush=True)
        q = qola_side(s, archs, args.aiter_root, work, args.jobs)
        print(f"[vs_aiter] slice {s}: qola {q['cpu']:.0f} s CPU, {q['wall']:.0f} s wall; AITER's commands", flush=True)
        (work / f"qola-{s}.json").write_text(json.dumps(q, indent=1, default=str))
        a = aiter_side(s, archs, args.aiter_root, q["gen"], work, args.jobs)
        print(f"[vs_aiter] slice {s}: AITER {a['cpu']:.0f} s CPU, {a['wall']:.0f} s wall", flush=True)
        qk, ak = kernels(q["libs"]), kernels(a["libs"])
        same, per_arch, diff = compare(qk, ak)
        sizes = {m: (q["libs"][m].stat().st_size, a["libs"][m].stat().st_size) for m in MODULES}
        rows.append({"slice": s, "archs": archs, "qola": q, "aiter": a, "sizes": sizes, "kernels_equal": same,
                     "kernels_per_arch": per_arch, "kernel_diff": diff, "kernels": {"qola": qk, "aiter": ak}})  # fmt: skip
        (work / "results.json").write_text(json.dumps(rows, indent=1, default=str))
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
