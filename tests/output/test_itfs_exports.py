"""cpp_itfs libraries built by `qola build`: only allowed exports, leaks fail the build, static
archives of two namespaces link into one program, CMake and pkg-config consumers work."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from subprocess import CompletedProcess
from typing import cast

import pytest
from support.common import KERNELS, cmake_build, run_qola

pytestmark = pytest.mark.slow

# one attention instance keeps the compile short; the wrapper and dispatch file come along
ONE = 'blob_gen_cmd = ["csrc/attn/generate.py -d fwd --filter attn_fwd_d64_fp16_batch*_nmask_nlse --output_dir {}"]\n'


def build(
    tmp: Path, ns: str, arch: str = "sm_90", link: str = "shared", extra: str = "", *flags: str
) -> tuple[CompletedProcess[str], Path]:
    m = tmp / f"{ns}.toml"
    m.write_text(
        f'[qola]\nnamespace = "{ns}"\n[build]\narchitectures = ["{arch}"]\nlink = "{link}"\n'
        f'[[modules]]\nname = "libattn_fwd"\nmode = "cpp_itfs"\n{ONE}{extra}'
    )
    out = tmp / f"out_{ns}"
    return run_qola("build", "--manifest", str(m), "--aiter-root", str(KERNELS), "-o", str(out), *flags), out


def exports(out: Path) -> list[str]:
    data = json.loads((out / "manifest.json").read_text())
    return cast("list[str]", next(m for m in data["modules"] if m["name"] == "libattn_fwd")["exports"])


def test_shared_exports_only_allowed_and_audit_passes(tmp_path: Path) -> None:
    proc, out = build(tmp_path, "te")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    names = exports(out)
    assert "te_libattn_fwd_attn_fwd" in names and "te_qola_version" in names
    assert any(n.startswith("_ZN4qola2te8attn_fwd") for n in names)
    assert all(n.startswith(("te_", "_ZN4qola2te")) for n in names), names
    for header in ("qola_common.h", "qola_config.h", "qola_attn_fwd.h"):
        assert (out / "include" / header).is_file()
    assert "#define QOLA_NAMESPACE te" in (out / "include" / "qola_config.h").read_text()
    assert run_qola("audit", str(out)).returncode == 0


def test_planted_leak_fails_the_build_naming_it(tmp_path: Path) -> None:
    leak = tmp_path / "leak.cu"
    leak.write_text('__attribute__((visibility("default"))) int planted_leaky_helper() { return 7; }\n')
    proc, out = build(tmp_path, "te", "sm_90", "shared", f'add_srcs = ["{leak}"]\n', "--no-isolation")
    assert proc.returncode == 1
    assert "planted_leaky_helper" in proc.stderr
    assert not list((out / "lib").glob("te_libattn_fwd*"))
    # with isolation on, the same source links clean (the version script keeps the helper local)
    proc, out = build(tmp_path, "te", "sm_90", "shared", f'add_srcs = ["{leak}"]\n')
    assert proc.returncode == 0, proc.stderr
    assert "planted_leaky_helper" not in " ".join(exports(out))


def test_static_archives_of_two_namespaces_link_into_one_program(tmp_path: Path) -> None:
    for ns in ("a", "b"):
        proc, out = build(tmp_path, ns, link="static")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert (out / "lib" / f"{ns}_libattn_fwd.a").is_file()
    main = tmp_path / "main.cpp"
    main.write_text(
        '#include <cstdio>\nextern "C" const char* a_qola_version(); extern "C" const char* b_qola_version();\n'
        'extern "C" int a_libattn_fwd_attn_fwd(const void*); extern "C" int b_libattn_fwd_attn_fwd(const void*);\n'
        'int main() { std::printf("%s %s %d %d\\n", a_qola_version(), b_qola_version(),\n'
        "  a_libattn_fwd_attn_fwd(nullptr), b_libattn_fwd_attn_fwd(nullptr)); }\n"
    )
    cuda = "/usr/local/cuda/lib64"
    link = subprocess.run(
        [
            "g++",
            str(main),
            str(tmp_path / "out_a/lib/a_libattn_fwd.a"),
            str(tmp_path / "out_b/lib/b_libattn_fwd.a"),
            f"-L{cuda}",
            "-lcudart_static",
            "-ldl",
            "-lrt",
            "-lpthread",
            "-o",
            str(tmp_path / "prog"),
        ],
        capture_output=True,
        text=True,
    )
    assert link.returncode == 0, link.stderr  # no duplicate symbols between the two copies
    run = subprocess.run([str(tmp_path / "prog")], capture_output=True, text=True)
    assert run.returncode == 0 and run.stdout.split()[2:] == ["-2", "-2"], run.stdout + run.stderr


def test_cmake_and_pkgconfig_consumers(tmp_path: Path) -> None:
    if not shutil.which("cmake") or not shutil.which("pkg-config"):
        pytest.skip("cmake / pkg-config not installed")
    proc, out = build(tmp_path, "te")
    assert proc.returncode == 0, proc.stderr
    src = tmp_path / "use.c"
    src.write_text(
        "#include <stdio.h>\nextern const char* te_qola_version(void);\n"
        'int main(void) { printf("qola %s\\n", te_qola_version()); return 0; }\n'
    )
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.16)\nproject(use C CXX)\nfind_package(qola-te REQUIRED)\n"
        f"add_executable(use {src})\ntarget_link_libraries(use PRIVATE qola::te::libattn_fwd)\n"
    )
    bld = tmp_path / "cmake-build"
    cmake_build(proj, bld, out)
    run = subprocess.run(
        [str(bld / "use")], capture_output=True, text=True, env={**os.environ, "LD_LIBRARY_PATH": str(out / "lib")}
    )
    assert run.returncode == 0 and run.stdout.startswith("qola "), run.stderr
    env = {**os.environ, "PKG_CONFIG_PATH": str(out / "lib" / "pkgconfig")}
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", "qola-te"], capture_output=True, text=True, env=env)
    assert flags.returncode == 0, flags.stderr
    exe = tmp_path / "use_pc"
    cc = subprocess.run(["cc", str(src), "-o", str(exe), *flags.stdout.split()], capture_output=True, text=True)
    assert cc.returncode == 0, cc.stderr
    run = subprocess.run(
        [str(exe)], capture_output=True, text=True, env={**os.environ, "LD_LIBRARY_PATH": str(out / "lib")}
    )
    assert run.returncode == 0 and run.stdout.startswith("qola ")


@pytest.mark.hip
def test_hip_gfx90a_exports_only_allowed(tmp_path: Path) -> None:
    proc, out = build(tmp_path, "te", arch="gfx90a")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    names = exports(out)
    assert "te_libattn_fwd_attn_fwd" in names
    assert all(n.startswith(("te_", "_ZN4qola2te")) for n in names), names
