"""qola beside QoLA (ROCm/QoLA) on the same tree, manifest and archs: what a consumer sees (issue 40, item 3).

Given a QoLA checkout (a path; its commit is ``git rev-parse HEAD`` or its ``COMMIT`` file; it is copied,
never changed, never committed here), both tools build one slice of TE's manifest shape
(``bench/_slices.py``: ``tiny``, ``A``, ``B`` = TE's two-arch slice) from one copy of the amd-aiter sdist
in the ROCm 7 chroot, one after the other, with fresh output dirs. Compared, side by side: the CK files
each generated per direction, the exported and undefined dynamic symbols of each library (``nm -DC``),
the kernels per arch in each library's ``.hip_fatbin`` (``qola.output.kernels.device_code_objects``)
and each kernel's machine code (its ``.text`` bytes, hashed: ``bench/_kernels.py``), the public headers' declarations, and the output layout (relative file list); plus each side's CPU
(children's rusage) and wall. One table; ``results.json`` and the logs go under the work dir.

    QOLA_ROCM7_BIND=/work/scratch bash scripts/rocm7.sh run \\
        python bench/vs_qola.py /work/scratch/qola-src --slice B [-j 2] [--work-dir build/vs_qola]
    python bench/vs_qola.py --report-only --work-dir build/vs_qola   # the table again, from the files kept

``--report-only`` builds nothing: it redoes the comparison from the work dir a run left (both sides'
output dirs, qola's generated files, QoLA's ``_jit_build/``; CPU and wall from ``results.json``), prints
it and writes ``report.md`` there. It needs ``nm`` and pyelftools, not the chroot.

Known differences (the table's "docs" column names the key; docs/coming-from-qola.md explains each):

- ``output-dir``: QoLA leaves AITER's build dir (``_jit_build/``: objects, generated sources) and its
  embedded-code-object headers (``_embedded_hsa/``) in the output dir, and copies
  ``configs/model_configs/`` whole (its ``README.md`` too); qola keeps its build files in
  ``--build-dir``, copies the CSVs only, and adds ``.qola/``, ``share/``, ``logs/``, ``lib/pkgconfig/``
  and ``include/qola_embedded_<module>.h`` (``output`` rows).
- ``drop-directions``: a dropped direction keeps its dispatch file in qola where code that stays
  calls it (CK files of ``fwd_splitkv``/``batch_prefill``: one ``*_api`` file each), so qola links
  ``--no-undefined``; QoLA's library has those dispatch symbols undefined (``drop_directions`` row).
- ``const-ref``: qola's entry points take every class the tree passes by value by const reference, as
  QoLA's hand-written wrappers take ``mha_fwd_args``; on the sdist the tree also passes ``std::string``
  by value, which QoLA's W9-ported wrapper keeps (``exported symbols`` rows). On TE's pins (two
  parameters) both mangle the same.
- ``version-symbol``: qola exports ``<ns>_qola_version`` from every library (``exported symbols``).
- ``embedded-headers``: qola ships ``qola_embedded_<module>.h`` in ``include/`` (``public header files``).
- ``header-macros``: ``qola_common.h`` / ``qola_config.h`` hold every QoLA macro and qola's own.
- ``alias-spelling``: qola's generated ``qola_mha_*.h`` spell the tree's types through aliases
  (``aiter::qola_api_<ns>::``): same functions, other text.
- ``bwd-workspace``: QoLA's ``qola_mha_bwd.h`` declares ``mha_bwd_workspace_size``, which neither
  library defines where CK lacks ``fmha_bwd_launcher`` (the sdist; qola's plan says so).
- ``variants``: QoLA applies ``[[mha_*_variants]]`` in pybind mode only; a cpp_itfs module builds
  every kernel of the receipt. So that both build the same kernels, QoLA gets qola's generator commands
  with their variant filters (W10) (``[[mha_fwd_variants]]`` row).

Workarounds QoLA needs on this tree (all at run time, on scratch copies; W-numbers as in _qola_port):

- W1 the sdist keeps ``csrc/``, ``hsa/``, ``3rdparty/`` under ``aiter_meta/``; QoLA's resolver and
  its patches want them at the root (a git tree): the tree copy is moved to that layout, and made a git
  repo (``--skip-checkout`` needs ``.git``). QoLA's patches are tried with ``git apply --check``; on the
  0.1.7.post2.dev18 sdist none applies (0001-0003, 0005: other context; 0004, 0006, 0007: their
  ``csrc/cpp_itfs/mha_bwd.cu`` is not in the sdist), so both tools build the unpatched tree.
- W2 ``build_module`` copies a non-Python library to ``<tree>/op_tests/cpp/mha``; the sdist has no such
  dir (the copy fails and QoLA dies on the ``SystemExit``): it is created in the tree copy.
- W3 Debian's ``hipconfig`` is a link to ``hipcc``; AITER's ``executable_path`` resolves links, so
  ``hipconfig --version`` ran as ``hipcc --version`` ("HIP version: …" broke the int parse): a
  ``hipconfig`` script first on QoLA's PATH.
- W4 QoLA execs core.py's ``# config_env`` block for ``AITER_CONFIGS``: this core.py's block uses
  ``logger`` and ``re`` (not in QoLA's exec namespace) and defines no ``AITER_CONFIGS``: the names are
  provided, and a missing singleton is ``None`` (the MHA modules' table entries never read it).
- W5 QoLA passes ``third_party=`` to ``build_module``, which this AITER does not take: left out.
- W6 ``build_module`` imports ``psutil`` (not in the chroot): a stub giving ``/proc/meminfo``'s
  MemAvailable. AITER caps ninja at ``int(0.8 × cores)`` jobs: 1 on a 2-core box (printed in the log).
- W7 both sides drop ``-mllvm -amdgpu-early-inline-all=true`` (Debian's clang 21: tens of minutes per
  CK bwd kernel): qola by ``drop_hip_flags``, QoLA in ``cpp_extension._jit_compile``'s hip flags.
- W8 QoLA's registry appends ``{AITER_META_DIR}/hsa/codegen.py -m fmha_v3_*``; the sdist has no such
  script (its table runs ``hsa/<gfx>/fmha_v3_*/codegen.py``): the entry is removed from the copy.
- W9 QoLA's wrappers call AITER's two-argument ``mha_fwd(args, stream_config)`` (its pinned AITER);
  the sdist declares the older 12- and 15-parameter forms: each wrapper's parameter list is rewritten
  to the tree's declaration (from qola's plan) and forwards every parameter; nothing else changes.
- W10 the slice's kernel selection (variants) reaches QoLA as ``blob_gen_cmd``: the generator commands
  qola's plan resolved, filters and its any-of filter wrapper included, as Python literals.
- W11 QoLA's ``receipt`` rewrites ``--receipt`` in every generator command, so ``mha_fwd_generate.py
  --receipt 5`` became 700 (KeyError in this AITER): the receipt reaches QoLA inside CK's commands.
- W12 ``qola`` is both tools' package name: QoLA runs with ``PYTHONPATH`` empty and its copy first on
  ``sys.path`` (the driver), qola with this repo's root.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "bench")]

from _kernels import compare_text, library_text  # noqa: E402
from _qola_port import DRIVER, HIPCONFIG, make_tree, prepare_qola, qola_commit, qola_manifest  # noqa: E402
from _slices import MODULES, NS, SLICES, child_cpu, slice_manifest  # noqa: E402

from qola.core import tomlfile  # noqa: E402  (the one TOML reader: tomllib, or tomli on 3.10)

DROP = ("-mllvm -amdgpu-early-inline-all=true",)
BUILD_DIRS = ("_jit_build", "_embedded_hsa")  # AITER's build dir and QoLA's headers, in QoLA's output
DIRECTIONS = ("fmha_fwd_splitkv", "fmha_batch_prefill", "fmha_pagedkv_prefill", "fmha_bwd", "fmha_fwd")
KNOWN = {
    "output-dir": "QoLA leaves _jit_build/, _embedded_hsa/ and configs/model_configs/README.md in the output; "
    "qola adds .qola/, share/, logs/, lib/pkgconfig/ and its embedded-code-object headers",
    "drop-directions": "qola keeps a dropped direction's dispatch file and links --no-undefined",
    "variants": "QoLA builds cpp_itfs variants only through the generator filters it is given (W10)",
    "const-ref": "qola takes every class the tree passes by value by const reference (std::string here); "
    "QoLA's W9 wrapper keeps the tree's by-value std::string",
    "version-symbol": "qola exports <ns>_qola_version from every library",
    "embedded-headers": "qola ships qola_embedded_<module>.h (its embedded code objects' index) in include/",
    "header-macros": "qola_common.h / qola_config.h: every QoLA macro, plus qola's own (C names, version, visibility)",
    "alias-spelling": "qola's generated headers spell the tree's types through aliases (aiter::qola_api_<ns>::)",
    "bwd-workspace": "QoLA's qola_mha_bwd.h declares mha_bwd_workspace_size, which neither library defines "
    "on a CK without fmha_bwd_launcher",
}
VERSION_SYMBOL = re.compile(r"\w+_qola_version\Z")


# ---- pure parts (tests/compile/test_bench_vs_qola.py) ----


def direction(stem: str) -> str | None:
    """The CK direction of a generated file's stem (longest prefix first), None for a non-CK file."""
    return next((d.removeprefix("fmha_") for d in DIRECTIONS if stem.startswith(d + "_")), None)


def ck_files(blob: Path) -> dict[str, set[str]]:
    """CK files per direction in a generator output dir (stems; ``.cpp`` and ``.cu`` alike)."""
    out: dict[str, set[str]] = {}
    for p in blob.rglob("*") if blob.is_dir() else ():
        if p.suffix in (".cpp", ".cu") and (d := direction(p.stem)):
            out.setdefault(d, set()).add(p.stem)
    return out


def strip_comments(text: str) -> str:
    return re.sub(r"//[^\n]*", "", re.sub(r"/\*.*?\*/", "", text, flags=re.S))


def header_decls(text: str) -> set[str]:
    """A header's consumer-visible declarations: ``#define NAME`` and each function declaration
    (attributes dropped, whitespace normalised), whatever ``#if`` they sit under."""
    text = strip_comments(text)
    decls = {f"#define {m}" for m in re.findall(r"^\s*#\s*define\s+(\w+)", text, flags=re.M)}
    body = re.sub(r"^\s*#[^\n]*(\\\n[^\n]*)*", "", text, flags=re.M)
    body = re.sub(r"__attribute__\s*\(\(.*?\)\)\s*", "", body, flags=re.S)
    for m in re.finditer(r"([\w:<>,\*&\s]+?\b\w+\s*\((?:[^()]|\([^()]*\))*\)\s*(?:const\s*)?);", body):
        decl = " ".join(m.group(1).split())
        decl = re.sub(r"\s*([(),&*])\s*", r"\1", decl).replace(",", ", ")
        if not decl.startswith(("return ", "using ", "typedef ")):
            decls.add(decl)
    return decls


def layout(out: Path) -> set[str]:
    """The output dir's files, relative (links listed as files)."""
    return {str(p.relative_to(out)) for p in out.rglob("*") if not p.is_dir()} if out.is_dir() else set()


def nm_symbols(text: str) -> tuple[set[str], set[str]]:
    """(defined, undefined) names from ``nm -DC`` output."""
    defined: set[str] = set()
    undefined: set[str] = set()
    for line in text.splitlines():
        parts = line.split(None, 2) if line[:1] != " " else ["", *line.split(None, 1)]
        if len(parts) == 3:
            (undefined if parts[1] in "Uw" else defined).add(parts[2])
    return defined, undefined


def row(aspect: str, ours: set[str], theirs: set[str], known: str = "") -> dict[str, Any]:
    """One table row: counts, same/differs, a short detail (a few names only on each side)."""
    only_q, only_Q = sorted(ours - theirs), sorted(theirs - ours)
    detail = "; ".join(
        f"{label} {len(names)}: {', '.join(names[:3])}{' …' if len(names) > 3 else ''}"
        for label, names in (("only qola", only_q), ("only QoLA", only_Q))
        if names
    )
    same = not only_q and not only_Q
    return {"aspect": aspect, "qola": len(ours), "QoLA": len(theirs), "same": same, "detail": detail,
            "docs": "" if same else known}  # fmt: skip


def layout_known(ours: set[str], theirs: set[str]) -> str:
    """``output-dir`` when every difference of the layouts is a path the docs name: qola's own dirs and
    embedded-code-object headers, QoLA's build dirs and the README its model_configs copy brings."""
    q_ok = ("share/", "logs/", "jit/", ".qola/", "lib/pkgconfig/", "include/qola_embedded_")
    Q_ok = (*(f"{d}/" for d in BUILD_DIRS), "configs/model_configs/README.md")
    known = all(p.startswith(q_ok) for p in ours - theirs) and all(p.startswith(Q_ok) for p in theirs - ours)
    return "output-dir" if known else ""


def _by_value(sym: str) -> str:
    """A demangled signature with every parameter's ``const&`` dropped (by value and by const reference alike)."""
    return re.sub(r" const&(?=[,)])", "", sym)


def exports_known(ours: set[str], theirs: set[str]) -> str:
    """The keys that explain every difference of two libraries' exports (``""`` when one is unexplained)."""
    version = {s for s in ours - theirs if VERSION_SYMBOL.match(s)}
    rest_q, rest_Q = ours - version, set(theirs)
    if {_by_value(s) for s in rest_q} != {_by_value(s) for s in rest_Q}:
        return ""
    return ", ".join(k for k, hit in (("const-ref", rest_q != rest_Q), ("version-symbol", bool(version))) if hit)


def _function(decl: str) -> str:
    m = re.search(r"(\w+)\(", decl)
    return m.group(1) if m else ""


def decls_known(ours: set[str], theirs: set[str], exported: set[str]) -> str:
    """The keys that explain every difference of a public header's declarations on the two sides."""
    only_q, only_Q = ours - theirs, theirs - ours
    if only_q and not only_Q and all(d.startswith("#define ") for d in only_q):
        return "header-macros"
    q_funcs = {_function(d) for d in only_q if not d.startswith("#define ")}
    keys = []
    for d in only_Q:
        f = _function(d)
        if f and f in q_funcs and all("qola_api_" in x for x in only_q if _function(x) == f):
            keys.append("alias-spelling")
        elif f and not any(f"::{f}(" in s or s.startswith(f"{f}(") for s in exported):
            keys.append("bwd-workspace" if f == "mha_bwd_workspace_size" else "")
        else:
            keys.append("")
    guards = {d for d in only_q if d.startswith("#define ") and d.endswith("_H")}
    if "" in keys or any(_function(d) not in {_function(x) for x in only_Q} for d in only_q - guards):
        return ""
    return ", ".join(sorted(set(keys), key=list(KNOWN).index))


def ck_known(d: str, ours: set[str], theirs: set[str]) -> str:
    """``drop-directions`` when qola's extra files of a direction QoLA dropped are dispatch files alone."""
    extra = ours - theirs
    return "drop-directions" if not theirs and extra and all(s.endswith("_api") for s in extra) else ""


def table(rows: list[dict[str, Any]]) -> str:
    out = ["| aspect | qola | QoLA | same? | detail | docs |", "|---|---:|---:|---|---|---|"]
    for r in rows:
        same = "same" if r["same"] else "differs"
        out.append(f"| {r['aspect']} | {r['qola']} | {r['QoLA']} | {same} | {r['detail']} | {r['docs']} |")
    return "\n".join(out)


# ---- the two builds ----


def run_logged(cmd: list[str], env: dict[str, str], log: Path) -> dict[str, Any]:
    """CPU (children's rusage), wall and exit status of one command, its output in ``log``."""
    cpu0, t0 = child_cpu(), time.perf_counter()
    with open(log, "wb") as fh:
        rc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env).returncode
    return {"cpu": round(child_cpu() - cpu0, 1), "wall": round(time.perf_counter() - t0, 1), "rc": rc, "log": str(log)}


def ours_side(slice_: str, tree: Path, work: Path, jobs: int) -> dict[str, Any]:
    """qola: the plan (untimed, own cache; its generators and API feed QoLA's side), then the build."""
    d = work / "qola"
    d.mkdir(parents=True)
    m = slice_manifest(d / "te.toml", slice_)
    env = {**os.environ, "PYTHONPATH": str(REPO), "XDG_CACHE_HOME": str(d / "cache-plan")}
    common = ["-m", str(m), "-a", str(tree), "--skip-checkout", "--allow-unpinned"]
    plan = subprocess.run([sys.executable, "-m", "qola", "plan", *common, "--json"], env=env, capture_output=True,
                          text=True)  # fmt: skip
    (d / "plan.json").write_text(plan.stdout)
    (work / "qola-plan.log").write_text(plan.stderr)
    if plan.returncode != 0:
        raise SystemExit(f"vs_qola: qola plan failed; see {work / 'qola-plan.log'}")
    env["XDG_CACHE_HOME"] = str(d / "cache")
    cmd = [sys.executable, "-m", "qola", "build", *common, "-o", str(d / "out"), "--build-dir", str(d / "bd"),
           "-j", str(jobs), "-v"]  # fmt: skip
    res = run_logged(cmd, env, work / "qola-build.log")
    return {**res, "out": d / "out", "gen": d / "bd" / "gen", "plan": json.loads(plan.stdout), "manifest": m}


def theirs_side(src: Path, tree: Path, work: Path, jobs: int, ours: dict[str, Any]) -> dict[str, Any]:
    """QoLA: a scratch copy with W8/W9, the slice's manifest in QoLA's terms, its CLI under the driver."""
    d = work / "QoLA"
    d.mkdir(parents=True)
    changed = prepare_qola(src, d / "src", tree, ours["plan"])
    m = d / "te.toml"
    m.write_text(qola_manifest(tomlfile.loads(ours["manifest"].read_text()), ours["plan"]))
    (d / "shim").mkdir()
    (d / "shim" / "hipconfig").write_text(HIPCONFIG)
    (d / "shim" / "hipconfig").chmod(0o755)
    (d / "driver.py").write_text(DRIVER)
    env = {**os.environ, "PYTHONPATH": "", "MAX_JOBS": str(jobs), "PATH": f"{d / 'shim'}:{os.environ['PATH']}"}
    cmd = [sys.executable, str(d / "driver.py"), str(d / "src"), str(tree), "|".join(DROP),
           "build", "-m", str(m), "-a", str(tree), "-o", str(d / "out"), "--skip-checkout", "-v"]  # fmt: skip
    res = run_logged(cmd, env, work / "QoLA-build.log")
    return {**res, "out": d / "out", "gen": d / "out" / "_jit_build" / "build", "changed": changed}


# ---- comparing what a consumer sees ----


def nm(lib: Path) -> tuple[set[str], set[str]]:
    if not lib.is_file():
        return set(), set()
    return nm_symbols(subprocess.run(["nm", "-DC", str(lib)], capture_output=True, text=True).stdout)


def kernels(lib: Path) -> dict[str, list[str]]:
    from qola.output.kernels import device_code_objects

    return device_code_objects(lib) if lib.is_file() else {}


def module_rows(mod: str, ours: dict[str, Any], theirs: dict[str, Any], archs: tuple[str, ...]) -> list[dict[str, Any]]:
    rows = []
    q_ck, Q_ck = ck_files(ours["gen"] / mod), ck_files(theirs["gen"] / f"{NS}_{mod}" / "blob")
    for d in sorted(set(q_ck) | set(Q_ck)):
        a, b = q_ck.get(d, set()), Q_ck.get(d, set())
        rows.append(row(f"CK files {mod} {d}", a, b, ck_known(d, a, b)))
    lib = f"lib/{NS}_{mod}.so"
    (q_def, q_und), (Q_def, Q_und) = nm(ours["out"] / lib), nm(theirs["out"] / lib)
    rows.append(row(f"exported symbols {mod}", q_def, Q_def, exports_known(q_def, Q_def)))
    dropped = ("splitkv", "batch_prefill")
    und_known = "drop-directions" if q_und <= Q_und and all(any(x in s for x in dropped) for s in Q_und - q_und) else ""
    rows.append(row(f"undefined symbols {mod}", q_und, Q_und, und_known))
    q_k, Q_k = kernels(ours["out"] / lib), kernels(theirs["out"] / lib)
    for arch in sorted(set(archs) | set(q_k) | set(Q_k)):
        rows.append(row(f"kernels {mod} {arch}", set(q_k.get(arch, ())), set(Q_k.get(arch, ()))))
    q_t, Q_t = library_text(ours["out"] / lib), library_text(theirs["out"] / lib)
    for t in compare_text(mod, q_t, Q_t):
        rows.append({"aspect": f"kernels .text {mod} {t.arch}", "qola": len(q_t.get(t.arch, {})),
                     "QoLA": len(Q_t.get(t.arch, {})), "same": t.same, "detail": t.text(), "docs": ""})  # fmt: skip
    return rows


def header_rows(ours: Path, theirs: Path, exported: set[str]) -> list[dict[str, Any]]:
    """The public headers (``exported``: what either side's libraries define, for declarations of nothing)."""
    q = {p.name: p for p in (ours / "include").glob("*.h")}
    Q = {p.name: p for p in (theirs / "include").glob("*.h")}
    extra = set(q) - set(Q)
    embedded = (
        "embedded-headers"
        if extra and not set(Q) - set(q) and all(n.startswith("qola_embedded_") for n in extra)
        else ""
    )
    rows = [row("public header files", set(q), set(Q), embedded)]
    for name in sorted(set(q) & set(Q)):
        a, b = header_decls(q[name].read_text()), header_decls(Q[name].read_text())
        rows.append(row(f"declarations {name}", a, b, decls_known(a, b, exported)))
    return rows


def compare(slice_: str, ours: dict[str, Any], theirs: dict[str, Any]) -> list[dict[str, Any]]:
    rows = [r for mod in MODULES[slice_] for r in module_rows(mod, ours, theirs, SLICES[slice_])]
    libs = [side["out"] / "lib" / f"{NS}_{mod}.so" for mod in MODULES[slice_] for side in (ours, theirs)]
    rows += header_rows(ours["out"], theirs["out"], {s for lib in libs for s in nm(lib)[0]})
    q_l, Q_l = layout(ours["out"]), layout(theirs["out"])
    build = {p for p in Q_l | q_l if p.split("/")[0] in BUILD_DIRS}
    rows.append(row("output: build dirs (_jit_build/, _embedded_hsa/)", q_l & build, Q_l & build, "output-dir"))
    rows.append(
        row("output layout, the rest (files)", q_l - build, Q_l - build, layout_known(q_l - build, Q_l - build))
    )
    return rows


def sides(work: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """Where each side's output and generated files are in a work dir (as ours_side/theirs_side leave them)."""
    q, Q = work / "qola", work / "QoLA"
    return {"out": q / "out", "gen": q / "bd" / "gen"}, {"out": Q / "out", "gen": Q / "out" / "_jit_build" / "build"}


def render(result: dict[str, Any]) -> str:
    """The table and the CPU/wall line of a run's results."""
    q, Q, commit = result["qola"], result["QoLA"], result["qola_commit"]
    ratio = f"{q['cpu'] / Q['cpu']:.2f}x" if Q.get("cpu") else "n/a"
    return (f"{table(result['rows'])}\n\nCPU s / wall s: qola {q['cpu']} / {q['wall']} (rc {q['rc']}); "
            f"QoLA {Q['cpu']} / {Q['wall']} (rc {Q['rc']}); CPU qola / QoLA {ratio}; QoLA {commit[:12]}; "
            f"patches applied: {result['patches']['applied'] or 'none'}")  # fmt: skip


def report_only(work: Path) -> int:
    """The table of the run in ``work`` redone from what it kept (no build); also into ``report.md``."""
    if not (work / "results.json").is_file():
        raise SystemExit(f"vs_qola: {work / 'results.json'} not found: --report-only needs a finished run's work dir")
    result = json.loads((work / "results.json").read_text())
    ours, theirs = sides(work)
    result["rows"] = compare(result["slice"], ours, theirs)
    text = render(result)
    (work / "report.md").write_text(text + "\n")
    print(text)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("qola_src", type=Path, nargs="?", help="a QoLA checkout (copied, never changed)")
    ap.add_argument("--slice", default="B", choices=sorted(SLICES), help="bench/_slices.py (default B: TE's two arch)")
    ap.add_argument("-j", "--jobs", type=int, default=2, help="parallel compiles, both sides (default 2)")
    ap.add_argument("--work-dir", type=Path, default=REPO / "build" / "vs_qola", help="tree, builds, logs, results")
    ap.add_argument("--aiter-root", type=Path, help="the unpacked amd-aiter sdist (default: tests' cached one)")
    ap.add_argument(
        "--report-only",
        action="store_true",
        help="build nothing: the table of the run in --work-dir, redone from the files it kept",
    )
    args = ap.parse_args(argv)
    if args.report_only:
        return report_only(args.work_dir.resolve())
    if args.qola_src is None:
        ap.error("a QoLA checkout is needed (or --report-only)")
    if args.aiter_root is None:
        sys.path.insert(0, str(REPO / "tests"))
        from support.aiter_sdist import aiter_root

        args.aiter_root = aiter_root()
    work, src = args.work_dir.resolve(), args.qola_src.resolve()
    subprocess.run(["rm", "-rf", "--one-file-system", str(work)], check=True)
    work.mkdir(parents=True)
    commit = qola_commit(src)
    print(f"[vs_qola] slice {args.slice} ({'+'.join(SLICES[args.slice])}), QoLA {commit}; tree copy", flush=True)
    patches = make_tree(args.aiter_root, work / "tree", src / "patches" / "aiter")
    ours = ours_side(args.slice, work / "tree", work, args.jobs)
    print(f"[vs_qola] qola: rc {ours['rc']}, {ours['cpu']} s CPU, {ours['wall']} s wall; QoLA build", flush=True)
    theirs = theirs_side(src, work / "tree", work, args.jobs, ours)
    print(f"[vs_qola] QoLA: rc {theirs['rc']}, {theirs['cpu']} s CPU, {theirs['wall']} s wall", flush=True)
    rows = compare(args.slice, ours, theirs)
    side = {k: v for k, v in ours.items() if k in ("cpu", "wall", "rc", "log")}
    result = {"slice": args.slice, "archs": SLICES[args.slice], "qola_commit": commit, "patches": patches,
              "qola": side, "QoLA": {k: v for k, v in theirs.items() if k in ("cpu", "wall", "rc", "log", "changed")},
              "rows": rows}  # fmt: skip
    (work / "results.json").write_text(json.dumps(result, indent=1, default=str))
    print(render(result))
    return 0 if ours["rc"] == 0 and theirs["rc"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
