"""AITER's tuned-config files: which CSV a ``AITER_CONFIG_*_FILE`` name stands for, and the
merged file AITER builds when there is more than one.

AITER (``aiter/jit/core.py``, ``AITER_CONFIG.get_config_file`` / ``update_config_files``) takes
the environment variable when set, else the default CSV plus every per-model CSV under
``aiter/configs/model_configs/`` whose name contains the config's stem; two or more files are
merged with pandas into ``/tmp/aiter_configs/<stem>.csv``. That shared, predictable path can be
planted by anyone on the machine, so qola never uses it: a merged config is named
``{qola_configs}/<stem>.csv`` in the plan, the plan carries the merge recipe
(:class:`MergedConfig`), and codegen writes the file into the build dir before the generators
run. Everything here is pure (reads files, returns data) except :func:`write_merged`.

The merge reproduces AITER 33f2e6af's rows with the stdlib ``csv`` module: the files are
concatenated (empty ones skipped; their columns must match the first file's, ignoring
``_tag``), ``_tag`` gaps become ``""``, and when the untuned CSV exists the rows are sorted by
``us`` and only the first row of each key (the untuned CSV's columns, ``cu_num``, ``_tag``) is
kept; a tree whose core.py merges without ``cu_num`` (the amd-aiter 0.1.7 sdist) keys on the
untuned CSV's columns alone (``MergedConfig.per_cu_num``, read from core.py). Values are written as they appear in the source files; only keys and ``us`` are compared
as pandas would parse them.
"""

from __future__ import annotations

import csv
import hashlib
import io
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qola.core.errors import QolaError
from qola.core.fsutil import inside, write_if_changed
from qola.plan.tree.files import MAX_CSV, read_small

CONFIGS_TOKEN = "{qola_configs}"  # the directory of merged configs; never "{}" (a generator's output dir)
MODEL_CONFIGS = "aiter/configs/model_configs"
CONFIGS = "aiter/configs"
# pandas.read_csv's default NA strings: such cells are missing values, not text
_NA = frozenset(
    {
        "",
        "#N/A",
        "#N/A N/A",
        "#NA",
        "-1.#IND",
        "-1.#QNAN",
        "-NaN",
        "-nan",
        "1.#IND",
        "1.#QNAN",
        "<NA>",
        "N/A",
        "NA",
        "NULL",
        "NaN",
        "None",
        "n/a",
        "nan",
        "null",
    }
)
_BOOL = {"true": True, "false": False}


@dataclass(frozen=True)
class MergedConfig:
    """One merged tuned-config file: what AITER would write to ``/tmp/aiter_configs/<name>``."""

    name: str  # "<stem>.csv"
    sources: tuple[str, ...]  # in AITER's order: the default (or the env's first path) first
    untuned: str  # <root>/aiter/configs/<untuned stem>.csv: its columns are the dedup keys (may not
    # exist: then nothing is deduplicated); "" where AITER's naming rule fails for the stem
    per_cu_num: bool = True  # cu_num is a dedup key too (AITER 33f2e6af's merge; not the 0.1.7 sdist's)

    @property
    def path(self) -> str:
        return f"{CONFIGS_TOKEN}/{self.name}"


@dataclass(frozen=True)
class Merged:
    header: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    notes: tuple[str, ...] = ()  # sources that do not exist (AITER skips them too)


def untuned_name(stem: str) -> str:
    """AITER's rule for the untuned CSV's stem (``a8w8_tuned_gemm`` → ``a8w8_untuned_gemm``)."""
    if re.search(r"(?:_)?tuned$", stem):
        # AITER's re.sub(r"(?:_)?tuned$", r"\1untuned", …) refers to a group that does not exist
        raise QolaError(
            f"tuned config {stem!r} ends in 'tuned': AITER's rule for its untuned file fails on such a name "
            "(re.error: invalid group reference), so AITER cannot merge it either",
            hint="set its AITER_CONFIG_* environment variable to a single CSV, or rename the config",
        )
    return stem.replace("tuned", "untuned")


def config_file(
    env_name: str, default: str, stem: str, *, env: Mapping[str, str], root: Path, per_cu_num: bool = True
) -> str | MergedConfig:
    """``AITER_CONFIG.get_config_file(env_name, default, stem)``: a plain path, or a merge to make
    (``per_cu_num``: the tree's merge keeps a row per cu_num, :class:`MergedConfig`)."""
    value = env.get(env_name)
    if value:
        return _split(value, stem, root, per_cu_num)
    model_dir = root / MODEL_CONFIGS
    # AITER lists the directory in os.scandir order; sorted here so the merge order is the same
    # on every file system (it decides which of two equally fast duplicate rows survives)
    found = sorted(str(p) for p in model_dir.glob(f"*{stem}*") if p.is_file() and "untuned" not in str(p))
    if not found:
        return default
    return _split(":".join([default, *found]), stem, root, per_cu_num)


def _split(file_path: str, stem: str, root: Path, per_cu_num: bool = True) -> str | MergedConfig:
    """``update_config_files``: one path is returned as is; ``a:b:…`` is a merge."""
    parts = file_path.split(os.pathsep) if file_path else []
    if len(parts) <= 1:
        return file_path
    try:
        untuned = str(root / CONFIGS / f"{untuned_name(stem)}.csv")
    except QolaError:
        untuned = ""  # AITER fails on this name; merge() says so, when (and only if) the file is used
    return MergedConfig(f"{stem}.csv", tuple(parts), untuned, per_cu_num)


def _read(path: str) -> tuple[list[str], list[list[str]]]:
    try:
        text = read_small(path, limit=MAX_CSV, what="tuned config").decode("utf-8-sig")
        lines = [r for r in csv.reader(io.StringIO(text, newline="")) if r]  # pandas skips blank lines
    except FileNotFoundError:
        raise QolaError(f"cannot read tuned config {path}: it does not exist") from None
    except (UnicodeDecodeError, csv.Error) as exc:
        raise QolaError(f"cannot read tuned config {path}: {exc}") from None
    if not lines:
        raise QolaError(
            f"tuned config {path} is empty (no header line)", hint="AITER's pandas.read_csv fails on it too"
        )
    header, rows = lines[0], lines[1:]
    for i, row in enumerate(rows):
        if len(row) > len(header):
            raise QolaError(f"tuned config {path}: line {i + 2} has {len(row)} fields, the header {len(header)}")
        row.extend([""] * (len(header) - len(row)))
    return header, rows


def _kind(values: list[str]) -> str:
    """How pandas types one column of one file: "num", "bool" or "str" (missing values do not count)."""
    present = [v for v in values if v not in _NA]
    if all(_BOOL.get(v.lower()) is not None for v in present) and present:
        return "bool"
    try:
        for v in present:
            if "_" in v or v != v.strip():
                raise ValueError(v)
            float(v)
    except ValueError:
        return "str"
    return "num"


_MISSING = ("<missing>",)  # pandas' NaN: equal to itself for drop_duplicates, sorted last


def _typed(value: str, kind: str) -> object:
    if value in _NA:
        return _MISSING
    if kind == "num":
        return float(value)
    if kind == "bool":
        return _BOOL[value.lower()]
    return value


def merge(cfg: MergedConfig) -> Merged:
    """The rows AITER 33f2e6af's ``update_config_files`` writes for ``cfg``."""
    if not cfg.untuned:
        untuned_name(cfg.name.removesuffix(".csv"))  # raises: AITER's rule fails on this name
    notes: list[str] = []
    first = cfg.sources[0]
    base_header, base_rows = _read(first)  # AITER reads the first file unchecked: missing is an error
    base_cols = [c for c in base_header if c != "_tag"]
    frames = [(first, base_header, base_rows)]
    for path in cfg.sources[1:]:
        if not os.path.exists(path):
            notes.append(f"tuned config {path} does not exist; merged without it (as AITER)")
            continue
        header, rows = _read(path)
        cols = [c for c in header if c != "_tag"]
        if cols != base_cols:
            raise QolaError(
                f"tuned configs {first} and {path} have different columns: {base_cols} vs {cols}",
                hint="AITER refuses to merge them too (its column check); fix the per-model CSV or the "
                "AITER_CONFIG_* variable",
            )
        frames.append((path, header, rows))
    non_empty = [f for f in frames if f[2]]
    if not non_empty:  # pandas.concat([]) raises in AITER; qola writes the header alone
        return Merged(tuple(base_header), (), tuple(notes))
    columns: list[str] = []
    for _, header, _ in non_empty:  # pandas.concat: the union of columns in order of appearance
        columns += [c for c in header if c not in columns]
    has_tag = "_tag" in columns
    # every row as (values as written, values as pandas compares them), in concat order
    table: list[tuple[list[str], dict[str, object]]] = []
    for _, header, rows in non_empty:
        kinds = {c: _kind([r[i] for r in rows]) for i, c in enumerate(header)}
        for r in rows:
            cells = dict(zip(header, r))
            out = [cells.get(c, "") for c in columns]
            if has_tag and out[columns.index("_tag")] in _NA:
                out[columns.index("_tag")] = ""  # merge_df["_tag"].fillna("")
            typed = {c: _typed(cells[c], kinds[c]) for c in header}
            if has_tag:
                typed["_tag"] = out[columns.index("_tag")]
            table.append((out, typed))
    if os.path.exists(cfg.untuned):
        keys = list(_read(cfg.untuned)[0])
        if cfg.per_cu_num and "cu_num" not in keys:
            keys.append("cu_num")
        keys += ["_tag"] if has_tag else []
        missing = [k for k in dict.fromkeys([*keys, "us"]) if k not in columns]
        if missing:
            raise QolaError(
                f"merged tuned config {cfg.name} lacks column(s) {missing} (keys from {cfg.untuned}, and 'us')",
                hint="AITER's merge fails on it too (pandas KeyError)",
            )
        table = _first_per_key(_sorted_by_us(table, cfg), keys)
    return Merged(tuple(columns), tuple(tuple(out) for out, _ in table), tuple(notes))


def _sorted_by_us(table: list[Any], cfg: MergedConfig) -> list[Any]:
    """``sort_values("us")``: numbers ascending, missing last. Stable (Python's sort), which is
    where qola can differ from AITER: pandas sorts with numpy's quicksort (not stable), so of two
    rows with the same key *and* the same ``us`` it may keep either; qola keeps the earlier one."""
    values = [typed["us"] for _, typed in table]
    present = [v for v in values if v is not _MISSING]
    if all(isinstance(v, float) for v in present):
        return sorted(table, key=lambda t: (t[1]["us"] is _MISSING, 0.0 if t[1]["us"] is _MISSING else t[1]["us"]))
    if all(isinstance(v, str) for v in present):
        return sorted(table, key=lambda t: (t[1]["us"] is _MISSING, "" if t[1]["us"] is _MISSING else t[1]["us"]))
    raise QolaError(
        f"merged tuned config {cfg.name}: column 'us' mixes numbers and text; it cannot be ordered",
        hint="AITER's sort_values('us') fails on it too",
    )


def _first_per_key(table: list[Any], keys: list[str]) -> list[Any]:
    seen: set[tuple[Any, ...]] = set()
    kept = []
    for out, typed in table:
        key = tuple(_hashable(typed.get(k, _MISSING)) for k in keys)
        if key not in seen:
            seen.add(key)
            kept.append((out, typed))
    return kept


def _hashable(value: object) -> object:
    return _MISSING if isinstance(value, float) and math.isnan(value) else value


def render(merged: Merged) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(merged.header)
    writer.writerows(merged.rows)
    return buf.getvalue()


def write_merged(cfg: MergedConfig, directory: Path) -> str:
    """Write ``cfg``'s merged CSV into ``directory`` (atomically; untouched when unchanged).

    Returns the sha256 of its content."""
    data = render(merge(cfg)).encode("utf-8")
    write_if_changed(inside(directory, cfg.name), data)
    return hashlib.sha256(data).hexdigest()
