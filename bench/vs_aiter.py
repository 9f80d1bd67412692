"""qola against AITER's own build commands, on the same kernel instances, alternating (issue 34 item 4, issue 42 item 2).

Two slices of TE's manifest shape (``tests/support/rocm_aiter.py`` ``manifest()``: libmha_fwd +
libmha_bwd, cpp_itfs, narrowed by variants to forward d32 bf16 batch lse and one backward dq_dk_dv
tile with its dot_do_o / convert_dq kernels): slice A gfx942, slice B gfx942 + gfx950 (``GPU_ARCHS``
in that order). ``--tiny``: the forward module and one kernel (a check of the script, no measurement).

Per slice: one cold ``qola plan --json`` (its CPU shown as "plan"; its generator records give the
reference its commands), then ``--pairs`` pairs of runs (default 2) in
ABAB order (pair 0 qola then AITER, pair 1 AITER then qola, …; ``--first aiter`` swaps), each run
from scratch, with the 1-minute load average before and after it.

1. **qola**: ``python -m qola build -j J -v``, fresh build dir and ``XDG_CACHE_HOME`` (all cold).
2. **AITER (reference)**: ``build_module``'s steps, timed, module after module (one ninja graph each):
   a. ``hip_flag_checker`` on each flag (``hipcc <flag> -x hip -E -P /dev/null -o /dev/null``, one
      shell each; cached across the two modules as its ``lru_cache`` is in one process);
   b. the generators, ``<python> <command>`` through a shell (``exec_blob``'s ``os.system``), in the
      plan's order, with ``GPU_ARCHS``, ``AITER_ASM_DIR=<meta>/hsa/<last arch>/`` (``core.py`` sets it
      at import) and qola's ``hipconfig`` shim first on PATH (Debian's is hipcc, which prints ``HIP
      version: …`` to the realpath ``cpp_extension`` calls, and ``mha_*_generate.py`` dies; AITER's
      ``os.system`` would go on, a failure here stops the bench) — the plan's commands and variant filters (so the same instances, the same
      dispatch-only units of the directions TE drops; qola's any-of filter shim runs too: CK's own
      ``--filter`` takes one pattern per kind), as AITER would run them:
      * no ``--targets``: qola adds ``--targets=<archs>`` to CK's fMHA ``generate.py`` (just after the
        script), neither AITER's table nor TE's manifest names one, and without it CK's default is
        ``gfx9,gfx950``: AITER's build writes the ``_gfx950`` twin of each kernel file in slice A too,
        and compiles it for gfx942 (its body is under ``#if … defined(__gfx950__)``: no gfx942 kernel);
      * one asm v3 generator: the table names ``{get_asm_dir()}/fmha_v3_fwd/codegen.py``, and
        ``get_asm_dir()`` is ``<meta>/hsa/<get_gfx()>/``, the last ``GPU_ARCHS`` entry; qola runs one per
        target arch. In slice B AITER writes ``asm_fmha_fwd_v3_gfx950.cpp`` only (its ``mha_fwd``
        calls the gfx942 v3 entry point too, left undefined in AITER's ``-shared`` library);
   c. every ``.cpp``/``.cu`` under ``<module>/blob`` (``rename_cpp_to_cu(..., recursive=True)``), one
      hipcc each, J in parallel; then the link. (qola's wrapper units and embeds have no AITER twin.)

The reference command lines, and the sdist facts each part comes from (read, not copied):

- ``aiter/jit/core.py`` ``build_module``: ``flags_cc = -O3 -std=c++20``; the fixed ``flags_hip`` list
  (``-DLEGACY_HIPBLAS_DIRECT -DUSE_PROF_API=1 -D__HIP_PLATFORM_HCC__=1 -D__HIP_PLATFORM_AMD__=1
  -U__HIP_NO_HALF_CONVERSIONS__ -U__HIP_NO_HALF_OPERATORS__ -mllvm --amdgpu-kernarg-preload-count=16``,
  the ``-Wno-*`` and ``-fgpu-flush-denormals-to-zero``); the flags gated on ``hipconfig --version``
  (``get_hip_version``: max-ilp up to 6.3.42132, lsr-drop-solution, ``-fno-offload-uniform-block``,
  post-misched, early-inline-all + function-calls=false, coerce-illegal-types);
  ``-D__Float4_e2m1fn_x2`` when ``get_gfx() == "gfx950"`` and ``AITER_FP4x2`` (default 1) > 0, where
  ``get_gfx`` (``aiter/jit/utils/chip_info.py`` ``get_gfx_custom_op_core``) reads ``GPU_ARCHS`` and,
  for a ``;``-list, takes its **last** entry: slice B (``gfx942;gfx950``) has it, slice A not; the
  module's ``flags_extra_hip``; ``--offload-arch=`` for every ``GPU_ARCHS`` entry
  (``validate_and_update_archs``) on every file; ``sorted(set(...))``; then ``hip_flag_checker``
  (this clang rejects ``-mllvm -amdgpu-coerce-illegal-types=1``, with or without an offload arch:
  both sides drop it). Include dirs: ``CK_HELPER_DIR``, CK ``include``, CK ``library/include``,
  ``csrc/include``, ``<op_dir>/blob``, the module's ``extra_include``, ``csrc/include/torch`` (not
  ``is_standalone``).
- ``aiter/jit/optCompilerConfig.json``: libmha_fwd / libmha_bwd ``flags_extra_hip``, ``extra_include``,
  ``torch_exclude: True`` (no torch includes, defines or libraries), ``extra_ldflags: None``.
- ``aiter/jit/utils/cpp_extension.py`` ``_write_ninja_file_to_build_library``: ``-DWITH_HIP`` + ``-I``
  includes + ``-fPIC -std=c++20`` + ``flags_cc`` + ``COMMON_HIP_FLAGS`` + ``COMMON_HIPCC_FLAGS``
  (``-fvisibility=hidden -fvisibility-inlines-hidden`` unless ``AITER_SYMBOL_VISIBLE``) + ``flags_hip``
  + ``-fno-gpu-rdc``; every source is a ``cuda_compile`` edge (``<ROCM_HOME>/bin/hipcc $cuda_cflags -c
  $in -o $out``, objects ``<stem>.cuda.o``); the link ``$cxx @$out.rsp $ldflags -o $out`` (``$CXX`` else
  ``c++``; ``-shared`` + ``_prepare_ldflags``: ``-mcmodel=large -ffunction-sections -fdata-sections
  -Wl,--gc-sections -Wl,--cref -L<ROCM_HOME>/lib -lamdhip64``).

Both sides drop ``-mllvm -amdgpu-early-inline-all=true`` (``drop_hip_flags``; tests/support/rocm_aiter.py
``DROP``: with Debian's clang 21 a CK fMHA backward kernel takes tens of minutes). libmha_bwd runs the
manifest's ``blob_gen_cmd`` (CK's API only: no pre/post generator, no v3 asm API) on both sides.

CPU is the children's user + system time (``getrusage(RUSAGE_CHILDREN)`` deltas; per reference
command, ``wait4``). The table: a row per pair (order, loads, each side's CPU and wall; AITER's
generators + flag checks apart) and the mean of the pair ratios, to AITER's compile + link and to all
of it. Units: qola's ``.ninja_log`` compile edges, the reference's hipcc runs; kernels: the ``.kd``
symbols of each library's HIP code objects (``qola.output.kernels.device_code_objects``), compared by
name for every pair, and each kernel's machine code (its ``.text`` bytes, ``bench/_kernels.py``): a row
per library and arch, "kernels .text identical: N of M". ``--report-only`` builds nothing and re-renders
the tables of the run in ``--work-dir`` from its ``results.json`` and the libraries it kept (also into
``report.md`` there); it runs on the host (pyelftools). Logs, plans and ``results.json`` (every run, per-command CPU) go under the work
dir. Run it in the ROCm 7 chroot:

    bash scripts/rocm7.sh run python bench/vs_aiter.py [--work-dir build/vs_aiter] [-j 2] [--slices AB]
        [--pairs 2] [--first qola|aiter] [--tiny]
    python bench/vs_aiter.py --report-only --work-dir build/vs_aiter
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
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests"), str(REPO / "bench")]

from _aiter_report import SIDES, pair_checks, pair_rows, report, table, text_table  # noqa: E402, F401 (tests)

from qola.core.fsutil import write_if_changed  # noqa: E402
from qola.toolchain.hipconfig import shim_text  # noqa: E402

MODULES = ("libmha_fwd", "libmha_bwd")
SLICES = {"A": ("gfx942",), "B": ("gfx942", "gfx950")}
DROPPED = ("-mllvm -amdgpu-early-inline-all=true",)  # as tests/support/rocm_aiter.py DROP
FP4_DEFINE = "-D__Float4_e2m1fn_x2"
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
_ASM_DIR = re.compile(r"/hsa/(gfx[0-9a-z]+)/")  # a per-arch asm generator's script: <meta>/hsa/<gfx>/…


def slice_manifest(path: Path, archs: tuple[str, ...], *, tiny: bool = False) -> Path:
    """TE's manifest for one slice (``--tiny``: the forward module, one kernel), written to ``path``."""
    from support.rocm_aiter import FWD, FWD_ONE, manifest  # lazy: tests/ is on the path only for this script

    return Path(manifest(path, "te", archs, bwd=not tiny, fwd_variant=FWD + FWD_ONE if tiny else FWD))


def hip_version(text: str) -> tuple[int, ...]:
    """``hipconfig --version`` (``6.4.43484-9999``) as a tuple, as build_module reads its last word."""
    return tuple(int(p) for p in re.findall(r"\d+", text.split()[-1].split("-")[0])[:3])


def aiter_gfx(archs: tuple[str, ...]) -> str:
    """``chip_info.get_gfx()`` under ``GPU_ARCHS=";".join(archs)``: the last entry of the list."""
    return archs[-1]


def aiter_hip_flags(
    version: tuple[int, ...], archs: tuple[str, ...], extra_hip: list[str], fp4x2: str = "1"
) -> list[str]:
    """build_module's ``flags_hip`` for this HIP version and archs (``fp4x2``: ``AITER_FP4x2``), less
    ``DROPPED`` (before the checker)."""
    flags = list(BUILD_MODULE_HIP)
    for flag, above, upto in VERSION_GATED:
        if (above is None or version > above) and (upto is None or version <= upto):
            flags.append(flag)
    if aiter_gfx(archs) == "gfx950" and int(fp4x2) > 0:
        flags.append(FP4_DEFINE)
    flags += extra_hip + [f"--offload-arch={a}" for a in archs]
    return [f for f in sorted(set(flags)) if f not in DROPPED]


def aiter_generators(records: list[dict[str, Any]], archs: tuple[str, ...]) -> list[list[str]]:
    """The argv (after ``python``) of each of a module's plan generators as AITER's build runs it: a
    per-arch asm generator only for ``get_asm_dir()``'s arch, without the ``--targets=`` qola puts just
    after CK's script (a command's own ``--targets`` elsewhere stays)."""
    out = []
    for g in records:
        script = g["argv"][0] if g["argv"] else ""
        if (m := _ASM_DIR.search(script)) and m.group(1) != aiter_gfx(archs):
            continue
        argv = list(g["run_argv"])
        at = argv.index(script) + 1 if script in argv else len(argv)
        if at < len(argv) and argv[at].startswith("--targets=") and f"{script} --targets=" in g["command"]:
            del argv[at]
        out.append(argv)
    return out


def aiter_gen_env(
    archs: tuple[str, ...], aiter: Path, env: Mapping[str, str], tools: Path | None = None
) -> dict[str, str]:
    """The generators' environment in AITER's build: the caller's, ``GPU_ARCHS`` and the
    ``AITER_ASM_DIR`` ``core.py`` exports at import (``<meta>/hsa/<get_gfx()>/``); ``tools`` (a
    parseable ``hipconfig``) first on PATH."""
    meta = aiter / "aiter_meta" if (aiter / "aiter_meta").is_dir() else aiter
    path = {"PATH": f"{tools}{os.pathsep}{env.get('PATH', os.defpath)}"} if tools else {}
    return {**env, **path, "GPU_ARCHS": ";".join(archs), "AITER_ASM_DIR": f"{meta}/hsa/{aiter_gfx(archs)}/"}


def schedule(pairs: int, first: str = "qola") -> list[tuple[int, str]]:
    """(pair, side) in run order: ABAB — each pair starts with the side the previous one ended with."""
    if pairs < 1:
        raise SystemExit("vs_aiter: --pairs needs at least one pair")
    a, b = (first, next(s for s in SIDES if s != first))
    return [(i, s) for i in range(pairs) for s in ((a, b) if i % 2 == 0 else (b, a))]


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
    return (r := resource.getrusage(resource.RUSAGE_CHILDREN)).ru_utime + r.ru_stime


def shell(cmd: str, log: Path, env: Mapping[str, str] | None = None) -> tuple[float, float, int]:
    """(CPU, wall, exit code) of one shell command run to completion (``wait4`` on it), appended to ``log``."""
    t0 = time.perf_counter()
    with open(log, "ab") as fh:
        proc = subprocess.Popen(cmd, shell=True, stdout=fh, stderr=subprocess.STDOUT, env=env)
        _, status, ru = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        fh.write(f"\n[vs_aiter] exit code {proc.returncode}: {cmd[:200]}\n".encode())
    return ru.ru_utime + ru.ru_stime, time.perf_counter() - t0, proc.returncode


def run_unit(cmd: str, log: Path, env: Mapping[str, str] | None = None) -> tuple[float, float]:
    """(CPU, wall) of a command that must succeed (a compile, a link): a failure stops the bench."""
    cpu, wall, rc = shell(cmd, log, env)
    if rc != 0:
        raise SystemExit(f"vs_aiter: a reference command failed ({rc}); see {log}")
    return cpu, wall


def check_flags(flags: list[str], log: Path, seen: dict[str, bool]) -> tuple[list[str], float, float]:
    """hip_flag_checker, timed: (the flags hipcc takes on an empty preprocess, CPU, wall); ``seen`` is
    its ``lru_cache`` (one per AITER process, so across modules)."""
    cpu = wall = 0.0
    for f in flags:
        if f not in seen:
            c, w, rc = shell(f"hipcc {f} -x hip -E -P /dev/null -o /dev/null", log)
            seen[f], cpu, wall = rc == 0, cpu + c, wall + w
    return [f for f in flags if seen[f]], cpu, wall


def run_qola(args: list[str], env: dict[str, str], log: Path, out: Path | None = None) -> tuple[float, float]:
    """(CPU, wall) of ``python -m qola ARGS``; stdout to ``out`` when given, else with stderr to ``log``."""
    cpu0, t0 = child_cpu(), time.perf_counter()
    with open(log, "wb") as fh, open(out or os.devnull, "wb") as so:
        rc = subprocess.run([sys.executable, "-m", "qola", *args], stdout=so if out else fh, stderr=fh, env=env)
    wall, cpu = time.perf_counter() - t0, child_cpu() - cpu0
    if rc.returncode != 0:
        raise SystemExit(f"vs_aiter: qola failed; see {log}")
    return cpu, wall


def ninja_units(build_dir: Path) -> list[str]:
    """Outputs of the compile edges ninja ran (``.ninja_log`` v5: start, end, mtime, output, hash)."""
    rows = [ln.split("\t") for log in build_dir.rglob(".ninja_log") for ln in log.read_text().splitlines()[1:]]
    return sorted({r[3] for r in rows if len(r) > 3 and r[3].endswith(".o")})


@dataclass(frozen=True)
class Slice:
    """What every run of one slice shares."""

    name: str
    archs: tuple[str, ...]
    aiter: Path
    work: Path
    jobs: int
    manifest: Path
    plan: dict[str, Any]  # qola plan --json: each module's generators

    @property
    def modules(self) -> tuple[str, ...]:
        return tuple(m["name"] for m in self.plan["modules"])


def prepare(name: str, aiter: Path, work: Path, jobs: int, tiny: bool) -> tuple[Slice, dict[str, float]]:
    """The slice's manifest and its cold ``qola plan --json`` (the reference's generator commands)."""
    d = work / f"plan-{name}"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    m = slice_manifest(d / "te.toml", SLICES[name], tiny=tiny)
    env = {**os.environ, "PYTHONPATH": str(REPO), "XDG_CACHE_HOME": str(d / "cache")}
    args = ["plan", "-m", str(m), "-a", str(aiter), "--skip-checkout", "--allow-unpinned", "--json"]
    cpu, wall = run_qola(args, env, work / f"plan-{name}.log", d / "plan.json")
    plan = json.loads((d / "plan.json").read_text())
    return Slice(name, SLICES[name], aiter, work, jobs, m, plan), {"cpu": cpu, "wall": wall}


def qola_run(sl: Slice, pair: int) -> dict[str, Any]:
    d = sl.work / f"qola-{sl.name}{pair}"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    env = {**os.environ, "PYTHONPATH": str(REPO), "XDG_CACHE_HOME": str(d / "cache")}
    args = ["build", "-m", str(sl.manifest), "-a", str(sl.aiter), "-j", str(sl.jobs), "--skip-checkout",
            "--allow-unpinned", "-o", str(d / "out"), "--build-dir", str(d / "bd"), "-v"]  # fmt: skip
    cpu, wall = run_qola(args, env, sl.work / f"qola-{sl.name}{pair}.log")
    libs = {mod: d / "out" / "lib" / f"te_{mod}.so" for mod in sl.modules}
    return {"cpu": cpu, "wall": wall, "all_cpu": cpu, "all_wall": wall, "gen_cpu": 0.0, "gen_wall": 0.0,
            "units": ninja_units(d / "bd"), "libs": libs}  # fmt: skip


def aiter_module(sl: Slice, mod: str, d: Path, seen: dict[str, bool], acc: dict[str, Any]) -> None:
    """build_module for one module: flag checks, generators, compiles, link; times added to ``acc``."""
    meta, logs = sl.aiter / "aiter_meta", d / "logs"
    ck = meta / "3rdparty" / "composable_kernel"
    extra_hip, extra_inc = module_config(sl.aiter, mod)
    wanted = aiter_hip_flags(acc["version"], sl.archs, extra_hip, os.environ.get("AITER_FP4x2", "1"))  # noqa: SIM112
    flags, c, w = check_flags(wanted, logs / "flag_checker.log", seen)
    acc["check_cpu"], acc["check_wall"] = acc["check_cpu"] + c, acc["check_wall"] + w
    blob, build = d / mod / "blob", d / mod / "build"
    blob.mkdir(parents=True)
    build.mkdir()
    gens = next(m["generators"] for m in sl.plan["modules"] if m["name"] == mod)
    env = aiter_gen_env(sl.archs, sl.aiter, os.environ, d / "tools")
    for argv in aiter_generators(gens, sl.archs):  # a failure stops the bench (AITER's os.system goes on)
        line = shlex.join([sys.executable, *(a.replace("{}", str(blob)) for a in argv)])
        c, w = run_unit(line, logs / f"{mod}-generators.log", env)
        acc["gen_cpu"], acc["gen_wall"] = acc["gen_cpu"] + c, acc["gen_wall"] + w
        acc["generators"].append({"cmd": line, "cpu": round(c, 2), "wall": round(w, 2)})
    incs = [meta / "3rdparty" / "ck_helper", ck / "include", ck / "library" / "include", meta / "csrc" / "include",
            blob, *extra_inc, meta / "csrc" / "include" / "torch"]  # fmt: skip
    srcs = sorted(p for p in blob.rglob("*") if p.suffix in (".cpp", ".cu"))
    cmds = {s.name: aiter_compile(s, build / f"{s.stem}.cuda.o", incs, flags, acc["rocm"]) for s in srcs}
    cpu0, t0 = child_cpu(), time.perf_counter()
    with ThreadPoolExecutor(max_workers=sl.jobs) as pool:
        futs = {n: pool.submit(run_unit, cmd, logs / f"{mod}-{n}.log") for n, cmd in cmds.items()}
        for n, fut in futs.items():
            c, w = fut.result()
            acc["units"][f"{mod}/{n}"] = {"cpu": round(c, 2), "wall": round(w, 2), "cmd": cmds[n]}
    rsp = build / f"{mod}.so.rsp"
    rsp.write_text(" ".join(str(o) for o in sorted(build.glob("*.cuda.o"))))
    acc["libs"][mod] = build / f"{mod}.so"
    run_unit(aiter_link(rsp, acc["libs"][mod], acc["rocm"]), logs / f"{mod}-link.log")
    acc["cpu"], acc["wall"] = acc["cpu"] + child_cpu() - cpu0, acc["wall"] + time.perf_counter() - t0


def aiter_run(sl: Slice, pair: int) -> dict[str, Any]:
    """AITER's build of the slice's modules, one after the other: ``cpu``/``wall`` its compiles and links,
    ``gen_*`` its generators and flag checks, ``all_*`` both."""
    d = sl.work / f"aiter-{sl.name}{pair}"
    shutil.rmtree(d, ignore_errors=True)
    (d / "logs").mkdir(parents=True)
    said = subprocess.run(["hipconfig", "--version"], capture_output=True, text=True).stdout.strip()
    version = hip_version(said)
    (d / "tools").mkdir()  # Debian's hipconfig is hipcc, which prints "HIP version: …" to AITER's realpath call:
    write_if_changed(d / "tools" / "hipconfig", shim_text(said, shutil.which("hipconfig")), mode=0o755)  # as qola
    rocm = Path(shutil.which("hipcc") or "/usr/bin/hipcc").resolve().parent.parent
    acc: dict[str, Any] = {"version": version, "rocm": rocm, "units": {}, "libs": {}, "generators": []}
    acc.update(dict.fromkeys(("cpu", "wall", "check_cpu", "check_wall", "gen_cpu", "gen_wall"), 0.0))
    seen: dict[str, bool] = {}
    for mod in sl.modules:  # build_module: one module's graph after the other
        aiter_module(sl, mod, d, seen, acc)
    acc["checks"] = seen
    acc["gen_cpu"], acc["gen_wall"] = acc["gen_cpu"] + acc["check_cpu"], acc["gen_wall"] + acc["check_wall"]
    acc["all_cpu"], acc["all_wall"] = acc["cpu"] + acc["gen_cpu"], acc["wall"] + acc["gen_wall"]
    return acc


def finish_slice(sl: Slice, plan: dict[str, float], runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The slice's record: its runs, every pair's kernels compared by name and by ``.text``, library sizes."""
    return {"slice": sl.name, "archs": sl.archs, "plan": plan, "runs": runs, "checks": pair_checks(sl.modules, runs)}


def one_slice(name: str, args: argparse.Namespace, work: Path, results: list[dict[str, Any]]) -> None:
    sl, plan = prepare(name, args.aiter_root, work, args.jobs, args.tiny)
    print(f"[vs_aiter] slice {name} ({'+'.join(sl.archs)}): cold plan {plan['cpu']:.0f} s CPU", flush=True)
    runs: list[dict[str, Any]] = []
    for pair, side in schedule(args.pairs, args.first):
        load0 = os.getloadavg()[0]
        print(f"[vs_aiter] slice {name} pair {pair}: {side} (load {load0:.1f})", flush=True)
        r = qola_run(sl, pair) if side == "qola" else aiter_run(sl, pair)
        r.update(side=side, pair=pair, load=[load0, os.getloadavg()[0]])
        runs.append(r)
        print(f"[vs_aiter] slice {name} pair {pair}: {side} {r['cpu']:.0f} s CPU (+ {r['gen_cpu']:.0f} generators "
              f"and flag checks), {r['all_wall']:.0f} s wall, load {r['load'][1]:.1f}", flush=True)  # fmt: skip
        (work / f"runs-{name}.json").write_text(json.dumps(runs, indent=1, default=str))
    results.append(finish_slice(sl, plan, runs))
    (work / "results.json").write_text(json.dumps(results, indent=1, default=str))


def report_only(work: Path) -> int:
    """Print (and write to ``report.md``) the tables of the run in ``work``, its kernel checks redone."""
    if not (work / "results.json").is_file():
        raise SystemExit(f"vs_aiter: {work / 'results.json'} not found: --report-only needs a finished run's work dir")
    text = table(report(json.loads((work / "results.json").read_text())))
    (work / "report.md").write_text(text + "\n")
    print(text)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work-dir", type=Path, default=REPO / "build" / "vs_aiter", help="logs, builds, results.json")
    ap.add_argument("--aiter-root", type=Path, help="the unpacked amd-aiter sdist (default: tests/support/aiter_sdist)")
    ap.add_argument("-j", "--jobs", type=int, default=2, help="parallel compiles, both sides (default 2)")
    ap.add_argument("--slices", default="AB", help="A: gfx942; B: gfx942+gfx950 (default AB)")
    ap.add_argument("--pairs", type=int, default=2, help="pairs of runs per slice, ABAB (default 2)")
    ap.add_argument("--first", choices=SIDES, default="qola", help="the side pair 0 starts with (default qola)")
    ap.add_argument("--tiny", action="store_true", help="the forward module and one kernel: a check, not a measurement")
    ap.add_argument(
        "--report-only",
        action="store_true",
        help="build nothing: the tables of the run in --work-dir (results.json, the libraries it kept)",
    )
    args = ap.parse_args(argv)
    if args.report_only:
        return report_only(args.work_dir.resolve())
    if bad := set(args.slices) - set(SLICES):
        ap.error(f"--slices: unknown slice(s) {''.join(sorted(bad))}; known: {''.join(SLICES)}")
    schedule(args.pairs)  # a bad --pairs fails before any work
    if args.aiter_root is None:
        from support.aiter_sdist import aiter_root  # lazy: tests/ is on the path only for this script

        args.aiter_root = aiter_root()
    args.aiter_root = args.aiter_root.resolve()
    work = args.work_dir.resolve()
    work.mkdir(parents=True, exist_ok=True)
    results: list[dict[str, Any]] = []
    for s in args.slices:
        one_slice(s, args, work, results)
    print(table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
