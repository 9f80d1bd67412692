"""Issue 36 item 1: every setting declared once (qola/core/settings.py) and resolved by one chain,
command line > manifest > environment > default; -j and --arch each checked by one rule, whichever
command or source gives them."""

from __future__ import annotations

from pathlib import Path

import pytest

from qola import cli
from qola.core import settings
from qola.core.errors import QolaError
from qola.core.settings import ARCHS, JOBS, resolve


def test_one_chain_keeps_the_precedence_and_names_the_source() -> None:
    env = {"MAX_JOBS": "5"}
    assert (resolve(JOBS, 7, 3, env).value, resolve(JOBS, 7, 3, env).where) == (7, "-j/--jobs")
    assert (resolve(JOBS, None, 3, env).value, resolve(JOBS, None, 3, env).where) == (3, "[build].jobs")
    assert (resolve(JOBS, None, None, env).value, resolve(JOBS, None, None, env).where) == (5, "MAX_JOBS")
    assert resolve(JOBS, None, None, {"MAX_JOBS": " "}, default=lambda: 11).where == settings.DEFAULT
    # --arch "" (CMake's empty list) names nothing: the manifest, then GPU_ARCHS decide
    assert resolve(ARCHS, [""], ["gfx942"], {"GPU_ARCHS": "gfx950"}).value == ("gfx942",)
    assert resolve(ARCHS, [""], [], {"GPU_ARCHS": "gfx950;gfx942"}).value == ("gfx950", "gfx942")
    assert resolve(ARCHS, ["sm_90;sm_80"], ["gfx942"], {}).value == ("sm_90", "sm_80")


def test_a_wrong_value_names_its_source_even_where_a_higher_one_decides() -> None:
    with pytest.raises(QolaError, match="environment variable MAX_JOBS: must be between 1 and 4096") as err:
        resolve(JOBS, 2, None, {"MAX_JOBS": "-1"})
    assert err.value.hint == "set MAX_JOBS=8, or unset it"
    with pytest.raises(QolaError, match=r"\[build\]\.jobs: must be between 1 and 4096, got 10000") as err:
        resolve(JOBS, 2, 10000, {})
    assert err.value.hint == "fix [build].jobs in the manifest, or remove it"


def test_one_duplicate_rule_for_every_arch_source() -> None:
    """A repeated architecture is refused the same way from --arch, the manifest and GPU_ARCHS."""
    from qola.plan.manifest import parse

    said = set()
    for cli_archs, env in ((["gfx942;gfx942"], {}), (None, {"GPU_ARCHS": "gfx942;gfx942"})):
        with pytest.raises(QolaError, match="architectures repeat an entry") as err:
            resolve(ARCHS, cli_archs, None, env)
        said.add(err.value.message.split(": ", 1)[1])
    with pytest.raises(QolaError, match="architectures repeat an entry") as err:
        parse('[build]\narchitectures = ["gfx942", "gfx942"]\n')
    assert len(said) == 1 and said.pop() in err.value.message


def test_no_gpu_architectures_is_said_once() -> None:
    """Planning (the resolved settings) and the toolchain (validate_archs) say the same thing, with one hint."""
    from qola.toolchain.archs import validate_archs

    values = settings.resolve_all({"archs": ("",)}, {"build": {}}, {"GPU_ARCHS": ";"})
    with pytest.raises(QolaError) as planned:
        values[ARCHS]
    with pytest.raises(QolaError) as probed:
        validate_archs([])
    assert planned.value.message == probed.value.message == "no GPU architectures given"
    assert planned.value.hint == probed.value.hint
    assert "--arch" in (planned.value.hint or "") and "GPU_ARCHS" in (planned.value.hint or "")


@pytest.mark.parametrize(
    "argv",
    [
        ["build", "-m", "q.toml", "-o", "out", "-j", "5000"],
        ["jit", "prebuild", "out", "-j", "5000"],
        ["audit", "out", "--reproduce", "-j", "0"],
    ],
)
def test_every_command_checks_jobs_by_the_one_rule(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "argument -j/--jobs: must be between 1 and 4096" in err, err


def test_jit_prebuild_reads_max_jobs_as_a_build_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`qola jit prebuild` had its own default (half the CPUs) and never read MAX_JOBS; it resolves
    -j through the one rule, before it looks at OUT."""
    monkeypatch.setenv("MAX_JOBS", "-1")
    code = cli.main(["jit", "prebuild", str(tmp_path / "absent")])
    err = capsys.readouterr().err
    assert code == 2 and "environment variable MAX_JOBS: must be between 1 and 4096" in err, err
    assert "set MAX_JOBS=8, or unset it" in err


def test_declarations_agree_with_the_build_key() -> None:
    """A manifest key a setting declares out of the build key is one the key leaves out, and one in
    it is hashed (qola.store.key.MANIFEST_IGNORED)."""
    from qola.store.key import MANIFEST_IGNORED

    checked = 0
    for s in settings.ALL:
        if not s.manifest:
            continue
        section, key = s.manifest.strip("[").split("].")
        ignored = key in MANIFEST_IGNORED.get(section, ())
        assert ignored != s.in_key, (s.name, s.manifest, s.in_key)
        checked += 1
    assert checked >= 4
