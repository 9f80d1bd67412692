"""Issue 36 item 3: what a no-op ``qola build`` loads is pinned here, so the fast path's laziness is
kept by a test, not by comments: neither pydantic nor rich, and no qola module beyond the list below.

A module-level import added to one of these modules that pulls in another qola module (or a heavy
third-party one) fails this test. When a module truly belongs on the no-op path (a split module, a
new home of a rule the fast path reads), add it to ``NOOP_QOLA_MODULES`` in the same commit and say
why in its message."""

from __future__ import annotations

from pathlib import Path

from support.cli import MODULE
from support.common import run_qola
from support.fake_nvcc import fake_nvcc, make_tree
from support.fake_nvcc import pytestmark as needs_fake_nvcc  # g++ and a CUDA toolkit's cudart

pytestmark = needs_fake_nvcc

# the qola modules an up-to-date `qola build` may load (the CLI, the build command, the settings it
# resolves, the no-op record and what it digests): nothing that plans, compiles, renders or publishes
NOOP_QOLA_MODULES = frozenset(
    {
        "qola",
        "qola.checkout",
        "qola.checkout.choice",
        "qola.cli",
        "qola.commands",
        "qola.commands.build",
        "qola.commands.common",
        "qola.compile",
        "qola.compile.dist",
        "qola.compile.gensums",  # the incremental path checks the generated files changed since their stamp
        "qola.compile.layout",
        "qola.compile.ninja",
        "qola.compile.pathmap",  # object names: the unit's path with its roots named (stdlib only)
        "qola.compile.rebuild",
        "qola.compile.results",  # the result types the incremental recipe reads (issue 36 item 2)
        "qola.core",
        "qola.core.argfile",  # whether ninja's targets fit its command line (qola.compile.ninja.target_args; stdlib only)
        "qola.core.capture",  # split out of qola.core.proc (issue 36 item 4)
        "qola.core.childenv",  # split out of qola.core.proc (issue 36 item 4)
        "qola.core.deadlines",
        "qola.core.errors",
        "qola.core.fsutil",
        "qola.core.inputs",
        "qola.core.knobs",  # the QOLA_* variables checked before any work (split out of qola.core.settings)
        "qola.core.lock",
        "qola.core.owner",
        "qola.core.proc",
        "qola.core.rules",
        "qola.core.secret",
        "qola.core.setting",  # the settings machinery: the one resolve at start (issue 43 item 1)
        "qola.core.settings",  # every setting declared once: the build command's flags (issue 36 item 1)
        "qola.core.tomlfile",  # the manifest's raw tables, read once at start for every setting (issue 43)
        "qola.output",
        "qola.output.outdir",
        "qola.pipeline",
        "qola.pipeline.begin",  # stage 0: the one resolve (split out of qola.pipeline.spec, issue 43)
        "qola.pipeline.finish",
        "qola.pipeline.machine",  # the launcher / --dist / --remote settings (split out of qola.pipeline.spec)
        "qola.pipeline.prepare",  # stage 1 (split out of qola.pipeline.spec; its heavy imports are lazy)
        "qola.pipeline.preflight",
        "qola.pipeline.record",  # manifest.json's build record, split out of qola.pipeline.spec
        "qola.pipeline.report",
        "qola.pipeline.run",
        "qola.pipeline.spec",
        "qola.pipeline.views",  # the environment views (split out of qola.pipeline.spec)
        "qola.store",
        "qola.store.fastpath",
        "qola.store.key",
        "qola.toolchain",
        "qola.toolchain.identity",
        "qola.toolchain.portable",  # the portable-line rule ninja's writer checks (standard library only)
    }
)
HEAVY = ("pydantic", "rich")  # the manifest schema and the report table: a no-op build needs neither


def loaded_by_noop_build(tmp: Path) -> list[str]:
    """Build a one-module tree with the fake nvcc, then run the same ``qola build`` again (the fast
    path answers) and return every module that second run loaded."""
    tree = make_tree(tmp / "tree")
    manifest = tmp / "q.toml"
    manifest.write_text('[qola]\nnamespace = "qk"\n[build]\narchitectures = ["sm_90"]\n' + MODULE)
    args = ("build", "--manifest", manifest, "--aiter-root", tree, "-o", tmp / "out", "-j", "2")
    env = {"CUDACXX": str(fake_nvcc(tmp / "nvcc"))}
    first = run_qola(*args, env=env, cwd=tmp)
    assert first.returncode == 0 and "is up to date" not in first.stderr, first.stderr
    dump = tmp / "modules.txt"
    again = run_qola(*args, env=env, cwd=tmp, modules_to=dump)
    assert again.returncode == 0 and "is up to date" in again.stderr, again.stderr
    return dump.read_text().splitlines()


def test_a_noop_build_loads_neither_pydantic_nor_rich_and_only_the_listed_qola_modules(tmp_path: Path) -> None:
    modules = loaded_by_noop_build(tmp_path)
    assert "qola.store.fastpath" in modules  # the fast path answered
    assert [m for m in modules if m.split(".")[0] in HEAVY] == []
    qola = {m for m in modules if m == "qola" or m.startswith("qola.")}
    assert sorted(qola - NOOP_QOLA_MODULES) == []
