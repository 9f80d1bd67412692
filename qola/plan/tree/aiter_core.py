"""The names ``aiter/jit/core.py`` defines for its module table, read from its syntax tree.

Nothing in core.py is imported or run. Three statement forms are recognised at module level,
wherever they stand; every other statement is ignored:

- ``NAME = os.getenv("ENV", <default>)`` / ``os.environ.get(...)``: the environment's value,
  else ``<default>`` evaluated by the restricted evaluator (skipped if it cannot be, or if it holds
  lists nested more than :data:`MAX_VALUE_NESTING` deep); all names' values together hold at most
  :data:`MAX_CORE_VALUES` characters (more is an error naming core.py). Each default is evaluated in
  one scope grown in place, so a core.py of N names resolves in time linear in N;
- ``NAME = get_config_file("ENV", <default>, "stem")`` (older trees): a tuned-config file;
- ``OBJ = Cls()`` where ``Cls`` is a class of the module whose ``@property`` methods
  ``return self.get_config_file("ENV", <default>, "stem")`` (AITER's ``AITER_CONFIGS``): an
  object whose attributes are those config files.

No config name is known in advance: AITER adds new ones often.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qola.core import rules
from qola.core.errors import QolaError
from qola.plan.tree.aiter_configs import MergedConfig, config_file
from qola.plan.tree.files import MAX_CORE, read_small
from qola.plan.tree.safe_eval import SafeObject, evaluate, size_of

CORE = "aiter/jit/core.py"  # relative to the tree root (qola.plan.tree.aiter.AiterTree.core_path)
GETENV = ("os.getenv", "os.environ.get")
GET_CONFIG_FILE = "get_config_file"


@dataclass(frozen=True)
class EnvName:
    name: str
    env: str
    default: str  # the default's expression source


@dataclass(frozen=True)
class ConfigName:
    owner: str | None  # the instance (AITER_CONFIGS) whose property it is; None for a module global
    name: str  # AITER_CONFIG_GEMM_A8W8_FILE
    env: str  # AITER_CONFIG_GEMM_A8W8
    default: str  # expression source of the default file (usually a name of an EnvName)
    stem: str  # a8w8_tuned_gemm


# Build-wide compile switches newer AITER trees define for every module from the environment
# (``enable_ck = int(os.environ.get("ENABLE_CK", "1"))`` in core.py's build function, appended to
# flags_cc as ``-DENABLE_CK=<n>`` unless the module's flags_extra_cc name it). A tree whose core.py
# reads none of them (older trees, the example tree) gets none: the tree decides, not a commit list.
CC_SWITCHES = ("ENABLE_CK", "ENABLE_ROPE_POSITIONS_INT32")
MAX_CORE_VALUES = 16 << 20  # characters (list items count one) all of core.py's names may hold together
MAX_VALUE_NESTING = 8  # lists in lists a name's value may hold (AITER's: plain strings)


@dataclass(frozen=True)
class CoreNames:
    env_names: tuple[EnvName, ...] = ()
    configs: tuple[ConfigName, ...] = ()
    cc_switches: tuple[tuple[str, str], ...] = ()  # (name, default) of the CC_SWITCHES core.py reads
    # whether its merge of tuned configs keeps one row per cu_num (AITER 33f2e6af and later); older
    # trees (the amd-aiter 0.1.7 sdist) deduplicate on the untuned CSV's columns alone
    merge_per_cu_num: bool = True


def _cc_switches(module: ast.Module) -> tuple[tuple[str, str], ...]:
    """(name, default) of every ``os.environ.get("<CC_SWITCH>", "<literal>")`` anywhere in core.py."""
    found: dict[str, str] = {}
    for node in ast.walk(module):
        if (
            isinstance(node, ast.Call)
            and not node.keywords
            and len(node.args) == 2
            and ast.unparse(node.func) in GETENV
        ):
            name, default = _str_const(node.args[0]), _str_const(node.args[1])
            if name in CC_SWITCHES and default is not None and default.strip().isdigit():
                found.setdefault(name, default.strip())
    return tuple(sorted(found.items()))


def cc_switch_flags(core: CoreNames, flags_extra_cc: list[str], env: Mapping[str, str]) -> list[str]:
    """The ``-D<NAME>=<n>`` AITER's build adds to a module's compiles: each switch core.py reads,
    unless the module's own flags_extra_cc name it; the value is the environment's, else core.py's
    default. A value that is not an integer is an error (AITER's ``int()`` would raise)."""
    flags = []
    for name, default in core.cc_switches:
        if any(name in f for f in flags_extra_cc):
            continue
        value = env.get(name, default).strip()
        if not value.lstrip("-").isdigit():
            raise QolaError(
                f"{name}={env.get(name)!r} in the environment is not an integer",
                hint=f"AITER's build reads {name} as an integer (e.g. {name}={default}); unset or fix it",
            )
        flags.append(f"-D{name}={int(value)}")
    return flags


def _nested(value: Any, limit: int) -> bool:
    """Whether ``value`` holds lists or tuples nested more than ``limit`` deep (counted without recursion)."""
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (list, tuple)):
            if depth >= limit:
                return True
            stack.extend((v, depth + 1) for v in item)
    return False


def _str_const(node: ast.AST) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _config_call(call: ast.AST | None, func_ok: Callable[[ast.AST], bool]) -> tuple[str, str, str] | None:
    """(env, default source, stem) of ``get_config_file("ENV", <default>, "stem")``."""
    if not (isinstance(call, ast.Call) and func_ok(call.func) and len(call.args) == 3 and not call.keywords):
        return None
    env, stem = _str_const(call.args[0]), _str_const(call.args[2])
    if env is None or stem is None:
        return None
    return env, ast.unparse(call.args[1]), stem


def _properties(cls: ast.ClassDef, owner: str) -> list[ConfigName]:
    found = []
    for fn in cls.body:
        if not (
            isinstance(fn, ast.FunctionDef)
            and fn.args.args
            and any(isinstance(d, ast.Name) and d.id == "property" for d in fn.decorator_list)
        ):
            continue
        body = [s for s in fn.body if not (isinstance(s, ast.Expr) and _str_const(s.value) is not None)]
        if len(body) != 1 or not isinstance(body[0], ast.Return):
            continue
        self_name = fn.args.args[0].arg

        def is_method(f: ast.AST) -> bool:
            return (
                isinstance(f, ast.Attribute)
                and f.attr == GET_CONFIG_FILE
                and isinstance(f.value, ast.Name)
                and f.value.id == self_name
            )

        call = _config_call(body[0].value, is_method)
        if call is not None:
            found.append(ConfigName(owner, fn.name, *call))
    return found


def read_core(path: Path) -> CoreNames:
    """The recognised statements of core.py, in file order. A missing or unparsable file has none;
    one that is not a regular file (a FIFO would block forever) or is over 8 MiB is an error."""
    try:
        raw = read_small(path, limit=MAX_CORE, what="AITER's JIT core module")
    except FileNotFoundError:
        return CoreNames()
    try:
        module = ast.parse(raw.decode("utf-8"))
    except (UnicodeDecodeError, SyntaxError, ValueError, RecursionError, MemoryError):
        return CoreNames()
    classes = {s.name: s for s in module.body if isinstance(s, ast.ClassDef)}
    env_names: list[EnvName] = []
    configs: list[ConfigName] = []
    for stmt in module.body:
        if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)):
            continue
        name, value = stmt.targets[0].id, stmt.value
        if not isinstance(value, ast.Call) or value.keywords:
            continue
        func = ast.unparse(value.func)
        if func in GETENV and len(value.args) == 2 and (env := _str_const(value.args[0])) is not None:
            env_names.append(EnvName(name, env, ast.unparse(value.args[1])))
        elif call := _config_call(value, lambda f: isinstance(f, ast.Name) and f.id == GET_CONFIG_FILE):
            configs.append(ConfigName(None, name, *call))
        elif func in classes and not value.args:
            configs += _properties(classes[func], name)
    return CoreNames(tuple(env_names), tuple(configs), _cc_switches(module), _merge_per_cu_num(module))


MERGE_FUNCTION = "update_config_files"  # core.py's merge of several tuned CSVs


def _merge_per_cu_num(module: ast.Module) -> bool:
    """Whether core.py's :data:`MERGE_FUNCTION` names ``cu_num`` (then it is a dedup key, as in AITER
    33f2e6af); True where there is no such function (the rule of the newest trees)."""
    for stmt in module.body:
        if isinstance(stmt, ast.FunctionDef) and stmt.name == MERGE_FUNCTION:
            return any(isinstance(n, ast.Constant) and n.value == "cu_num" for n in ast.walk(stmt))
    return True


@dataclass(frozen=True)
class ResolvedNames:
    names: dict[str, Any]  # to add to the expression namespace
    merges: dict[str, MergedConfig]  # "{qola_configs}/<stem>.csv" -> how to make it


def resolve_core_names(
    core: CoreNames, *, base: Mapping[str, Any], env: Mapping[str, str], root: Path
) -> ResolvedNames:
    """Values for core.py's names, as AITER's import would give them in ``env``.

    Names ``base`` already has (qola's own reconstruction of the tree's paths) are kept."""
    names: dict[str, Any] = {}
    scope = dict(base)  # base and names so far, grown in place: one copy, not one per name (linear)
    budget = MAX_CORE_VALUES
    for item in core.env_names:
        if item.name in scope:
            continue
        if item.env in env:  # os.getenv(k, d) returns a set variable even when it is empty
            value: Any = env[item.env]
        else:
            try:
                value = evaluate(item.default, scope, where=f"{CORE}: {item.name}")
            except QolaError:
                continue  # a default qola cannot evaluate: a table expression using it fails with the name
            if _nested(value, MAX_VALUE_NESTING):
                continue  # nested deeper than any real default (a chain of names can nest without limit)
        budget -= size_of(value, budget + 1)
        if budget < 0:
            raise QolaError(
                f"{CORE}: the values of its names add up to more than {MAX_CORE_VALUES:,} characters (at {item.name})",
                hint="AITER's core.py defines a few dozen short paths; is this the right tree?",
            )
        names[item.name] = scope[item.name] = value
    merges: dict[str, MergedConfig] = {}
    objects: dict[str, dict[str, Any]] = {}
    for cfg in core.configs:
        where = f"{CORE}: {cfg.owner + '.' if cfg.owner else ''}{cfg.name}"
        problem = rules.file_stem_problem(cfg.stem)
        if problem:  # the stem names the merged CSV qola writes into its build dir
            raise QolaError(
                f"{where}: tuned-config name {cfg.stem!r} {problem}",
                hint="AITER's config names are plain file stems such as a8w8_tuned_gemm",
            )
        try:
            default = evaluate(cfg.default, scope, where=where)
        except QolaError:
            continue
        value = config_file(cfg.env, str(default), cfg.stem, env=env, root=root, per_cu_num=core.merge_per_cu_num)
        if isinstance(value, MergedConfig):
            merges[value.path] = value
            value = value.path
        if cfg.owner is None:
            names.setdefault(cfg.name, value)
        else:
            objects.setdefault(cfg.owner, {}).setdefault(cfg.name, value)
    for owner, attrs in objects.items():
        if owner not in base:
            names[owner] = SafeObject(owner, attrs)
    return ResolvedNames(names, merges)
