"""Shape checks for the JIT's JSON: ``OUT/jit/<module>/index.json`` and the table a library
records (:mod:`qola.jit.libtable`). Hostile or damaged files give one QolaError that names the
file, the key path and what was expected — never a KeyError/TypeError further down.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qola.core.errors import QolaError
from qola.jit import format as fmt
from qola.jit import safeio

NAME = re.compile(r"(?!\.\.?\Z)[^/\x00-\x1f]{1,255}")  # unit / module names: one path component, no controls
_BAD_CHARS = re.compile(r"[\x00\n\r]")
MAX_UNITS = 1_000_000
MAX_FLAGS = 10_000

Spec = Any  # type | "hex" | "name" | "relpath" | "hex?" | dict[str, Spec] | list[Spec] (one element: item spec)

UNIT = {"name": "name", "source": "relpath", "source_sha256": "hex", "entry_symbol": "name",
        "content_key": "hex"}  # fmt: skip
INDEX = {
    "format": str, "version": int, "module": "name", "lang": str, "arch": str,
    "compiler": {"path": str, "identity": "hex"},
    "headers": {"bundle": str, "sha256": "hex?"},
    "flags": [str],
    "units": [UNIT],
}  # fmt: skip
RECORD = {
    "module": "name", "jit_dir_rel": str, "lang": str, "arch": str, "compiler": str, "compiler_id": "hex",
    "headers": str, "headers_sha256": "hex?", "headers_digest": "hex?", "flags": [str],
    "units": [{"name": "name", "source": "relpath", "source_sha256": "hex", "entry_symbol": "name",
               "content_key": "hex", "n_funcs": int}],
}  # fmt: skip


def _bad(where: str, path: str, want: str, value: Any) -> QolaError:
    got = type(value).__name__ if not isinstance(value, str) else repr(value[:80])
    return QolaError(f"{where}: {path or 'the top level'}: expected {want}, got {got}",
                     hint="the file is damaged or was edited; rebuild the output dir (or reinstall it)")  # fmt: skip


def check(value: Any, spec: Spec, where: str, path: str = "") -> None:
    """Raise QolaError unless ``value`` has the shape ``spec`` (extra keys are allowed)."""
    if isinstance(spec, dict):
        if not isinstance(value, dict):
            raise _bad(where, path, "an object", value)
        for k, sub in spec.items():
            if k not in value:
                raise QolaError(f"{where}: missing key {path + '.' if path else ''}{k}",
                                hint="the file is damaged or was edited; rebuild the output dir")  # fmt: skip
            check(value[k], sub, where, f"{path}.{k}" if path else k)
    elif isinstance(spec, list):
        if not isinstance(value, list):
            raise _bad(where, path, "a list", value)
        if len(value) > (MAX_UNITS if path.endswith("units") else MAX_FLAGS):
            raise QolaError(f"{where}: {path}: {len(value)} items is more than qola accepts")
        for i, item in enumerate(value):
            check(item, spec[0], where, f"{path}[{i}]")
    elif spec is int:
        if type(value) is not int or value < 0:
            raise _bad(where, path, "a non-negative integer", value)
    elif spec is str:
        if not isinstance(value, str) or _BAD_CHARS.search(value):
            raise _bad(where, path, "a string without NUL or newlines", value)
    elif spec in ("hex", "hex?"):
        if not isinstance(value, str) or not (fmt.HEX64.fullmatch(value) or (spec == "hex?" and value == "")):
            raise _bad(where, path, "a lowercase sha256 hex digest" + (' (or "")' if spec == "hex?" else ""), value)
    elif spec == "name":
        if not isinstance(value, str) or not NAME.fullmatch(value):
            raise _bad(where, path, "a name (one path component, no control characters)", value)
    elif spec == "relpath":
        if not isinstance(value, str) or not is_relpath(value):
            raise _bad(where, path, "a relative path inside the module's dir", value)
    else:  # pragma: no cover - a bug in the specs above
        raise AssertionError(spec)


def is_relpath(value: str) -> bool:
    parts = value.split("/")
    return (
        0 < len(value) <= 4096 and not value.startswith("/") and not _BAD_CHARS.search(value)
        and all(p not in ("", ".", "..") for p in parts)
    )  # fmt: skip


def unique_units(units: list[dict[str, Any]], where: str) -> dict[str, dict[str, Any]]:
    by_name: dict[str, dict[str, Any]] = {}
    for u in units:
        if u["name"] in by_name:
            raise QolaError(f"{where}: unit {u['name']} is listed twice", hint="rebuild the output dir")
        by_name[u["name"]] = u
    return by_name


@dataclass(frozen=True)
class IndexUnit:
    """One unit of ``index.json``: its JIT copy (relative to the module's dir) and keys."""

    name: str
    source: str
    source_sha256: str
    entry_symbol: str
    content_key: str


@dataclass(frozen=True)
class JitIndex:
    """``OUT/jit/<module>/index.json`` as the tools read it (what :data:`INDEX` checks; the file holds
    more for people: style, each unit's functions and key)."""

    module: str
    lang: str
    arch: str
    compiler_path: str
    compiler_identity: str
    headers_bundle: str  # "" when no header is bundled
    headers_sha256: str
    flags: tuple[str, ...]
    units: Mapping[str, IndexUnit]

    @classmethod
    def parse(cls, data: object, where: str) -> JitIndex:
        """``data`` (the file's JSON) checked against :data:`INDEX`; QolaError naming what is wrong."""
        check(data, INDEX, where)
        assert isinstance(data, dict)
        compiler, headers = data["compiler"], data["headers"]
        units = {n: IndexUnit(n, u["source"], u["source_sha256"], u["entry_symbol"], u["content_key"])
                 for n, u in unique_units(data["units"], where).items()}  # fmt: skip
        return cls(data["module"], data["lang"], data["arch"], compiler["path"], compiler["identity"],
                   headers["bundle"], headers["sha256"], tuple(data["flags"]), units)  # fmt: skip


def loads(data: bytes, where: str) -> Any:
    """json.loads with clear errors for bad UTF-8, bad JSON and nesting too deep to read."""
    try:
        return json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise QolaError(f"{where} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise QolaError(f"{where} is not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})",
                        hint="rebuild the output dir") from None  # fmt: skip
    except (RecursionError, MemoryError):
        hint = "rebuild the output dir"
        raise QolaError(f"{where}: JSON nested too deeply or too large to read", hint=hint) from None


def read_json(path: Path, max_size: int = fmt.MAX_INDEX) -> Any:
    """Read a JSON file through :func:`qola.jit.safeio.read_regular` (a symlink to a regular file is followed)."""
    return loads(safeio.read_regular(path, max_size=max_size, follow=True), str(path))
