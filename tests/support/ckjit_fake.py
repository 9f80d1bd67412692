"""A test double of ROCm/ck-jit's build side that *acts* as ck-jit does (tests/support/ckjit_rule.py
states its rules): a fake ROCm home whose ``bin/hipcc`` and ``bin/cxx_interceptor`` run
:data:`SCRIPT`, which reads every call with ck-jit's parse rule, records each ``/blob/`` compile as
one NDJSON line and writes a zero-byte stub in place of its object, rewrites an ``fmha_*_api``
source (each dispatch call after a ``//jit_kernel: <blob>`` hint, the hint CK's generator writes with
ck-jit's codegen patch, becomes a call of ck-jit's runtime), compiles it and records it, compiles
anything else for real, and takes over the ``*libmha_(fwd|bwd)*.so`` link as ck-jit's post-build
does (the non-empty objects and a runtime object, the carried ``--version-script``, hipcc with
``-Wl,--allow-shlib-undefined``).

Where ck-jit would silently go wrong it stops instead: a compile line whose parsed "source" is not
an existing source file (ck-jit compiles the call for real and never stubs it, the failure of
issue 31) exits 3 naming it, and a ``libmha_*`` link with no NDJSON exits 1 as ck-jit's
post-build does. Every decision is appended to ``calls.ndjson`` in ``CK_JIT_TMP_DIR`` for the test."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

SUPPORT = Path(__file__).resolve().parent

SCRIPT = r"""#!{python}
import fcntl, json, os, re, subprocess, sys
sys.path.insert(0, {support!r})
from ckjit_rule import arch_flags, classify, compile_parts, extract_flags, ld_flags, link_objects

TMP = os.environ["CK_JIT_TMP_DIR"]
SOURCES = (".c", ".cc", ".cpp", ".cxx", ".cu", ".hip", ".s", ".S")


def append(name, entry):
    with open(os.path.join(TMP, "ck_jit_manifest.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with open(os.path.join(TMP, name), "a") as f:
            f.write(json.dumps(entry) + "\n")


def real(argv):
    hip = os.path.basename(argv[0]) == "hipcc"
    compiler = os.environ["CK_JIT_HIPCC"] if hip else os.environ["CK_JIT_CXX"]
    return subprocess.run([compiler, *argv[1:]]).returncode


def flags(argv, call, source=None):
    # as ck-jit's _extract_flags: everything but the source, -o, -c and visibility, verbatim
    written = source or compile_parts(argv)[0]
    return extract_flags(argv, written, call.output, os.getcwd(), os.environ.get("CK_JIT_AITER_DIR", ""))


HINT = "//jit_kernel: "
RUNTIME = 'float ck_jit_call(const char* blob, int x) {{ (void)blob; (void)x; return -1.0f; }}\n'


def rewrite(text):
    # each dispatch call after a `//jit_kernel: <blob>.cpp` hint becomes a call of the runtime
    # (`<kernel>_run(x)` -> `ck_jit_call("<blob>", x)`); returns (text, calls rewritten)
    out, blob, n = [], None, 0
    for line in text.splitlines():
        if line.strip().startswith(HINT):
            blob = line.strip()[len(HINT):].rsplit(".", 1)[0]
        elif blob and re.search(r"\w+_run\(", line):
            line, k = re.subn(r"\w+_run\(", 'ck_jit_call("%s", ' % blob, line, count=1)
            n, blob = n + k, None
        out.append(line)
    head = "float ck_jit_call(const char*, int);\n" if n else ""
    return head + "\n".join(out) + "\n", n


def post_build(argv, call):
    ndjson = os.path.join(TMP, "manifest.json.ndjson")
    if not os.path.exists(ndjson):
        print("[CK-POST] ERROR: manifest NDJSON not found: " + ndjson, file=sys.stderr)
        return 1
    cwd = os.getcwd()
    objs = link_objects(argv, cwd)
    arch = arch_flags(argv)
    if not arch:
        for line in open(ndjson):
            arch = arch_flags(json.loads(line)["argv"])
            if arch:
                break
    runtime_src, runtime = os.path.join(TMP, "ck_jit_runtime.cpp"), os.path.join(TMP, "ck_jit_runtime.o")
    open(runtime_src, "w").write(RUNTIME)
    rc = subprocess.run([os.environ["CK_JIT_HIPCC"], "-fPIC", *arch, "-c", runtime_src, "-o", runtime]).returncode
    if rc != 0:
        return rc
    cmd = [os.environ["CK_JIT_HIPCC"], "-shared", "-fPIC", *arch, *ld_flags(argv), *objs, runtime, "-ldl",
           "-Wl,--allow-shlib-undefined", "-Wl,-soname," + os.path.basename(call.output), "-o", call.output]
    append("calls.ndjson", {{"kind": "post_build", "output": call.output, "objects": objs,
                             "ld_flags": ld_flags(argv), "arch": arch}})
    return subprocess.run(cmd).returncode


def main():
    argv = sys.argv
    call = classify(argv, os.getcwd())
    append("calls.ndjson", {{"kind": call.kind, "source": call.source, "output": call.output}})
    if call.kind in ("blob", "api", "compile") and (
        not os.path.isfile(call.source) or not call.source.endswith(SOURCES)
    ):
        print("ck-jit (test double): the source of this compile line is %r, not a source file: "
              "ck-jit would compile it for real and never stub it" % call.source, file=sys.stderr)
        return 3
    if call.kind == "blob":
        append("manifest.json.ndjson", {{"source": call.source, "cwd": os.getcwd(),
                                         "argv": flags(argv, call), "kind": "blob"}})
        os.makedirs(os.path.dirname(os.path.abspath(call.output)), exist_ok=True)
        open(call.output, "wb").close()
        return 0
    if call.kind == "api":
        text = open(call.source).read()
        rewritten, n = rewrite(text)
        if HINT in text and n == 0:
            print("[CK-API] ERROR: JIT hint block had no rewrite in " + call.source, file=sys.stderr)
            return 1
        src = os.path.join(TMP, os.path.basename(call.source)[:-4] + "_jit.cpp")
        open(src, "w").write(rewritten)
        new = [src if os.path.abspath(a) == call.source else a for a in argv]
        rc = real([os.environ["CK_JIT_HIPCC"], *new[1:]])
        if rc == 0:
            append("manifest.json.ndjson", {{"source": src, "cwd": os.getcwd(), "argv": flags(new, call, src),
                                             "kind": "api", "rewritten": n}})
        return rc
    if call.kind == "post_build":
        return post_build(argv, call)
    return real(argv)


sys.exit(main())
"""


def fake_rocm(where: Path, real_hipcc: str, real_cxx: str, aiter_dir: Path) -> tuple[Path, dict[str, str]]:
    """ck-jit's fake ROCm home under ``where/ck_jit_tmp`` (bin/hipcc and bin/cxx_interceptor are links
    to the double's one script, written once at ``where/ck_jit/``, as ck-jit links them to its
    interceptor; every other entry of the real ROCm is a link, as ck-jit makes it) and the variables
    ck-jit sets for the build (``ROCM_PATH``, ``ROCM_HOME=""``, ``CXX``, ``CK_JIT_*`` with the AITER
    dir its recorded include dirs are made relative to). Called again after the scratch dir is
    removed, it makes the same home anew, as every ``full`` does."""
    hipcc = Path(os.path.realpath(real_hipcc))
    real = hipcc.parent.parent
    tmp = where / "ck_jit_tmp"
    fake = tmp / "rocm"
    (fake / "bin").mkdir(parents=True)
    interceptor = where / "ck_jit" / "ck_build_interceptor.py"
    if not interceptor.exists():  # ck-jit's own file: the same one for every build
        interceptor.parent.mkdir(parents=True)
        interceptor.write_text(SCRIPT.format(python=sys.executable, support=str(SUPPORT)))
        interceptor.chmod(0o755)
    for name in ("hipcc", "cxx_interceptor"):
        (fake / "bin" / name).symlink_to(interceptor)
    for entry in real.iterdir():
        if entry.name == "bin":
            for tool in entry.iterdir():
                if not (fake / "bin" / tool.name).exists():
                    (fake / "bin" / tool.name).symlink_to(tool)
        elif not (fake / entry.name).exists():
            (fake / entry.name).symlink_to(entry)
    env = {
        "ROCM_PATH": str(fake),
        "ROCM_HOME": "",
        "CXX": str(fake / "bin" / "cxx_interceptor"),
        "CK_JIT_HIPCC": str(hipcc),
        "CK_JIT_CXX": shutil.which(real_cxx) or real_cxx,
        "CK_JIT_TMP_DIR": str(tmp),
        "CK_JIT_AITER_DIR": str(aiter_dir),
    }
    return fake, env


def records(tmp: Path, name: str) -> list[dict[str, Any]]:
    path = tmp / name
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
