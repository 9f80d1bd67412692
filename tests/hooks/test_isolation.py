"""Symbol isolation on the CPU: version scripts, static localisation, the ELF audit, `qola audit`.

A tiny "module" (two C++ files) is compiled with g++ per namespace; two copies of it (namespaces
a and b, -DVALUE=1 / -DVALUE=2) live in one process, as shared libraries and as static archives.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from support.common import run_qola
from support.link_objects import build_objects, link_shared, sh

from qola.compile import elf as audit
from qola.compile import link
from qola.core.errors import BuildFailed, QolaError
from qola.output.outdir import DIRS

pytestmark = pytest.mark.skipif(not (shutil.which("g++") and shutil.which("ld")), reason="needs g++ and binutils")


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[tuple[str, int, bool], list[Path]]]:
    """Objects per (ns, value, leak), compiled once per module, two at a time."""
    root = tmp_path_factory.mktemp("demo")
    keys = [("te", 7, False), ("te", 7, True), ("a", 1, False), ("b", 2, False)]
    with ThreadPoolExecutor(2) as pool:
        objs = list(pool.map(lambda k: build_objects(root, *k), keys))
    return root, dict(zip(keys, objs))


def test_version_script_text() -> None:
    text = link.version_script("te")
    assert 'extern "C++" {\n      qola::te::*;\n    };' in text
    assert '"qola::' not in text  # quoted = literal = exports nothing
    for line in ("_ZN4qola2te*;", "_ZNK4qola2te*;", "_ZTVN4qola2te*;", "_ZTIN4qola2te*;", "te_*;", "local:\n    *;"):
        assert line in text
    assert "PyInit_mha;" in link.version_script("te", extra=["PyInit_mha"])
    with pytest.raises(QolaError, match="namespace"):
        link.version_script("not ok")


def test_argv_and_rsp(tmp_path: Path) -> None:
    argv = link.shared_link_argv(
        "g++", tmp_path / "o.rsp", tmp_path / "te_x.so", link.library_ldflags(tmp_path / "v.map", "te_x.so"), ["-lfoo"]
    )
    assert argv[:5] == ["g++", "-shared", f"@{tmp_path / 'o.rsp'}", "-o", str(tmp_path / "te_x.so")]
    assert "-Wl,-soname,te_x.so" in argv and "-Wl,--build-id=sha1" in argv
    assert f"-Wl,--version-script={tmp_path / 'v.map'}" in argv and "-Wl,--no-undefined" in argv
    assert argv[-1] == "-lfoo"
    off = link.shared_link_argv("g++", Path("r"), Path("x.so"), link.python_module_ldflags(None))
    assert not any("version-script" in a or "no-undefined" in a for a in off) and "-Wl,--build-id=sha1" in off
    assert link.rsp_text(["a b.o", 'c"d\\e.o']) == 'a\\ b.o\nc\\"d\\\\e.o\n'


def test_shared_exports_only_allowed(
    built: tuple[Path, dict[tuple[str, int, bool], list[Path]]], tmp_path: Path
) -> None:
    _, objs = built
    so = link_shared(objs["te", 7, False], tmp_path / "te_demo.so", "te")
    result = audit.audit_artifact(so, "te")
    shown = {s.demangled for s in result.exports}
    for want in (
        "qola::te::get_value()",
        "te_demo_get_value",
        "te_qola_version",
        "typeinfo for qola::te::Shape",
        "vtable for qola::te::Shape",
        "int qola::te::twice<int>(int)",
        "qola::te::Shape::sides() const",
    ):
        assert want in shown, shown
    assert not any("internal_helper" in s or "std::" in s or "inline_" in s for s in shown), shown
    assert all(s.binding in ("GLOBAL", "WEAK", "UNIQUE") for s in result.exports)


def test_planted_leak(built: tuple[Path, dict[tuple[str, int, bool], list[Path]]], tmp_path: Path) -> None:
    _, objs = built
    leaky = objs["te", 7, True]
    # with isolation the version script hides it ...
    clean = audit.audit_artifact(link_shared(leaky, tmp_path / "iso" / "te_demo.so", "te"), "te")
    assert "leaky_helper()" not in {s.demangled for s in clean.exports}
    # ... without, the audit fails naming it (and the helper the copies share)
    so = link_shared(leaky, tmp_path / "off" / "te_demo.so", "te", isolate=False)
    with pytest.raises(BuildFailed) as err:
        audit.audit_artifact(so, "te")
    assert "leaky_helper()" in str(err.value) and "internal_helper()" in str(err.value)
    assert "QOLA_NS_BEGIN" in str(err.value)
    assert "std::" in str(err.value) and "standard-library template instantiation" in str(err.value)
    # same for a static archive made without localisation: the member is named
    lib = link.run_static(
        leaky, tmp_path / "st" / "te_demo.a", "te", tmp_path / "st" / "w", how=link.Archiving(isolate=False)
    )
    res = audit.audit_artifact(lib, "te", check=False)
    assert {"leaky_helper()", "internal_helper()"} <= {s.demangled for s in res.leaks}
    assert any("te_demo.o" in line for line in res.problems())


def test_quoted_pattern_exports_nothing(
    built: tuple[Path, dict[tuple[str, int, bool], list[Path]]], tmp_path: Path
) -> None:
    _, objs = built
    quoted = '{ global: extern "C++" { "qola::te::*"; }; local: *; };\n'
    so = link_shared(objs["te", 7, False], tmp_path / "te_demo.so", "te", script=quoted)
    with pytest.raises(BuildFailed, match="exports nothing"):
        audit.audit_artifact(so, "te")


DLOPEN_C = r"""
#include <dlfcn.h>
#include <stdio.h>
typedef int (*fn)(void);
static fn get(void* h, const char* name) { fn f = (fn)dlsym(h, name); if (!f) { fprintf(stderr, "%s\n", dlerror()); } return f; }
int main(int argc, char** argv) {
    void* a = dlopen(argv[1], RTLD_NOW | RTLD_GLOBAL);
    void* b = dlopen(argv[2], RTLD_NOW | RTLD_GLOBAL);
    if (!a || !b) { fprintf(stderr, "%s\n", dlerror()); return 3; }
    printf("%d %d %d %d\n", get(a, "a_demo_get_value")(), get(b, "b_demo_get_value")(),
           get(a, "a_demo_get_inline")(), get(b, "b_demo_get_inline")());
    return 0;
}
"""
STATIC_C = r"""
#include <stdio.h>
int a_demo_get_value(void); int b_demo_get_value(void); int a_demo_get_inline(void); int b_demo_get_inline(void);
int main(void) { printf("%d %d %d %d\n", a_demo_get_value(), b_demo_get_value(), a_demo_get_inline(), b_demo_get_inline()); return 0; }
"""


@pytest.mark.parametrize("isolate", [True, False], ids=["isolated", "isolation-off"])
def test_two_shared_copies_in_one_process(
    built: tuple[Path, dict[tuple[str, int, bool], list[Path]]], tmp_path: Path, isolate: bool
) -> None:
    _, objs = built
    libs = [link_shared(objs[ns, v, False], tmp_path / f"{ns}_demo.so", ns, isolate) for ns, v in (("a", 1), ("b", 2))]
    (tmp_path / "main.c").write_text(DLOPEN_C)
    sh("gcc", tmp_path / "main.c", "-o", tmp_path / "main", "-ldl")
    got = sh(tmp_path / "main", *libs).split()
    if isolate:
        assert got == ["1", "2", "110", "220"]
    else:  # b's calls bind to a's global helpers: the collision isolation prevents
        assert got[1] == "1" and got[3] == "110", got


@pytest.mark.parametrize("isolate", [True, False], ids=["isolated", "isolation-off"])
def test_two_static_copies_in_one_program(
    built: tuple[Path, dict[tuple[str, int, bool], list[Path]]], tmp_path: Path, isolate: bool
) -> None:
    _, objs = built
    libs = [
        link.run_static(
            objs[ns, v, False], tmp_path / f"{ns}_demo.a", ns, tmp_path / f"w{ns}", how=link.Archiving(isolate=isolate)
        )
        for ns, v in (("a", 1), ("b", 2))
    ]
    (tmp_path / "main.c").write_text(STATIC_C)
    proc = subprocess.run(
        ["g++", "-x", "c", str(tmp_path / "main.c"), "-x", "none", *map(str, libs), "-o", str(tmp_path / "main")],
        capture_output=True,
        text=True,
    )
    if not isolate:
        assert proc.returncode != 0 and "multiple definition of" in proc.stderr, proc.stderr
        return
    assert proc.returncode == 0, proc.stderr
    assert sh(tmp_path / "main").split() == ["1", "2", "110", "220"]
    for lib, ns in zip(libs, "ab"):
        res = audit.audit_artifact(lib, ns)
        assert {s.member for s in res.exports} == {f"{ns}_demo.o"}
        assert f"{ns}_demo_get_value" in {s.name for s in res.exports}


def test_static_steps_shape(tmp_path: Path) -> None:
    steps = link.static_archive_steps([tmp_path / "x.o"], tmp_path / "te_m.a", "te", tmp_path / "w")
    assert next(s[0] for s in steps) == "ld" and steps[0][1:3] == ["-r", "--force-group-allocation"]
    assert steps[0][-1] == f"@{tmp_path / 'w' / 'te_m.objs.rsp'}"
    assert steps[1][1] == "-c" and "'qola.compile.link'" in steps[1][2] and steps[1][3] == "localize"
    assert steps[1][-3:] == [str(tmp_path / "w" / n) for n in ("te_m.r.o", "te_m.localize", "te_m.o")]
    assert steps[2][:2] == ["ar", "rcsD"] and len(steps) == 3
    assert (tmp_path / "w" / "te_m.objs.rsp").read_text() == f"{tmp_path / 'x.o'}\n"
    assert (
        len(
            link.static_archive_steps(
                [tmp_path / "x.o"], tmp_path / "te_m.a", "te", tmp_path / "w", how=link.Archiving(isolate=False)
            )
        )
        == 2
    )


def test_static_archive_whose_only_globals_are_exports_skips_objcopy(tmp_path: Path) -> None:
    """Issue 51: nothing to make local (every global is an export) gives an empty list, which objcopy
    refuses with exit 1 and no message; the step is skipped and the archive holds the export."""
    (tmp_path / "only.c").write_text("int te_only_value(void) { return 7; }\n")
    sh("cc", "-O1", "-fPIC", "-c", tmp_path / "only.c", "-o", tmp_path / "only.o")
    for how in (link.Archiving(), link.Archiving(localize_hidden=True)):
        lib = link.run_static([tmp_path / "only.o"], tmp_path / "te_only.a", "te", tmp_path / "work", how=how)
        assert (tmp_path / "work" / "te_only.localize").read_text() == ""
        assert {s.name for s in audit.audit_artifact(lib, "te").exports} == {"te_only_value"}


MANY_C = "__attribute__((noinline)) int helper_XXXXXX(void) { return 7; }\nint te_obj_XXXXXX(void) { return helper_XXXXXX(); }\n"


def test_static_thousands_of_objects(tmp_path: Path) -> None:
    n = 3000
    (tmp_path / "t.c").write_text(MANY_C)
    sh("cc", "-O1", "-fPIC", "-c", tmp_path / "t.c", "-o", tmp_path / "t.o")
    template = (tmp_path / "t.o").read_bytes()
    assert template.count(b"XXXXXX") == 2  # the two names in .strtab
    objs = []
    start = time.monotonic()
    for i in range(n):
        obj = tmp_path / "objs" / f"{i // 500}" / f"m{i:06d}.o"
        obj.parent.mkdir(parents=True, exist_ok=True)
        obj.write_bytes(template.replace(b"XXXXXX", b"%06d" % i))
        objs.append(obj)
    made = time.monotonic()
    lib = link.run_static(objs, tmp_path / "te_many.a", "te", tmp_path / "work")
    linked = time.monotonic()
    res = audit.audit_artifact(lib, "te")
    names = {s.name for s in res.exports}
    assert len(names) == n and "te_obj_002999" in names and not any(x.startswith("helper_") for x in names)
    (tmp_path / "main.c").write_text(
        "int te_obj_000000(void); int te_obj_002999(void);\n"
        "int main(void) { return te_obj_000000() + te_obj_002999() == 14 ? 0 : 1; }\n"
    )
    sh("cc", tmp_path / "main.c", lib, "-o", tmp_path / "main")
    sh(tmp_path / "main")
    print(f"{n} objects: made in {made - start:.2f}s, static steps {linked - made:.2f}s")


def test_read_ar_long_names(built: tuple[Path, dict[tuple[str, int, bool], list[Path]]], tmp_path: Path) -> None:
    _, objs = built
    long_a = tmp_path / "a_very_long_member_name_over_16.o"
    shutil.copy(objs["te", 7, False][1], long_a)
    shutil.copy(objs["te", 7, False][0], tmp_path / "short.o")
    sh("ar", "rcsD", tmp_path / "x.a", long_a, tmp_path / "short.o")
    members = [name for name, _ in audit.read_ar((tmp_path / "x.a").read_bytes())]
    assert members == ["a_very_long_member_name_over_16.o", "short.o"]
    syms = audit.exported_symbols(tmp_path / "x.a")
    assert ("internal_helper()", "a_very_long_member_name_over_16.o") in {(s.demangled, s.member) for s in syms}


# -- qola audit OUT ------------------------------------------------------------------------------


def fake_output(built: tuple[Path, dict[tuple[str, int, bool], list[Path]]], out: Path, isolate: bool = True) -> Path:
    _, objs = built
    so = link_shared(objs["te", 7, False], out / "lib" / "te_demo.so", "te", isolate)
    shutil.rmtree(out / "lib" / "te_demo.so.work")
    exports = [s.name for s in audit.exported_symbols(so)]
    manifest = {
        "qola_version": "0.0-test",  # what qola writes into every output (qola audit refuses one without)
        "namespace": "te",
        "modules": [
            {
                "name": "demo",
                "status": "built",
                "artifact": "lib/te_demo.so",
                "size": so.stat().st_size,
                "sha256": hashlib.sha256(so.read_bytes()).hexdigest(),
                "exports": exports,
            },
            {"name": "broken", "status": "failed"},
        ],
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    for entry in DIRS:  # the rest of a published output's layout (qola.output.outdir), empty
        (out / entry).mkdir(exist_ok=True)
    return out


def test_qola_audit_clean_and_tampered(
    built: tuple[Path, dict[tuple[str, int, bool], list[Path]]], tmp_path: Path
) -> None:
    out = fake_output(built, tmp_path / "O")
    proc = run_qola("audit", str(out), "--allow-failed")
    assert proc.returncode == 0, proc.stderr
    assert "1 artifact(s) clean" in proc.stdout
    proc = run_qola("audit", str(out))  # the failed module: the output lacks it
    assert proc.returncode == 1 and "broken: failed to build" in proc.stderr, proc.stderr
    # an unexpected export: the manifest no longer lists one the library has
    data = json.loads((out / "manifest.json").read_text())
    dropped = data["modules"][0]["exports"].pop()
    (out / "manifest.json").write_text(json.dumps(data))
    proc = run_qola("audit", str(out), "--allow-failed")
    assert proc.returncode == 1 and "unexpected export" in proc.stderr, proc.stderr
    data["modules"][0]["exports"].append(dropped)
    (out / "manifest.json").write_text(json.dumps(data))
    # a modified artifact: one byte of its .comment flipped
    so = out / "lib" / "te_demo.so"
    blob = bytearray(so.read_bytes())
    blob[blob.index(b"GCC: (") + 1] ^= 0x20
    so.write_bytes(bytes(blob))
    proc = run_qola("audit", str(out), "--allow-failed")
    assert proc.returncode == 1 and "sha256" in proc.stderr and "size" not in proc.stderr, proc.stderr


def test_qola_audit_leaky_artifact_and_missing_manifest(
    built: tuple[Path, dict[tuple[str, int, bool], list[Path]]], tmp_path: Path
) -> None:
    out = fake_output(built, tmp_path / "O", isolate=False)
    proc = run_qola("audit", str(out))
    assert proc.returncode == 1 and "leak: internal_helper()" in proc.stderr, proc.stderr
    proc = run_qola("audit", str(tmp_path / "nothing"))
    assert proc.returncode == 2 and "manifest.json" in proc.stderr
