"""An AITER-layout kernel tree: where things are, its module table, and the
names the table's expressions use — all read statically, nothing imported.

Two layouts resolve: a develop checkout (``csrc/`` at the root) and an
installed/sdist tree (``csrc/``, ``hsa/``, ``3rdparty/`` under ``aiter_meta/``).
"""

from __future__ import annotations

import copy
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qola.core import deadlines, proc, rules
from qola.core.errors import QolaError
from qola.plan.tree.aiter_configs import MergedConfig
from qola.plan.tree.aiter_core import CORE, CoreNames, read_core, resolve_core_names
from qola.plan.tree.files import MAX_TABLE, read_text
from qola.plan.tree.safe_eval import SafeFunction, SafeObject, evaluate

TABLE = "aiter/jit/optCompilerConfig.json"

# AITER's defaults for keys a table entry leaves out (aiter/jit/core.py get_args_of_build)
DEFAULTS: dict[str, Any] = {
    "srcs": [],
    "md_name": "",
    "flags_extra_cc": [],
    "flags_extra_hip": [],
    "extra_ldflags": None,
    "extra_include": [],
    "verbose": False,
    "is_python_module": True,
    "is_standalone": False,
    "torch_exclude": False,
    "hip_clang_path": None,
    "blob_gen_cmd": [],
    "hipify": False,
    # AITER main (2026): plain per-source flags, never evaluated; third-party trees AITER clones
    "flags_extra_hip_per_source": {},
    "third_party": [],
}
# keys AITER reads with a fallback rather than a default (AITER main: "all" skips experimental modules)
KNOWN_KEYS = ("is_experimental",)
LIST_KEYS = ("srcs", "flags_extra_cc", "flags_extra_hip", "extra_include", "blob_gen_cmd")
BOOL_KEYS = ("is_python_module", "is_standalone", "torch_exclude")
MAX_VALUE_DEPTH = 16  # nesting of one table value (AITER's: a dict of lists of strings, 3)
# fp8/fp4 dtypes present in the torch releases AITER supports; hasattr(torch, X) is answered from this
TORCH_ATTRS = ("float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e4m3fn", "float8_e5m2", "float4_e2m1fn_x2")


@dataclass(frozen=True)
class AiterTree:
    root: Path
    meta_dir: Path  # where csrc/, hsa/, 3rdparty/ live
    layout: str  # "develop" | "installed"

    @property
    def table_path(self) -> Path:
        return self.root / TABLE

    @property
    def core_path(self) -> Path:
        """``aiter/jit/core.py``: the names the table's expressions use (read, never imported)."""
        return self.root / CORE

    @property
    def csrc(self) -> Path:
        return self.meta_dir / "csrc"

    @property
    def hsa(self) -> Path:
        return self.meta_dir / "hsa"

    @property
    def ck_dir(self) -> Path:
        return self.meta_dir / "3rdparty" / "composable_kernel"


ROOT_OF = "the root of an AITER checkout or unpacked sdist"


def _hint(named_by: str | None) -> str:
    """How to change the setting that named a tree (a variable, the manifest's key, the flag)."""
    if named_by and named_by.startswith("["):
        return f"fix {named_by} in the manifest (relative to its dir) to {ROOT_OF}, or pass --aiter-root"
    if named_by and named_by.isidentifier():  # an environment variable
        return f"set {named_by} to {ROOT_OF}, or unset it (--aiter-root wins over it)"
    return f"pass --aiter-root with {ROOT_OF}"


def open_tree(root: str | Path, named_by: str | None = None) -> AiterTree:
    """The tree at ``root``; ``named_by``: the setting that gave it (``NVTE_AITER_SOURCE_DIR``,
    ``[qola].aiter_root``, ``--aiter-root``), named in a refusal with how to change it."""
    path = Path(root).expanduser()
    _check_path(path, "")
    if not path.is_dir():
        raise QolaError(
            f"kernel tree {str(path)!r}{f' (from {named_by})' if named_by else ''} does not exist or is not a directory",
            hint=_hint(named_by),
        )
    path = path.resolve()
    _check_path(path, " (resolved)")
    if not (path / TABLE).exists():  # a FIFO or a directory there is refused by load_table, by name
        raise QolaError(
            f"{path} has no {TABLE}",
            hint="--aiter-root must be the tree's root (the directory holding aiter/ and csrc/ or aiter_meta/)",
        )
    if (path / "csrc").is_dir():
        return AiterTree(path, path, "develop")
    if (path / "aiter_meta" / "csrc").is_dir():
        return AiterTree(path, path / "aiter_meta", "installed")
    raise QolaError(
        f"{path} has neither csrc/ nor aiter_meta/csrc/",
        hint="a develop tree keeps csrc/ at its root; an installed or sdist tree keeps it under aiter_meta/",
    )


def _check_path(path: Path, how: str) -> None:
    """The tree's path (as given, then resolved) is blamed for a control character or non-UTF-8 byte
    in it, before any table value built from it is."""
    problem = rules.dir_path_problem(path)
    if problem:
        raise QolaError(
            f"the kernel tree's path{how} {str(path)!r} {problem}",
            hint="move or rename the tree to a path without control characters "
            "(a symlink to it does not help: qola uses the resolved path)",
        )


def load_table(tree: AiterTree) -> dict[str, dict[str, Any]]:
    """The module table as JSON data: a regular file of at most 16 MiB, nested at most as deep as the
    JSON reader's recursion allows (deeper is an error, not a RecursionError). Keys and values are
    checked when a module is resolved (:func:`resolve_entry`)."""
    path = tree.table_path
    try:
        text = read_text(path, limit=MAX_TABLE, what="module table")
    except FileNotFoundError:
        raise QolaError(f"{path} does not exist", hint="--aiter-root must be the tree's root") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise QolaError(f"{path} is not valid JSON: {exc}") from None
    except ValueError as exc:  # an integer of more than 4300 digits (Python's int/str conversion limit)
        raise QolaError(
            f"{path}: {exc}".split("; use sys.")[0],
            hint="AITER's table holds strings, lists and booleans; is this the right file?",
        ) from None
    except (RecursionError, MemoryError):
        raise QolaError(
            f"{path}: JSON nested too deeply to read",
            hint=f"table values nest at most {MAX_VALUE_DEPTH} levels (AITER's: 3)",
        ) from None
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        raise QolaError(f"{path} must map module names to objects")
    return data


def _depth(value: Any, limit: int) -> int:
    """Nesting depth of JSON data (a string is 0, ``[]`` 1), counted without recursion; stops past ``limit``."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (list, dict)):
            depth += 1
            deepest = max(deepest, depth)
            if deepest > limit:
                break
            stack.extend((v, depth) for v in (item.values() if isinstance(item, dict) else item))
    return deepest


def git_head(tree: AiterTree, env: proc.TimedEnv | None = None) -> tuple[str | None, str | None]:
    """(HEAD, None) of the tree when its root is itself the top of a git checkout; (None, None) when it
    is not one (an sdist: nothing to check); (None, why) when it is one and git cannot say (git
    missing, the tree owned by another user and not a ``safe.directory``, a broken repository).
    ``env``: git's view of the build's environment (:class:`qola.checkout.git.GitEnv`: what git runs
    under, ``QOLA_GIT_TIMEOUT``); None: git's default limit, under qola's own environment."""
    if not os.path.lexists(tree.root / ".git"):
        return None, None
    try:
        limit = min(30.0, (env.timeout(deadlines.GIT_LOCAL) if env else None) or deadlines.GIT_LOCAL.default)
        out = proc.run(
            ["git", "-C", str(tree.root), "rev-parse", "--verify", "HEAD^{commit}"],
            env=env.child if env else None,
            out=proc.SEPARATE,
            timeout=limit,
        )
    except FileNotFoundError:
        return None, "git is not installed"
    except OSError as exc:
        return None, f"git cannot run: {exc.strerror or exc}"
    except proc.TimeoutExpired:
        return None, f"git rev-parse HEAD did not answer in {limit:g} s"
    if out.returncode != 0:
        said = " ".join((out.stderr or out.stdout or "").split())[:300]
        return None, f"git rev-parse HEAD failed ({said or f'exit {out.returncode}'})"
    head = out.stdout.strip()
    return (head, None) if re.fullmatch(r"[0-9a-f]{40}|[0-9a-f]{64}", head) else (None, f"git said {head[:80]!r}")


@dataclass(frozen=True)
class Namespace:
    names: dict[str, Any]  # the globals AITER's expressions see
    merges: dict[str, MergedConfig]  # merged tuned-config path ("{qola_configs}/<stem>.csv") -> recipe
    # what core.py defines (its build-wide compile switches among it)
    core: CoreNames = field(default_factory=CoreNames)


def expression_names(
    tree: AiterTree,
    *,
    archs: tuple[str, ...],
    env: Mapping[str, str],
    hip_version: str | None,
) -> dict[str, Any]:
    """The globals AITER's expressions see, reconstructed without importing aiter or torch."""
    return namespace(tree, archs=archs, env=env, hip_version=hip_version).names


def namespace(
    tree: AiterTree,
    *,
    archs: tuple[str, ...],
    env: Mapping[str, str],
    hip_version: str | None,
) -> Namespace:
    """:func:`expression_names` and the merged config files they name."""
    meta = str(tree.meta_dir)
    gfx = archs[-1] if archs else "native"
    ck = env.get("CK_DIR") or f"{meta}/3rdparty/composable_kernel"
    asm_dir = f"{meta}/hsa/{gfx}/"

    def env_get(key: Any, default: Any = None) -> Any:
        if not isinstance(key, str):
            raise TypeError("environment keys are strings")
        return env.get(key, default)

    def has_attr(obj: Any, name: Any) -> bool:
        if not isinstance(obj, SafeObject) or not isinstance(name, str):
            raise TypeError("hasattr() is allowed on qola-provided objects only")
        return name in obj.attrs

    environ = SafeObject("os.environ", {"get": SafeFunction("os.environ.get", env_get, 2)}, items=dict(env))
    os_obj = SafeObject("os", {"environ": environ, "getenv": SafeFunction("os.getenv", env_get, 2)})
    version = SafeObject("torch.version", {"hip": hip_version, "cuda": None if hip_version else "qola"})
    torch_attrs: dict[str, Any] = {"version": version}
    torch_attrs.update({a: SafeObject(f"torch.{a}") for a in TORCH_ATTRS} if hip_version else {})
    names: dict[str, Any] = {
        "AITER_ROOT_DIR": str(tree.root),
        "AITER_META_DIR": meta,
        "AITER_CSRC_DIR": f"{meta}/csrc",
        "AITER_GRADLIB_DIR": f"{meta}/gradlib",
        "AITER_ASM_DIR": asm_dir,
        "CK_3RDPARTY_DIR": ck,
        "CK_DIR": ck,
        "CK_HELPER_DIR": f"{meta}/3rdparty/ck_helper",
        "os": os_obj,
        "torch": SafeObject("torch", torch_attrs),
        "get_gfx": SafeFunction("get_gfx", lambda: gfx, 0),
        "get_asm_dir": SafeFunction("get_asm_dir", lambda: asm_dir, 0),
        "hasattr": SafeFunction("hasattr", has_attr, 2),
        "int": SafeFunction("int", _to_int, 2),
        "str": SafeFunction("str", _to_str, 1),
        "True": True,
        "False": False,
        "None": None,
    }
    parsed = read_core(tree.core_path)
    core = resolve_core_names(parsed, base=names, env=env, root=tree.root)
    return Namespace({**names, **core.names}, core.merges, parsed)


def _to_int(value: Any, base: Any = 10) -> int:
    if isinstance(value, str) and len(value) > 40:
        raise ValueError("string too long for int()")
    return int(value, base) if isinstance(value, str) else int(value)


def _to_str(value: Any) -> str:
    if isinstance(value, (SafeObject, SafeFunction)):
        raise TypeError(f"str() of {value.name}")
    return str(value)


def unknown_keys(raw: Mapping[str, Any]) -> list[str]:
    """Table keys AITER's get_args_of_build has no default for (newer AITERs add some)."""
    return [k for k in raw if k not in DEFAULTS and k not in KNOWN_KEYS]


def resolve_entry(
    key: str, raw: Mapping[str, Any], names: Mapping[str, Any], notes: list[str] | None = None
) -> dict[str, Any]:
    """Evaluate one table entry as AITER's ``get_args_of_build`` does; its defaults fill the keys it leaves out.

    Strings, and the strings of lists, are expressions; everything else (dicts such as
    ``flags_extra_hip_per_source``, whose strings are plain flags, booleans, numbers) is taken
    as it is, as AITER does. A key AITER does not know is kept, and a string of such a key that
    is not an expression qola evaluates is kept as plain text, with a note in ``notes``.
    """
    problem = rules.module_key_problem(key)
    if problem:
        raise QolaError(
            f"{TABLE}: module key {key!r} {problem}",
            hint="a module key names files and build targets: letters, digits and _ only "
            "(the rule for [[modules]].name); fix the tree's table",
        )
    out = {k: copy.copy(v) for k, v in DEFAULTS.items()}
    for key_, value in raw.items():
        where = f"{TABLE}: module {key!r}, key {key_!r}"
        if _depth(value, MAX_VALUE_DEPTH) > MAX_VALUE_DEPTH:
            raise QolaError(
                f"{where}: value nested more than {MAX_VALUE_DEPTH} levels deep",
                hint="AITER's table values are strings, lists of strings or a table of lists",
            )
        lenient = key_ not in DEFAULTS and key_ not in KNOWN_KEYS
        if isinstance(value, list):
            out[key_] = [
                _evaluate(item, names, f"{where}[{i}]", lenient, notes) if isinstance(item, str) else item
                for i, item in enumerate(value)
            ]
        elif isinstance(value, str):
            out[key_] = _evaluate(value, names, where, lenient, notes)
        else:
            out[key_] = value
    for key_ in LIST_KEYS:
        value = out.get(key_)
        if value is None or value == "":
            out[key_] = []
        elif isinstance(value, str):
            out[key_] = [value]
        elif not isinstance(value, list):
            raise QolaError(f"{TABLE}: module {key!r}, key {key_!r} must be a list, got {_show(value)}")
    _check_types(key, out)
    return out


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:100] + f"…({len(text)} characters)"


def _check_types(key: str, out: dict[str, Any]) -> None:
    """The evaluated values qola uses have the types AITER's build gives them; strings carry no NUL or
    line breaks (they become paths, flags and ninja text); ``md_name`` passes the manifest's rule."""

    def bad(field: str, what: str, value: Any) -> QolaError:
        return QolaError(
            f"{TABLE}: module {key!r}, key {field!r}: {what}, got {_show(value)}",
            hint="fix the tree's table (values evaluate as AITER's get_args_of_build reads them)",
        )

    def text(field: str, value: Any) -> None:
        if not isinstance(value, str):
            raise bad(field, "expected a string", value)
        if any(c in value for c in "\x00\n\r"):
            raise bad(field, "a NUL or line break in a string", value)

    for field_ in LIST_KEYS:
        for item in out[field_]:
            text(field_, item)
    if out.get("md_name") is None:
        out["md_name"] = ""
    md = out["md_name"]
    if md != "":
        problem = rules.md_name_problem(md)
        if problem:
            raise bad("md_name", f"the md_name {problem}", md)
    ld = out.get("extra_ldflags")
    if ld is not None:
        for item in ld if isinstance(ld, list) else [ld]:
            text("extra_ldflags", item)
    if out.get("hip_clang_path") is not None:
        text("hip_clang_path", out["hip_clang_path"])
    per_source = out.get("flags_extra_hip_per_source")
    if per_source is None:
        out["flags_extra_hip_per_source"] = {}
    elif not isinstance(per_source, dict):
        raise bad("flags_extra_hip_per_source", "expected a table of file-name globs to flags", per_source)
    else:
        for glob, flags in per_source.items():
            text("flags_extra_hip_per_source", glob)
            for flag in flags if isinstance(flags, list) else [flags]:
                text("flags_extra_hip_per_source", flag)
    for field_ in BOOL_KEYS:
        if not isinstance(out.get(field_), (bool, int, type(None))):
            raise bad(field_, "expected true or false", out.get(field_))


def _evaluate(expr: str, names: Mapping[str, Any], where: str, lenient: bool, notes: list[str] | None) -> Any:
    try:
        return evaluate(expr, names, where=where)
    except QolaError as exc:
        if not lenient:
            raise
        if notes is not None:
            notes.append(f"{where}: kept as plain text ({exc.message})")
        return expr
