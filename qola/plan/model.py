"""The Plan: everything that decides what is compiled, as frozen data with a JSON round-trip.

:func:`qola.plan.planner.make_plan` fills it from the manifest and the tree; :func:`qola.plan.variants.apply`
sets each generator's ``filter`` (and ``wrapper``); :func:`qola.hooks.jit.plan_jit` sets each JIT
module's :class:`JitSplit`. ``qola plan --json`` prints the result of all three.
"""

from __future__ import annotations

import fnmatch
import os
import shlex
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from qola.plan.fixes import FixUse
from qola.plan.itfs import Api
from qola.plan.tree.aiter_configs import MergedConfig

OUTPUT_DIR = "{}"  # AITER's placeholder for a generator's output dir
DEFAULT_MODE = "pybind"  # a module's mode: its [[modules]] mode > --mode > [build].mode > this


@dataclass(frozen=True)
class Generator:
    command: str  # as AITER writes it, "{}" = output dir; run as `python <command>`
    direction: str | None = None
    receipt: str | None = None
    filter: str | None = None  # --filter value from the declared variants (None: every instance)
    wrapper: str | None = None  # a script the generator runs under (qola's any-of filter shim for CK)
    dispatch_only: bool = False  # a dropped direction: its filter selects no kernel (genrules.dispatch_only_filter)
    targets: tuple[str, ...] = ()  # archs it generates for (genrules.with_targets); () = whatever it knows
    origin: str | None = None  # "registry": added by qola's registry (qola.plan.needs), not the tree's table
    qola_receipt: str | None = None  # a receipt the generator does not know, applied by qola (qola.plan.receipts)
    asked_receipt: bool = False  # its receipt is the manifest's, not the tree's table's (checked: qola.plan.receipts)

    @property
    def argv(self) -> list[str]:
        """The generator's own command line (never the wrapper, never the filter)."""
        return shlex.split(self.command)

    @property
    def script(self) -> str:
        return self.argv[0] if self.argv else ""

    @property
    def run_argv(self) -> list[str]:
        """What runs (after ``python``): the wrapper, the command, the filter."""
        return (
            ([self.wrapper] if self.wrapper else [])
            + self.argv
            + (["--filter", self.filter] if self.filter is not None else [])
        )


@dataclass(frozen=True)
class JitSplit:
    """``[jit]`` for one module: its generated instances named in ``ahead`` are compiled into the
    library; every other generated instance (not the ``*_api`` dispatch, and only a file that holds
    a template specialisation) is deferred to the on-demand JIT."""

    ahead: tuple[str, ...]  # instance file stems [jit.aot] selects, sorted
    declared: bool  # [jit.aot] names variants for this module: one of them must be generated
    style: str  # stub style (what a stub returns when the JIT cannot give it its function)
    compiler: str | None = None  # [jit] compiler; None = the build's


@dataclass(frozen=True)
class ModulePlan:
    name: str
    md_name: str
    mode: str
    link: str
    sources: tuple[str, ...]
    flags_extra_cc: tuple[str, ...]
    flags_extra_hip: tuple[str, ...]
    include_dirs: tuple[str, ...]
    generators: tuple[Generator, ...]
    torch_exclude: bool
    is_python_module: bool
    is_standalone: bool
    hip_clang_path: str | None
    extra_ldflags: tuple[str, ...] = ()
    embed: tuple[str, ...] = ()
    missing_sources: tuple[str, ...] = ()
    headers: tuple[str, ...] = ()  # published into OUT/include (cpp_itfs API headers)
    per_source_flags: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (glob, extra flags), table order: first match wins
    configs: tuple[MergedConfig, ...] = ()  # merged tuned configs its generators read ({qola_configs}/<name>)
    table_md_name: str = ""  # md_name as the tree's table has it (md_name is namespaced: <ns>_<table_md_name>)
    jit: JitSplit | None = None  # [jit] applies to the module
    record_ahead: bool = False  # [usage] record_ahead: its instances built ahead are compiled as recorded copies
    api: Api | None = None  # cpp_itfs: the C++ API read from the tree (qola.plan.itfs), wrapped by qola
    gates: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (source, registry switches it gates kernels on)

    def flags_for(self, source: str) -> tuple[str, ...]:
        """The per-source flags ``source`` (an absolute path) gets: :func:`per_source_flags_of`."""
        return per_source_flags_of(self.per_source_flags, source)

    @property
    def artifact_name(self) -> str:
        """``<md_name>.so`` (a shared library or Python module) or ``<md_name>.a``."""
        return f"{self.md_name}.a" if self.link == "static" and not self.is_python_module else f"{self.md_name}.so"


def per_source_flags_of(table: tuple[tuple[str, tuple[str, ...]], ...], source: str) -> tuple[str, ...]:
    """AITER's rule for ``flags_extra_hip_per_source`` (``_write_ninja_file`` in
    aiter/jit/utils/cpp_extension.py): the patterns are tried in the table's order and the FIRST
    one that equals the source's absolute path, or matches it (``fnmatch``: ``*`` crosses ``/``), or
    matches its basename wins; only its flags are added (an empty list: none). No match: none."""
    path = os.path.abspath(source)
    base = os.path.basename(path)
    for pattern, flags in table:
        if pattern == path or fnmatch.fnmatch(path, pattern) or fnmatch.fnmatch(base, pattern):
            return flags
    return ()


@dataclass(frozen=True)
class Plan:
    namespace: str
    vendor: str
    archs: tuple[str, ...]
    tree_root: str
    meta_dir: str
    tree_commit: str | None
    manifest_path: str
    manifest_sha256: str
    modules: tuple[ModulePlan, ...]
    warnings: tuple[str, ...] = field(default=(), compare=False)
    mode: str = DEFAULT_MODE  # the default mode (--mode > [build].mode > pybind); modules may override
    # the pin check (qola.plan.pin.check_pin): expected, actual, status, source, tree_chosen_by -> manifest.json "pin"
    pin: dict[str, Any] | None = field(default=None, compare=False)
    fixes: tuple[FixUse, ...] = ()  # qola's fixes of the tree's code on this tree (qola.plan.fixes.decide)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        for mod, raw in zip(self.modules, data["modules"]):
            raw["api"] = None if mod.api is None else mod.api.to_json()
            raw["generators"] = [
                {
                    "command": g.command,
                    "argv": g.argv,
                    "direction": g.direction,
                    "receipt": g.receipt,
                    "filter": g.filter,
                    "wrapper": g.wrapper,
                    "dispatch_only": g.dispatch_only,
                    "run_argv": g.run_argv,
                    "targets": list(g.targets),
                    "origin": g.origin,
                    "qola_receipt": g.qola_receipt,
                    "asked_receipt": g.asked_receipt,
                }
                for g in mod.generators
            ]
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Plan:
        mods = []
        for m in data["modules"]:
            gens = tuple(
                Generator(
                    g["command"],
                    g.get("direction"),
                    g.get("receipt"),
                    g.get("filter"),
                    g.get("wrapper"),
                    bool(g.get("dispatch_only")),
                    tuple(g.get("targets") or ()),
                    g.get("origin"),
                    g.get("qola_receipt"),
                    bool(g.get("asked_receipt")),
                )
                for g in m["generators"]
            )
            fields: dict[str, Any] = {
                k: tuple(v) if isinstance(v, list) else v for k, v in m.items() if k not in ("generators", "jit", "api")
            }
            fields["per_source_flags"] = tuple((p, tuple(f)) for p, f in m.get("per_source_flags", []))
            fields["gates"] = tuple((p, tuple(f)) for p, f in m.get("gates", []))
            fields["configs"] = tuple(
                MergedConfig(c["name"], tuple(c["sources"]), c["untuned"], c.get("per_cu_num", True))
                for c in m.get("configs", [])
            )
            jit = m.get("jit")
            fields["jit"] = (
                None
                if jit is None
                else JitSplit(tuple(jit["ahead"]), jit["declared"], jit["style"], jit.get("compiler"))
            )
            fields["api"] = None if m.get("api") is None else Api.from_json(m["api"])
            mods.append(ModulePlan(**fields, generators=gens))
        top: dict[str, Any] = {
            k: tuple(v) if isinstance(v, list) else v
            for k, v in data.items()
            if k not in ("modules", "settings", "sources", "fixes")
        }  # settings, sources: qola plan --json's, not the plan's
        fixes = tuple(FixUse.from_json(f) for f in data.get("fixes") or ())
        return cls(**top, modules=tuple(mods), fixes=fixes)
