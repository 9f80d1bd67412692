"""The no-op fast path keys on the build, not its spelling (issue 42 item 3): the record was keyed on
the literal command line, one per build dir, so alternating ``qola build … -v`` and ``qola build …``
re-planned every time (~2 s each on TE's manifest). Options that change only how a build is shown or
waited for (``-v``, ``--quiet``, ``--wait``, ``--debug``), the order of the options and their
spelling (``-o X`` or ``--output-dir=X``, an abbreviated ``--verb``) share one record; an option that
changes what is built does not."""

from __future__ import annotations

from pathlib import Path

from support.cli import MODULE
from support.common import run_qola
from support.fake_nvcc import fake_nvcc, make_tree
from support.fake_nvcc import pytestmark as needs_fake_nvcc  # g++ and a CUDA toolkit's cudart

pytestmark = needs_fake_nvcc

UP_TO_DATE = "is up to date (nothing to do)"


def test_spellings_of_one_build_share_the_noop_record(tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "tree")
    m = tmp_path / "q.toml"
    m.write_text('[qola]\nnamespace = "qk"\n[build]\narchitectures = ["sm_90"]\n' + MODULE)
    env = {"CUDACXX": str(fake_nvcc(tmp_path / "nvcc"))}
    out = tmp_path / "out"
    base = ["build", "--manifest", str(m), "--aiter-root", str(tree), "-o", str(out)]
    first = run_qola(*base, env=env, cwd=tmp_path)
    assert first.returncode == 0 and UP_TO_DATE not in first.stderr, first.stderr
    spellings = (
        [*base, "-v"],
        base,
        [*base, "--quiet"],
        ["build", "--aiter-root", str(tree), f"--output-dir={out}", "--manifest", str(m), "--verb"],
        [*base, "--wait", "5", "--debug"],
        [*base, "-v"],
    )
    for argv in spellings:
        again = run_qola(*argv, env=env, cwd=tmp_path)
        assert again.returncode == 0 and UP_TO_DATE in again.stderr, (argv, again.stderr[-2000:])
    # what is built changes: --no-isolation links without the version script (a build, not a no-op)
    other = run_qola(*base, "--no-isolation", env=env, cwd=tmp_path)
    assert UP_TO_DATE not in other.stderr, other.stderr[-2000:]


def test_one_arch_list_spelled_two_ways_shares_the_record(tmp_path: Path) -> None:
    """``--arch a --arch b`` and ``--arch "a;b"`` name one list (the settings layer's parse decides):
    one record. The order of the archs is kept, not sorted: AITER's build reads the last one
    (``-D__Float4_e2m1fn_x2`` and its generators' own ``GPU_ARCHS`` rule), so another order may be
    another build."""
    tree = make_tree(tmp_path / "tree")
    m = tmp_path / "q.toml"
    m.write_text('[qola]\nnamespace = "qk"\n' + MODULE)
    two = fake_nvcc(tmp_path / "nvcc")  # one that knows both archs, as test_te_flow's
    two.write_text(two.read_text().replace("echo sm_90;", "echo sm_80; echo sm_90;"))
    env = {"CUDACXX": str(two)}
    out = tmp_path / "out"
    base = ["build", "--manifest", str(m), "--aiter-root", str(tree), "-o", str(out)]
    first = run_qola(*base, "--arch", "sm_80", "--arch", "sm_90", env=env, cwd=tmp_path)
    assert first.returncode == 0 and UP_TO_DATE not in first.stderr, first.stderr
    for arch in (["--arch", "sm_80;sm_90"], ["--arch", " sm_80 ; sm_90;"], ["--arch", "sm_80;", "--arch", "sm_90"]):
        again = run_qola(*base, *arch, env=env, cwd=tmp_path)
        assert again.returncode == 0 and UP_TO_DATE in again.stderr, (arch, again.stderr[-2000:])
    swapped = run_qola(*base, "--arch", "sm_90;sm_80", env=env, cwd=tmp_path)
    assert swapped.returncode == 0 and UP_TO_DATE not in swapped.stderr, swapped.stderr[-2000:]
