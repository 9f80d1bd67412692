"""Transformer Engine's checkout flows as QoLA serves them, in the order TE's CMakeLists.txt runs them
(``qola.cli`` with ``PYTHONPATH=<QoLA checkout>``, TE's call forms, no extra flags):

1. ``checkout --manifest M --aiter-root <QoLA>/build/third_party/aiter`` — where QoLA applied its
   patches before (a TE checkout that switches builders), that dir is qola's own checkout dir
   (decided by its path, though TE names it): the changes are discarded and said, not refused;
2. ``build … --skip-checkout`` of the main manifest;
3. the gfx1250 manifest, pinning its own commit, built without ``--skip-checkout``: qola checks
   that pin out first, as QoLA does (it used to stop: "tree … is at …, but aiter_commit pins …").

A tree of the user's elsewhere with the same changes is still refused. The tree is the fixture of
tests/support/fixes_tree.py in a git mirror (two commits)."""

from __future__ import annotations

from pathlib import Path
from subprocess import CompletedProcess

import pytest
from support import fixes_tree as ft
from support.cli import copy_checkout, qola_cli
from support.gitrepo import git

pytestmark = pytest.mark.slow  # builds the fixture tree (nvcc)


def test_tes_checkout_flows(tmp_path: Path) -> None:
    bare, first, second = ft.mirror(tmp_path)
    qola_dir = copy_checkout(tmp_path / "QoLA")
    tree = qola_dir / "build" / "third_party" / "aiter"
    main = ft.pinned_manifest(tmp_path / "qola_manifest.toml", first, bare)
    v3 = ft.pinned_manifest(tmp_path / "qola_manifest_gfx1250.toml", second, bare)

    def run(*a: str) -> CompletedProcess[str]:  # TE's: PYTHONPATH=<QoLA>, its own working dir
        return qola_cli(*a, cwd=tmp_path, pythonpath=qola_dir)

    first_checkout = run("checkout", "--manifest", str(main), "--aiter-root", str(tree))
    assert first_checkout.returncode == 0, first_checkout.stderr
    ft.qola_patched(tree)  # the same dir after a build through QoLA
    again = run("checkout", "--manifest", str(main), "--aiter-root", str(tree))
    assert again.returncode == 0, again.stderr
    assert "discarded changes qola did not make in its own checkout dir" in again.stderr
    assert "csrc/cpp_itfs/mha_bwd.cu (M)" in again.stderr and f"AITER ready at {tree}" in again.stdout
    assert "if(a.v3_api_check) return -1;" not in (tree / "csrc/cpp_itfs/mha_bwd.cu").read_text()

    built = run(
        "build", "--manifest", str(main), "--aiter-root", str(tree), "--output-dir", str(qola_dir / "build"),
        "--arch", "sm_90", "--skip-checkout", "-j", "2",
    )  # fmt: skip
    assert built.returncode == 0, built.stdout + built.stderr[-3000:]

    v3_built = run(  # TE's gfx1250 tier: its own manifest and pin, no --skip-checkout
        "build", "--manifest", str(v3), "--aiter-root", str(tree), "--output-dir", str(qola_dir / "build_gfx1250"),
        "--arch", "sm_90", "-j", "2",
    )  # fmt: skip
    assert v3_built.returncode == 0, v3_built.stdout + v3_built.stderr[-3000:]
    assert git(tree, "rev-parse", "HEAD") == second
    assert (qola_dir / "build_gfx1250" / "lib" / "te_libmha_bwd.so").is_file()

    mine = tmp_path / "mine"  # a user's own tree with such changes is theirs: still refused
    git(tmp_path, "clone", "-q", str(bare), str(mine))
    ft.qola_patched(mine)
    refused = run("checkout", "--manifest", str(main), "--aiter-root", str(mine))
    assert refused.returncode == 2 and "has changes qola did not make" in refused.stderr
    assert "if(a.v3_api_check) return -1;" in (mine / "csrc/cpp_itfs/mha_bwd.cu").read_text()


BLOCKER = """import sys
class _Blocked:
    BLOCKED = ("pydantic", "pydantic_core", "rich", "elftools")
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in self.BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r} (blocked: TE's build requirements)", name=name)
        return None
sys.meta_path.insert(0, _Blocked())
"""


def test_checkout_runs_on_tes_build_requirements(tmp_path: Path) -> None:
    """TE's build requirements hold ninja and pybind11, not pydantic, rich or pyelftools: the checkout
    (which TE's CMake runs first, even when it then takes a prebuilt cache) needs none of them; a
    build says once what it needs, with the lines TE adds to its requirements."""
    bare, first, _second = ft.mirror(tmp_path)
    qola_dir = copy_checkout(tmp_path / "QoLA")
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BLOCKER)
    tree = qola_dir / "build" / "third_party" / "aiter"
    main = ft.pinned_manifest(tmp_path / "qola_manifest.toml", first, bare)
    env = {"PYTHONPATH": f"{qola_dir}:{site}"}
    out = qola_cli(
        "checkout", "--manifest", str(main), "--aiter-root", str(tree), cwd=tmp_path, pythonpath=None, env=env
    )
    assert out.returncode == 0, out.stderr
    assert git(tree, "rev-parse", "HEAD") == first and f"AITER ready at {tree}" in out.stdout
    built = qola_cli(
        "build", "--manifest", str(main), "--aiter-root", str(tree), "-o", str(tmp_path / "o"), "--skip-checkout",
        cwd=tmp_path, pythonpath=None, env=env,
    )  # fmt: skip
    assert built.returncode == 2 and "Traceback" not in built.stderr
    assert "adds these lines: 'pydantic>=2.5', 'rich>=13', 'pyelftools>=0.30'" in built.stderr
