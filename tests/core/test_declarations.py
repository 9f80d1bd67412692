"""Issue 43 item 1: a setting is one declaration (qola/core/settings.py). Adding one makes its flag
appear on the commands it names, its variable read, its manifest key accepted by the schema and
resolved, and its row in the docs tables; the docs tables are the declarations' (a test fails when
the committed text differs)."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from pydantic import BaseModel
from support.common import REPO

from qola.commands.common import add_manifest_args, spec_of
from qola.core import knobs, settings
from qola.core.errors import QolaError
from qola.core.setting import Setting, table
from qola.plan import manifest as manifest_mod

STAMP: Setting[int] = Setting(
    "stamp",
    settings.jobs,
    flags=("--stamp",),
    commands=(settings.BUILD,),
    typed=True,
    env=("QOLA_TEST_STAMP",),
    manifest_key=("build", "stamp"),
    toml=int,
    type_text="integer",
    default=7,
    default_text="7",
    example="3",
)


@pytest.fixture
def with_stamp(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """STAMP declared (one edit: the declarations list) and the schema made again from it."""
    monkeypatch.setattr(settings, "ALL", (*settings.ALL, STAMP))
    try:
        yield importlib.reload(manifest_mod)
    finally:
        monkeypatch.undo()
        importlib.reload(manifest_mod)


def test_a_new_declaration_is_seen_everywhere(with_stamp: ModuleType, tmp_path: Path) -> None:
    # the command line: the build command takes its flag, checked by its one parse
    parser = argparse.ArgumentParser()
    add_manifest_args(parser, settings.BUILD)
    args = parser.parse_args(["--manifest", "m.toml", "--stamp", "4"])
    assert spec_of(args, {}).given["stamp"] == 4
    with pytest.raises(SystemExit):
        parser.parse_args(["--manifest", "m.toml", "--stamp", "0"])
    plan_parser = argparse.ArgumentParser()
    add_manifest_args(plan_parser, settings.PLAN)  # a command it does not name: no flag
    with pytest.raises(SystemExit):
        plan_parser.parse_args(["--manifest", "m.toml", "--stamp", "4"])
    # the environment, and the default
    values = settings.resolve_all({}, {}, {"QOLA_TEST_STAMP": "5"})
    assert (values[STAMP], values.where(STAMP)) == (5, "QOLA_TEST_STAMP")
    assert (settings.resolve_all({}, {}, {})[STAMP], settings.resolve_all({}, {}, {}).where(STAMP)) == (7, "default")
    # the manifest: the schema accepts the key, the value resolves from it
    m = tmp_path / "q.toml"
    m.write_text('[build]\narchitectures = ["sm_90"]\nstamp = 6\n')
    assert with_stamp.load(m).build.model_dump()["stamp"] == 6
    tables, base = settings.manifest_tables(str(m))
    values = settings.resolve_all({}, tables, {"QOLA_TEST_STAMP": "5"}, base)
    assert (values[STAMP], values.where(STAMP)) == (6, "[build].stamp")
    m.write_text("[build]\nstamp = 0\n")  # one message for every source
    with pytest.raises(QolaError, match=r"build\.stamp: must be between 1 and 4096, got 0"):
        with_stamp.load(m)
    # the docs table
    assert "| stamp | `--stamp` | `[build].stamp` | `QOLA_TEST_STAMP` | integer | 7 | no |" in table(
        settings.declared()
    )


def test_without_the_declaration_the_key_is_refused(tmp_path: Path) -> None:
    m = tmp_path / "q.toml"
    m.write_text("[build]\nstamp = 6\n")
    with pytest.raises(QolaError, match="stamp"):
        manifest_mod.load(m)


SECTIONS: dict[str, tuple[type[BaseModel], type[BaseModel]]] = {
    "qola": (manifest_mod.QolaSection, manifest_mod._QolaBase),
    "build": (manifest_mod.BuildSection, manifest_mod._BuildBase),
    "jit": (manifest_mod.JitSection, manifest_mod._JitBase),
    "usage": (manifest_mod.UsageSection, manifest_mod._UsageBase),
}


def test_one_declaration_per_setting() -> None:
    """Every declared manifest key is a schema field, and every schema field a setting reads is
    declared once (the sections' own fields are the rest); names, flags and variables are unique."""
    keys = [s.manifest_key for s in settings.ALL if s.manifest_key]
    assert len(keys) == len(set(keys))
    for section, (made, base) in SECTIONS.items():
        declared = {key for sec, key in keys if sec == section}
        assert set(made.model_fields) - set(base.model_fields) == declared, section
    every = (*settings.ALL, *knobs.KNOBS)
    names = [s.name for s in every]
    flags = [f for s in settings.ALL for f in s.flags]
    variables = [v for s in every for v in s.env]
    assert len(names) == len(set(names)) and len(flags) == len(set(flags)) and len(variables) == len(set(variables))
    assert len(settings.ALL) == 16  # the 9 of issue 36, the 5 that were chained by hand, [qola] fixes, --no-cache


def test_the_docs_tables_are_the_declarations() -> None:
    spec = importlib.util.spec_from_file_location("docs_tables", REPO / "scripts" / "docs_tables.py")
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    for name in script.FILES:
        text = (REPO / name).read_text(encoding="utf-8")
        assert script.rendered(text) == text, f"{name}: the settings table is stale; run python scripts/docs_tables.py"
