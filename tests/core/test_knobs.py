"""Every knob is checked before work (issue 41 item 6): each declared setting (qola.core.settings:
ALL and the environment-only KNOBS) given a bad value ends a build before anything is compiled or
published, with one clear message that names the knob and no traceback; ``QOLA_GENERATOR_TIMEOUT=10m``
or ``=0`` used to fail a module mid-build instead. A guard keeps every ``QOLA_*`` name in qola's
source declared, so a new knob cannot skip the check."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from subprocess import CompletedProcess

import pytest
from support.common import REPO, run_qola
from support.fake_nvcc import fake_nvcc, make_tree
from support.fake_nvcc import pytestmark as needs_fake_nvcc

from qola.core import knobs, settings

MANIFEST = (
    '[qola]\nnamespace = "qk"\n[build]\narchitectures = ["sm_90"]\n'
    '[[modules]]\nname = "module_tiny"\nsrcs = ["csrc/tiny/tiny.cu"]\nis_python_module = false\n'
)

# setting name -> (extra arguments, extra environment, what the message names); one bad value each
BAD: dict[str, tuple[tuple[str, ...], dict[str, str], str]] = {
    "jobs": ((), {"MAX_JOBS": "0"}, "MAX_JOBS"),
    "archs": (("--arch", "gfx9999x"), {}, "--arch"),
    "groups": ((), {"QOLA_BUILD_GROUPS": "a b"}, "QOLA_BUILD_GROUPS"),
    "aiter_root": (("--aiter-root", "/nonexistent/qola-tree"), {}, "/nonexistent/qola-tree"),
    "aiter_url": ((), {"QOLA_AITER_URL": "ext::sh -c touch% /tmp/qola-pwned"}, "QOLA_AITER_URL"),
    "mode": (("--mode", "fast"), {}, "--mode"),
    "launcher": (("--launcher", "/nonexistent/ccache"), {}, "/nonexistent/ccache"),
    "remote": (("--remote", "not a url"), {}, "--remote"),
    "wait": ((), {"QOLA_WAIT": "-1"}, "QOLA_WAIT"),
    "qola_probe_timeout": ((), {"QOLA_PROBE_TIMEOUT": "2min"}, "QOLA_PROBE_TIMEOUT='2min'"),
    "qola_generator_timeout": ((), {"QOLA_GENERATOR_TIMEOUT": "10m"}, "QOLA_GENERATOR_TIMEOUT='10m'"),
    "qola_git_timeout": ((), {"QOLA_GIT_TIMEOUT": "-5"}, "QOLA_GIT_TIMEOUT='-5'"),
    "qola_lock_timeout": ((), {"QOLA_LOCK_TIMEOUT": "soon"}, "QOLA_LOCK_TIMEOUT='soon'"),
    "force_checkout": ((), {"QOLA_FORCE_AITER_CHECKOUT": "false"}, "QOLA_FORCE_AITER_CHECKOUT"),
    "aiter_commit": (("--aiter-commit=a..b",), {}, "--aiter-commit"),
    "patches_dir": (("--patches-dir", "/nonexistent/qola-patches"), {}, "/nonexistent/qola-patches"),
    "jit": (("--manifest-extra", '[jit]\nenabled = "yes"\n'), {}, "[jit].enabled"),
    "fixes": ((), {"QOLA_FIXES": "Bad Name"}, "QOLA_FIXES"),
    "record_ahead": (("--manifest-extra", "[usage]\nrecord_ahead = 1\n"), {}, "usage.record_ahead"),
    "qola_jit_compiler": ((), {"QOLA_JIT_COMPILER": "hipcc\n-fplugin=x"}, "QOLA_JIT_COMPILER"),
    "qola_jit_cache_dir": ((), {"QOLA_JIT_CACHE_DIR": "/tmp/a\nb"}, "QOLA_JIT_CACHE_DIR"),
    "qola_jit_prebuilt_dir": ((), {"QOLA_JIT_PREBUILT_DIR": "/tmp/\x1b[31m"}, "QOLA_JIT_PREBUILT_DIR"),
    "no_cache": ((), {"QOLA_NO_CACHE": "yes please"}, "QOLA_NO_CACHE"),
    "qola_cache_dir": ((), {"QOLA_CACHE_DIR": "/tmp/a\nb"}, "QOLA_CACHE_DIR"),
    "qola_cache_max_gb": ((), {"QOLA_CACHE_MAX_GB": "lots"}, "QOLA_CACHE_MAX_GB"),
}

Build = Callable[..., CompletedProcess[str]]


@pytest.fixture
def build(tmp_path: Path) -> Build:
    tree = make_tree(tmp_path / "tree")
    m = tmp_path / "q.toml"
    m.write_text(MANIFEST)
    env = {"CUDACXX": str(fake_nvcc(tmp_path / "nvcc"))}

    def run(*extra: str, env_extra: dict[str, str] | None = None) -> CompletedProcess[str]:
        if extra[:1] == ("--manifest-extra",):  # a bad manifest value: the manifest's own tables
            m.write_text(MANIFEST + extra[1])
            extra = extra[2:]
        root = () if "--aiter-root" in extra else ("--aiter-root", str(tree))
        args = ["build", "--manifest", str(m), *root, "-o", str(tmp_path / "out"), "-j", "1", *extra]
        return run_qola(*args, env={**env, **(env_extra or {})}, cwd=tmp_path)

    return run


def test_every_declared_setting_has_a_bad_value_here() -> None:
    assert {s.name for s in (*settings.ALL, *knobs.KNOBS)} == set(BAD)


@needs_fake_nvcc
@pytest.mark.parametrize("name", sorted(BAD))
def test_a_bad_setting_ends_the_build_before_work(build: Build, tmp_path: Path, name: str) -> None:
    extra, env, needle = BAD[name]
    res = build(*extra, env_extra=env)
    assert res.returncode == 2, (name, res.returncode, res.stderr)
    assert "Traceback" not in res.stderr and "error:" in res.stderr and needle in res.stderr, res.stderr
    assert not (tmp_path / "out").exists(), "something was published"
    assert not list((tmp_path / "out.build").rglob("*.o")), "something was compiled"


@pytest.mark.parametrize("value", ["10m", "0", "-1", "nan"])
def test_generator_timeout_refused_by_every_command(tmp_path: Path, value: str) -> None:
    for args in (("doctor",), ("plan", "--manifest", str(tmp_path / "none.toml")), ("audit", str(tmp_path))):
        res = run_qola(*args, env={"QOLA_GENERATOR_TIMEOUT": value})
        assert res.returncode == 2 and f"QOLA_GENERATOR_TIMEOUT={value!r}" in res.stderr, (args, res.stderr)
        assert "Traceback" not in res.stderr and "not a number of seconds" in res.stderr


def test_good_knob_values_pass() -> None:
    knobs.check_environment(
        {
            "QOLA_GENERATOR_TIMEOUT": "inf",
            "QOLA_PROBE_TIMEOUT": "2.5",
            "QOLA_FORCE_AITER_CHECKOUT": "1",
            "QOLA_JIT_COMPILER": "/opt/rocm/bin/hipcc",
            "QOLA_JIT_PREBUILT_DIR": "",
            "QOLA_WAIT": "0",
            "QOLA_JIT_COVERAGE": "anything: the runtime checks its own",
        }
    )


# names of C macros, CMake variables and templates that hold "QOLA_" but are no environment variable
NOT_VARIABLES = {
    "QOLA_CONFIG_H",
    "QOLA_C_NAME",
    "QOLA_DEFINE_VERSION",
    "QOLA_EMBEDDED_",
    "QOLA_EMBED_ENTRY_V1",
    "QOLA_JIT_AHEAD",
    "QOLA_JIT_DECLARE_MODULE",
    "QOLA_JIT_DIR",
    "QOLA_JIT_GET",
    "QOLA_JIT_HEADERS",
    "QOLA_JIT_HIDDEN",
    "QOLA_NAMESPACE",
    "QOLA_NAMESPACE_STR",
    "QOLA_NS_BEGIN",
    "QOLA_NS_END",
    "QOLA_PREBUILT_DIR_",
    "QOLA_RECORD_RETAIN",
    "QOLA_SWITCH_",
    "QOLA_VERSION_STR",
    "QOLA_VISIBLE",
}


def test_every_qola_variable_in_the_source_is_declared() -> None:
    """A new ``QOLA_*`` name in qola's Python source is either declared (qola.core.settings: checked
    before work) or listed above as no environment variable."""
    names = set()
    for path in (REPO / "qola").rglob("*.py"):
        names |= set(re.findall(r"QOLA_[A-Z0-9_]+", path.read_text(encoding="utf-8")))
    undeclared = names - knobs.declared_variables() - NOT_VARIABLES
    assert not undeclared, f"declare these in qola/core/settings.py (or list them here as no variable): {undeclared}"
    assert not (knobs.declared_variables() & NOT_VARIABLES)
