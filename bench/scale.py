"""Rebuild cost at scale: qola's own time around ninja on synthetic trees, with a stub compiler.

A synthetic AITER-shaped tree (``aiter/jit/optCompilerConfig.json``, ``aiter/jit/core.py``, one
generator script per module under ``csrc/syn``) is written into a temp dir for each case: N
generated instances in one module, or split over 20. The "compiler" is a tiny C program (built
once with ``cc``) that answers qola's nvcc probes and, for a compile, writes a fixed empty object
and the depfile ninja expects: the times measured are qola's and ninja's own (the link is the
host ``c++`` linking N empty objects, the same in both).

Columns (seconds, wall; one run unless ``--repeat``, then the median):

* plan        ``qola plan --json``
* dry run     ``qola build --dry-run`` into a fresh build dir (generators run)
* full build  ``qola build`` from nothing: wall, ninja's span (first edge start to last edge end,
              from ``.ninja_log``) and qola's overhead = wall - span; ``write`` is the time of
              ``qola.compile.ninja.write`` (build.ninja) in that build
* no-op       ``qola build`` again vs plain ``ninja -C BUILD`` on the same build dir
* touch 1     one instance source's mtime bumped: ``qola build`` vs ``ninja -C BUILD`` (the same
              rebuild: one object and the link)
* gen edit    a comment appended to every generator script: ``qola build`` wall and the number of
              objects recompiled (object files whose mtime changed)

    python bench/scale.py [--sizes 1000,5000,25000] [--modules 1,20] [-j 2] [--repeat 3]
                          [--qola-src SRC] [--keep DIR]

``--qola-src``: the directory holding the ``qola`` package to measure (put first on PYTHONPATH; default: the one
this interpreter imports). Standard library only (plus qola, in the child processes).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # the module-table entry helper
from support.module_table import entry

NS = "sy"
GENERATOR = '''\
#!/usr/bin/env python3
"""Synthetic instance generator for module {module} (bench/scale.py)."""
import argparse
import os

p = argparse.ArgumentParser()
p.add_argument("--count", type=int, required=True)
p.add_argument("--output_dir", required=True)
a = p.parse_args()
for i in range(a.count):
    # like CK's generators: every file written, whether or not it changed
    with open(os.path.join(a.output_dir, f"{module}_inst_{{i:05d}}.cu"), "w") as fh:
        fh.write(f"// instance {{i}} of {module}\\nstatic const int {module}_inst_{{i}} = {{i}};\\n")
with open(os.path.join(a.output_dir, "{module}_api.cu"), "w") as fh:  # the dispatcher: the one export
    fh.write(f"// the dispatcher over {{a.count}} instances of {module}\\n")
'''
CORE_PY = "import os\n# config_env start here\n# config_env end here\n"
STUB_C = r"""
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
static const unsigned char OBJ[] = {OBJ_BYTES};  /* an empty object */
static const unsigned char API[] = {API_BYTES};  /* one defining the module's export, NS_api */
static int put(const char *path, const void *data, size_t n) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || write(fd, data, n) != (ssize_t)n) { perror(path); return 1; }
    return close(fd) != 0;
}
int main(int argc, char **argv) {
    const char *out = 0, *dep = 0, *src = 0, *mt = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--version")) {
            puts("nvcc: NVIDIA (R) Cuda compiler driver\nCuda compilation tools, release 13.0, V13.0.88\n"
                 "Build qola-bench-stub");
            return 0;
        }
        if (!strcmp(a, "--list-gpu-code")) { puts("sm_90"); return 0; }
        if (!strcmp(a, "--dryrun")) { printf("#$ TOP=%s\n#$ _TARGET_DIR_=\n", TOP); return 0; }
        if (i + 1 < argc) {
            if (!strcmp(a, "-o")) out = argv[++i];
            else if (!strcmp(a, "-MF")) dep = argv[++i];
            else if (!strcmp(a, "-MT")) mt = argv[++i];
            else if (!strcmp(a, "-c")) src = argv[++i];
        }
    }
    if (!out || !src) { fprintf(stderr, "stub nvcc: no -c SRC -o OUT\n"); return 1; }
    size_t n = strlen(src);
    int api = n > 7 && !strcmp(src + n - 7, "_api.cu");
    if (api ? put(out, API, sizeof API) : put(out, OBJ, sizeof OBJ)) return 1;
    if (dep) {
        char buf[8192];
        int n = snprintf(buf, sizeof buf, "%s: %s\n", mt ? mt : out, src);
        if (n < 0 || n >= (int)sizeof buf || put(dep, buf, (size_t)n)) return 1;
    }
    return 0;
}
"""
# what runs qola in the child: the CLI, with qola.compile.ninja.write timed (the graph write's own cost)
DRIVER = textwrap.dedent("""\
    import atexit, json, sys, time
    import qola.compile.ninja as n
    spent, write = [], n.write
    def timed(*a, **k):
        t = time.perf_counter()
        try:
            return write(*a, **k)
        finally:
            spent.append(time.perf_counter() - t)
    n.write = timed
    atexit.register(lambda: open(sys.argv[1], "w").write(json.dumps(spent)))
    from qola.cli import main
    sys.exit(main(sys.argv[2:]))
""")


def sh(argv, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(argv, check=True, capture_output=True, text=True, **kw)


def make_stub(work: Path) -> Path:
    """The stub nvcc (a C program) and the empty CUDA runtime archive its TOP points at."""
    empty = work / "empty.c"
    empty.write_text("")
    sh(["cc", "-c", str(empty), "-o", str(work / "empty.o")])
    (work / "api.c").write_text(f'__attribute__((visibility("default"))) int {NS}_api(void) {{ return 0; }}\n')
    sh(["cc", "-fPIC", "-c", str(work / "api.c"), "-o", str(work / "api.o")])
    top = work / "cuda"
    (top / "lib64").mkdir(parents=True)
    sh(["ar", "rcs", str(top / "lib64" / "libcudart_static.a"), str(work / "empty.o")])
    src = work / "stub.c"
    text = STUB_C
    for key, name in (("{OBJ_BYTES}", "empty.o"), ("{API_BYTES}", "api.o")):
        text = text.replace(key, "{" + ",".join(str(b) for b in (work / name).read_bytes()) + "}")
    src.write_text(text)
    exe = work / "nvcc"
    sh(["cc", "-O2", f'-DTOP="{top}"', str(src), "-o", str(exe)])
    return exe


def make_tree(root: Path, instances: int, modules: int) -> tuple[Path, list[Path]]:
    """The tree (module table, core.py, generators) and its manifest; the generator scripts."""
    (root / "aiter" / "jit").mkdir(parents=True)
    (root / "aiter" / "configs").mkdir()
    (root / "aiter" / "jit" / "core.py").write_text(CORE_PY)
    gen_dir = root / "csrc" / "syn"
    gen_dir.mkdir(parents=True)
    table, scripts = {}, []
    per, extra = divmod(instances, modules)
    for m in range(modules):
        name = f"libsyn_{m:02d}"
        script = gen_dir / f"gen_{m:02d}.py"
        script.write_text(GENERATOR.format(module=f"syn{m:02d}"))
        scripts.append(script)
        count = per + (1 if m < extra else 0)
        table[name] = entry(
            is_python_module="False",
            is_standalone="False",
            blob_gen_cmd=[f"f'{{AITER_CSRC_DIR}}/syn/{script.name} --count {count} --output_dir {{{{}}}}'"],
        )
    (root / "aiter" / "jit" / "optCompilerConfig.json").write_text(json.dumps(table, indent=1))
    manifest = root.parent / "qola.toml"
    manifest.write_text(
        f'[qola]\nnamespace = "{NS}"\n[build]\narchitectures = ["sm_90"]\nmode = "cpp_itfs"\n'
        'link = "shared"\n' + "".join(f'[[modules]]\nname = "{n}"\n' for n in table)
    )
    return manifest, scripts


class Case:
    def __init__(self, work: Path, instances: int, modules: int, stub: Path, args) -> None:
        self.work, self.jobs, self.repeat = work, args.jobs, args.repeat
        self.manifest, self.scripts = make_tree(work / "tree", instances, modules)
        self.out, self.build_dir = work / "out", work / "out.build"
        self.env = {**os.environ, "CUDACXX": str(stub)}
        self.env.pop("PYTHONDONTWRITEBYTECODE", None)  # an installed qola has its bytecode cached
        if args.qola_src:
            self.env["PYTHONPATH"] = os.pathsep.join(filter(None, [args.qola_src, os.environ.get("PYTHONPATH")]))
        for k in ("MAX_JOBS", "CUDA_HOME", "CUDA_PATH", "NVCC_APPEND_FLAGS", "NVCC_PREPEND_FLAGS"):
            self.env.pop(k, None)
        from ninja import BIN_DIR  # the ninja qola runs (its pip package)

        self.ninja = os.path.join(BIN_DIR, "ninja")

    def qola(self, *args: str, timed_write: bool = False) -> tuple[float, list[float], str]:
        """(wall s, build.ninja write times, stderr) of one qola run in a child process."""
        spent = self.work / "write-times.json"
        spent.unlink(missing_ok=True)
        argv = [sys.executable, "-c", DRIVER, str(spent)] if timed_write else [sys.executable, "-m", "qola"]
        t0 = time.perf_counter()
        p = subprocess.run([*argv, *args], cwd=self.work, env=self.env, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if p.returncode != 0:
            raise SystemExit(f"qola {' '.join(args)} failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
        writes = json.loads(spent.read_text()) if timed_write and spent.exists() else []
        return wall, writes, p.stderr

    def build_args(self, *extra: str) -> list[str]:
        return [
            "build",
            "--manifest",
            str(self.manifest),
            "--aiter-root",
            str(self.work / "tree"),
            "-o",
            str(self.out),
            "-j",
            str(self.jobs),
            *extra,
        ]

    def plain_ninja(self) -> float:
        t0 = time.perf_counter()
        p = subprocess.run(
            [self.ninja, "-C", str(self.build_dir), "-j", str(self.jobs)], env=self.env, capture_output=True, text=True
        )
        wall = time.perf_counter() - t0
        if p.returncode != 0:
            raise SystemExit(f"ninja failed:\n{p.stdout[-3000:]}")
        return wall

    def objects(self) -> dict[str, int]:
        return {str(p): p.stat().st_mtime_ns for p in self.build_dir.rglob("*.o")}

    def span(self) -> float:
        rows = [ln.split("\t") for ln in (self.build_dir / ".ninja_log").read_text().splitlines()[1:]]
        rows = [(int(r[0]), int(r[1])) for r in rows if len(r) >= 4]
        return (max(e for _, e in rows) - min(s for s, _ in rows)) / 1000.0

    def run(self) -> dict[str, float]:
        r: dict[str, float] = {}
        med = statistics.median
        r["plan"] = med(
            self.qola("plan", "--manifest", str(self.manifest), "--aiter-root", str(self.work / "tree"), "--json")[0]
            for _ in range(self.repeat)
        )
        r["dry"] = self.qola(*self.build_args("--dry-run", "--build-dir", str(self.work / "dry.build")))[0]
        shutil.rmtree(self.work / "dry.build")
        wall, writes, _ = self.qola(*self.build_args(), timed_write=True)
        r["full"], r["span"], r["write"] = wall, self.span(), sum(writes)
        r["overhead"] = wall - r["span"]
        objs = self.objects()
        r["objects"] = len(objs)
        noop = []
        for _ in range(self.repeat):
            wall, _, err = self.qola(*self.build_args())
            if "up to date" not in err:
                raise SystemExit(f"the no-op build was not up to date:\n{err[-2000:]}")
            noop.append(wall)
        r["noop"] = med(noop)
        r["ninja_noop"] = med(self.plain_ninja() for _ in range(self.repeat))
        src = next(p for p in (self.build_dir / "gen").rglob("*_inst_00000.cu"))
        touch_q, touch_n, recompiled = [], [], []
        for _ in range(self.repeat):
            for runner, into in ((lambda: self.qola(*self.build_args())[0], touch_q), (self.plain_ninja, touch_n)):
                before = self.objects()
                time.sleep(0.01)
                os.utime(src)
                into.append(runner())
                after = self.objects()
                recompiled.append(sum(after[o] != before.get(o) for o in after))
        r["touch"], r["ninja_touch"], r["touch_objs"] = med(touch_q), med(touch_n), max(recompiled)
        before = self.objects()
        for s in self.scripts:
            with open(s, "a") as fh:
                fh.write("# a comment: the generated files do not change\n")
        wall, writes, _ = self.qola(*self.build_args(), timed_write=True)
        after = self.objects()
        r["gen_edit"], r["gen_edit_objs"] = wall, sum(after[o] != before.get(o) for o in after)
        return r


def table(rows: list[tuple[int, int, dict[str, float]]]) -> str:
    head = (
        "| instances | modules | plan | dry run | full build (span / qola overhead) | build.ninja write "
        "| no-op qola / ninja | touch 1: qola / ninja | gen comment edit: s (objects) |"
    )
    lines = [head, "|" + "---|" * 9]
    for n, mods, r in rows:
        lines.append(
            f"| {n:,} | {mods} | {r['plan']:.2f} | {r['dry']:.2f} | {r['full']:.1f} ({r['span']:.1f} / "
            f"{r['overhead']:.1f}) | {r['write']:.2f} | {r['noop']:.2f} / {r['ninja_noop']:.2f} "
            f"({r['noop'] / r['ninja_noop']:.2f}×) | {r['touch']:.2f} / {r['ninja_touch']:.2f} "
            f"({r['touch'] / r['ninja_touch']:.2f}×) | {r['gen_edit']:.2f} ({r['gen_edit_objs']:,}) |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", default="1000,5000,25000", help="instance counts, comma-separated")
    p.add_argument("--modules", default="1,20", help="module counts, comma-separated")
    p.add_argument("-j", "--jobs", type=int, default=2)
    p.add_argument("--repeat", type=int, default=3, help="runs of plan, no-op and touch-one (median)")
    p.add_argument("--qola-src", help="the directory holding the qola package to measure (default: the importable one)")
    p.add_argument("--keep", help="write the cases here and keep them (default: a temp dir, removed)")
    p.add_argument("--json", help="also write the raw numbers to this file")
    args = p.parse_args(argv)
    if args.qola_src:
        args.qola_src = os.path.abspath(args.qola_src)
    base = Path(args.keep).resolve() if args.keep else Path(tempfile.mkdtemp(prefix="qola-scale-"))
    base.mkdir(parents=True, exist_ok=True)
    rows = []
    try:
        stub = make_stub(Path(tempfile.mkdtemp(prefix="stub-", dir=base)))
        for n in (int(x) for x in args.sizes.split(",")):
            for mods in (int(x) for x in args.modules.split(",")):
                work = base / f"n{n}-m{mods}"
                shutil.rmtree(work, ignore_errors=True)
                work.mkdir()
                t0 = time.perf_counter()
                r = Case(work, n, mods, stub, args).run()
                print(
                    f"# {n} instances, {mods} module(s): {time.perf_counter() - t0:.0f} s; {json.dumps(r)}",
                    file=sys.stderr,
                    flush=True,
                )
                rows.append((n, mods, r))
                if not args.keep:
                    shutil.rmtree(work, ignore_errors=True)
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    if args.json:
        Path(args.json).write_text(json.dumps([{"instances": n, "modules": m, **r} for n, m, r in rows], indent=1))
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
