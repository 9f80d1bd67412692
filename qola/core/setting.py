"""The settings machinery: what one :class:`Setting` declares, the resolver of one setting
(:func:`resolve`) and of all of them at once (:func:`resolve_all`, into one frozen
:class:`Values`), the manifest's raw tables read once (:func:`manifest_tables`), and the docs table.

The declarations themselves are in :mod:`qola.core.settings`. Every setting keeps one order:

    command line > manifest > environment > default

as scikit-build-core's settings do with one source chain. A source that gives nothing (None,
``""``, an empty list, ``--arch ""``) is passed over. A value that is wrong is a
:class:`~qola.core.errors.QolaError` naming its source (the flag, the manifest key or the variable)
and how to fix it there. With ``check_every`` a wrong value is an error even where a source before
it decides (``-j 2`` does not hide a broken ``MAX_JOBS``). Where a value comes from is kept
(:meth:`Values.where`): messages, records and ``qola plan --json`` name it.

Standard library only (the no-op fast path resolves settings before anything heavy loads).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Annotated, Generic, Literal, TypeVar, cast

from qola.core.errors import QolaError
from qola.core.secret import shown

T = TypeVar("T")

Shape = Literal["value", "repeatable", "switch", "choices", "optional"]  # how argparse takes the flag
Tables = Mapping[str, Mapping[str, object]]  # a manifest's raw TOML: section -> key -> value


class SettingValueError(ValueError):
    """A setting's check refused a manifest value (the schema names the key: no second "got")."""


@dataclass(frozen=True)
class Setting(Generic[T]):
    """One setting, declared once: where it may come from, the one check of its value, how the
    command line takes it, how the manifest's schema accepts it and how the docs show it."""

    name: str  # what messages and records call it (the argparse dest, the key of BuildSpec.given)
    parse: Callable[[object], T | None]  # a source's value -> the value, None: not given; ValueError: wrong
    flags: tuple[str, ...] = ()  # its command-line flag(s); messages name them joined by '/'
    commands: tuple[str, ...] = ()  # the commands whose parser takes the flag ("build", "plan", "checkout")
    command_flags: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (command, its own spelling of the flag)
    shape: Shape = "value"
    choices: tuple[str, ...] = ()  # shape "choices": what the flag takes
    const: str | None = None  # shape "optional": the value of the flag given alone
    metavar: str | None = None
    typed: bool = False  # the flag's value checked as argparse parses it (else when it is resolved)
    env: tuple[str, ...] = ()  # its environment variables, the first one set counts
    manifest_key: tuple[str, str] | None = None  # (section, key): the manifest schema's field
    relative: bool = False  # a manifest value is a path relative to the manifest's dir
    toml: object = str  # the manifest field's TOML type (the schema checks it first: "expected a list")
    toml_default: object = None  # the schema's default of the field (what an absent key reads as)
    manifest_parse: Callable[[object], T | None] | None = None  # a stricter check of the manifest's value
    type_text: str = "text"  # the docs' type column
    default: T | Callable[[Mapping[str, str]], T] | None = None  # a value, or one of the environment
    default_text: str = "none"  # the docs' default column
    example: str = ""  # a good value, for the hints
    missing: str | None = None  # the error when a stage needs it and no source gives it
    check_every: bool = False  # a wrong value in a source passed over is an error too
    in_key: bool = False  # whether it enters the build key (qola.store.key; a test keeps them in step)
    help: str = ""  # the command line's help text
    shown: str = ""  # how messages name the command line's value (default: the flags joined by '/')

    @property
    def flag(self) -> str:
        return self.shown or "/".join(self.flags)

    @property
    def manifest(self) -> str | None:
        """The manifest key as messages name it (``[build].jobs``)."""
        return None if self.manifest_key is None else f"[{self.manifest_key[0]}].{self.manifest_key[1]}"

    def flags_of(self, command: str) -> tuple[str, ...]:
        return dict(self.command_flags).get(command, self.flags)

    def check(self, value: object, where: str) -> T | None:
        """``value`` as ``where`` gave it, checked (:data:`parse`); a QolaError naming ``where``."""
        parse = self.manifest_parse if where == self.manifest and self.manifest_parse else self.parse
        try:
            return parse(value)
        except ValueError as exc:
            raise QolaError(f"{_shown(where)}: {exc}", hint=self.fix(where)) from None

    def fix(self, where: str) -> str:
        if where == self.manifest:
            return f"fix {where} in the manifest, or remove it"
        if where in self.env:
            return f"set {where}={self.example}, or unset it" if self.example else f"unset {where}"
        return f"pass {self.flags[0]} {self.example}".rstrip()

    def absent(self) -> QolaError:
        """The one error for no value from any source (:data:`missing`)."""
        ways = [f"set {self.manifest} in the manifest"] if self.manifest else []
        ways += [f"pass {self.flags[0]} (e.g. {self.flags[0]} {self.example})"] if self.flags else []
        ways += [f"set {' or '.join(self.env)}"] if self.env else []
        return QolaError(self.missing or f"no {self.name} given", hint=", ".join(ways[:-1]) + ", or " + ways[-1])

    def schema_check(self, value: object) -> object:
        """The manifest schema's check of this setting's field: the one parse; the value kept in the
        field's own type (a list stays a list)."""
        if value is None:
            return None
        parse = self.manifest_parse or self.parse
        try:
            parsed = parse(value)
        except ValueError as exc:
            raise SettingValueError(str(exc)) from None
        return parsed if isinstance(parsed, type(value)) else value

    def schema_field(self) -> tuple[object, object]:
        """The manifest schema's field of this setting (pydantic's (type, default)): the key's TOML
        type, checked first as every key's is ("expected a list"), then :meth:`schema_check`."""
        from pydantic import AfterValidator  # lazy: the schema's; the no-op path never loads pydantic

        toml = self.toml | None  # type: ignore[operator]  # a type (int, list[str], a Literal) or None
        return Annotated[toml, AfterValidator(self.schema_check)], self.toml_default


def _shown(where: str) -> str:
    return where if where.startswith(("-", "[")) else f"environment variable {where}"


@dataclass(frozen=True)
class Chosen(Generic[T]):
    value: T
    where: str  # the flag, the manifest key, the variable, or DEFAULT


DEFAULT = "default"


def resolve(
    setting: Setting[T],
    cli: object = None,
    manifest: object = None,
    env: Mapping[str, str] | None = None,
    default: Callable[[], T] | None = None,
) -> Chosen[T]:
    """The value of ``setting``: command line > manifest > environment (only ``env``: what the
    caller resolved for this setting) > ``default()`` > the declaration's default. Nothing given:
    its :meth:`Setting.absent` error when ``missing`` says so, or a value of None."""
    sources: list[tuple[str, object]] = [(setting.flag, cli), (setting.manifest or "", manifest)]
    sources += [(name, (env or {}).get(name)) for name in setting.env]
    chosen: Chosen[T] | None = None
    for where, raw in sources:
        if raw is None:
            continue
        value = setting.check(raw, where)
        if value is None:
            continue
        chosen = chosen or Chosen(value, where)
        if not setting.check_every:
            break
    if chosen is not None:
        return chosen
    if default is not None:
        return Chosen(default(), DEFAULT)
    if setting.default is not None:
        return Chosen(_default_of(setting, env or {}), DEFAULT)
    if setting.missing:
        raise setting.absent()
    return Chosen(cast(T, None), DEFAULT)  # an optional setting no source gives


def _default_of(setting: Setting[T], env: Mapping[str, str]) -> T:
    given = setting.default
    if callable(given):
        return given(env)
    return cast(T, given)


@dataclass(frozen=True)
class Values:
    """Every setting resolved once (:func:`resolve_all`), with where each value came from. Typed
    access: ``values[settings.JOBS]`` is an ``int``; a setting a stage needs and nobody gave
    (``missing``), or one a source gave wrong (``refused``), raises its one error there, and
    :meth:`check` raises the first of them (a build calls it before any work)."""

    chosen: Mapping[str, Chosen[object]] = field(default_factory=dict)
    refused: Mapping[str, QolaError] = field(default_factory=dict)  # the error of a wrong value, by name

    def check(self) -> None:
        """The error of the first wrong value, if any (``qola plan`` shows no ``-j``: it never asks)."""
        for error in self.refused.values():
            raise error

    def __getitem__(self, setting: Setting[T]) -> T:
        if setting.name in self.refused:
            raise self.refused[setting.name]
        got = self.chosen.get(setting.name)
        if got is None or got.value is None:
            if setting.missing:
                raise setting.absent()
            return cast(T, None)
        return cast(T, got.value)

    def where(self, setting: Setting[T]) -> str:
        """The flag, the manifest key, the variable or :data:`DEFAULT` that gave ``setting``."""
        got = self.chosen.get(setting.name)
        return DEFAULT if got is None else got.where

    def by_flag(self, setting: Setting[T]) -> bool:
        """Whether the command line gave ``setting``."""
        return self.where(setting) == setting.flag

    def to_json(self) -> dict[str, dict[str, object]]:
        """name -> {"value", "from"} (``qola plan --json``'s "sources"); each value as it may be shown
        (:func:`qola.core.secret.shown`: a URL's credentials masked)."""
        out: dict[str, dict[str, object]] = {}
        for name, got in sorted(self.chosen.items()):
            value = list(got.value) if isinstance(got.value, tuple) else got.value
            out[name] = {"value": shown(value), "from": got.where}
        return out


def resolve_all(
    declared: Iterable[Setting[object]],
    cli: Mapping[str, object],
    tables: Tables,
    env: Mapping[str, str],
    base: Path | None = None,
) -> Values:
    """Every setting of ``declared`` by its chain, once: ``cli`` (the command line's values by
    setting name), the manifest's raw ``tables`` (:func:`manifest_tables`; a ``relative`` path is
    joined to ``base``, the manifest's dir), ``env``. Nothing is refused here: a setting that is
    ``missing`` or given wrong raises where a stage reads it (:meth:`Values.__getitem__`), or at
    :meth:`Values.check`."""
    chosen: dict[str, Chosen[object]] = {}
    refused: dict[str, QolaError] = {}
    for s in declared:
        optional = replace(s, missing=None)  # a required one: no absent() error before a stage needs it
        given = {k: env[k] for k in s.env if k in env}
        try:
            chosen[s.name] = resolve(optional, cli.get(s.name), _table_value(s, tables, base), given)
        except QolaError as exc:
            refused[s.name] = exc
    return Values(chosen, refused)


def _table_value(setting: Setting[object], tables: Tables, base: Path | None) -> object:
    if setting.manifest_key is None:
        return None
    section, key = setting.manifest_key
    table = tables.get(section)
    value = table.get(key) if isinstance(table, Mapping) else None
    if setting.relative and isinstance(value, str) and value and "\0" not in value and base is not None:
        return str(base / value)
    return value


MAX_MANIFEST_READ = 4 * 1024 * 1024  # qola.plan.tree.files.MAX_MANIFEST: the schema refuses more


def manifest_tables(path: str | None) -> tuple[Tables, Path | None]:
    """The raw tables of the manifest at ``path`` (a small regular file), read once with the one
    TOML reader, and its dir; ({}, None) when it cannot be read: the schema's load says why."""
    from qola.core import inputs, tomlfile  # lazy: only commands with a manifest read it

    if not path:
        return {}, None
    try:
        p = Path(path)
        st = p.stat()
        if not p.is_file() or st.st_size > MAX_MANIFEST_READ:
            return {}, None
        data = tomlfile.loads(inputs.read_record(p, limit=MAX_MANIFEST_READ, what="manifest"))
    except (OSError, ValueError, UnicodeDecodeError, RecursionError, QolaError):
        return {}, None
    base = Path(os.path.realpath(p)).parent  # as the schema's Manifest.base_dir
    return {k: v for k, v in data.items() if isinstance(v, dict)}, base


def arg_type(setting: Setting[T]) -> Callable[[str], T]:
    """The argparse ``type=`` of ``setting``'s flag: :meth:`Setting.check` (argparse then exits 2
    naming the flag)."""

    def convert(text: str) -> T:
        try:
            value = setting.parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        if value is None:
            raise argparse.ArgumentTypeError(f"is empty; e.g. {setting.flags[0]} {setting.example}")
        return value

    convert.__name__ = setting.name  # argparse names it in "invalid <name> value"
    return convert


def add_argument(parser: argparse.ArgumentParser, setting: Setting[object], command: str) -> None:
    """``setting``'s flag on ``command``'s parser, in the shape it declares."""
    flags = setting.flags_of(command)
    if setting.shape == "switch":
        parser.add_argument(*flags, dest=setting.name, action="store_true", default=None, help=setting.help)
        return
    kw: dict[str, object] = {"help": setting.help}
    if setting.metavar:
        kw["metavar"] = setting.metavar
    if setting.shape == "repeatable":
        kw["action"] = "append"
    if setting.shape == "choices":
        kw["choices"] = list(setting.choices)
    if setting.shape == "optional":
        kw["nargs"], kw["const"] = "?", setting.parse(setting.const)
    if setting.typed:
        kw["type"] = arg_type(setting)
    parser.add_argument(*flags, dest=setting.name, **kw)  # type: ignore[arg-type]  # argparse's kwargs


def table(declared: Iterable[Setting[object]]) -> str:
    """The docs' settings table (README.md, docs/manifest.md): one row per declaration."""
    rows = [
        "| setting | flag | manifest key | environment | type | default | in build key |",
        "|---|---|---|---|---|---|---|",
    ]
    for s in declared:
        cells = (
            s.name,
            " / ".join(f"`{f}`" for f in s.flags) or "-",
            f"`{s.manifest}`" if s.manifest else "-",
            " / ".join(f"`{e}`" for e in s.env) or "-",
            s.type_text,
            s.default_text,
            "yes" if s.in_key else "no",
        )
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(rows) + "\n"
