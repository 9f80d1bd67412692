"""An AITER-layout kernel tree: where things are, its module table, and the
names the table's expressions use — all read statically, nothing imported.

Two layouts resolve: a develop checkout (``csrc/`` at the root) and an
installed/sdist tree (``csrc/``, ``hsa/``, ``3rdparty/`` under ``aiter_meta/``).
"""

from __future__ import annotations

import ast
import json
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qola.errors import QolaError
from qola.tree.safe_eval import SafeFunction, SafeObject, evaluate

TABLE = "aiter/jit/optCompilerConfig.json"
CORE = "aiter/jit/core.py"

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
}
LIST_KEYS = ("srcs", "flags_extra_cc", "flags_extra_hip", "extra_include", "blob_gen_cmd")
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
    def csrc(self) -> Path:
        return self.meta_dir / "csrc"

    @property
    def hsa(self) -> Path:
        return self.meta_dir / "hsa"

    @property
    def ck_dir(self) -> Path:
        return self.meta_dir / "3rdparty" / "composable_kernel"

    @property
    def configs_dir(self) -> Path:
        return self.root / "aiter" / "configs"


def open_tree(root: str | Path) -> AiterTree:
    path = Path(root).expanduser()
    if not path.is_dir():
        raise QolaError(
            f"kernel tree {str(path)!r} does not exist or is not a directory",
            hint="pass --aiter-root with the root of an AITER checkout or unpacked sdist",
        )
    path = path.resolve()
    if not (path / TABLE).is_file():
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


def load_table(tree: AiterTree) -> dict[str, dict[str, Any]]:
    try:
        data = json.loads(tree.table_path.read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise QolaError(f"cannot read {tree.table_path}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise QolaError(f"{tree.table_path} is not valid JSON: {exc}") from None
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        raise QolaError(f"{tree.table_path} must map module names to objects")
    return data


def git_head(tree: AiterTree) -> str | None:
    """HEAD of the tree when the tree root is itself the top of a git checkout."""
    if not (tree.root / ".git").exists():
        return None
    try:
        out = subprocess.run(
            ["git", "-C", str(tree.root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _config_env_block(core: Path) -> str:
    try:
        text = core.read_text()
    except OSError:
        return ""
    start, end = text.find("# config_env start here"), text.find("# config_env end here")
    return text[start:end] if 0 <= start < end else ""


def config_files(tree: AiterTree, env: Mapping[str, str], base: Mapping[str, Any]) -> dict[str, str]:
    """The ``AITER_CONFIG_*`` names of core.py's ``# config_env`` block, read statically.

    ``NAME = os.getenv("ENV", <default>)`` takes the environment or the default;
    ``NAME_FILE = get_config_file("ENV", NAME, "stem")`` takes the environment or NAME.
    Anything else in the block is ignored.
    """
    try:
        module = ast.parse(_config_env_block(tree.root / CORE))
    except SyntaxError:
        return {}
    found: dict[str, str] = {}
    for stmt in module.body:
        if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)):
            continue
        name, call = stmt.targets[0].id, stmt.value
        if not (isinstance(call, ast.Call) and call.args and isinstance(call.args[0], ast.Constant)):
            continue
        func = ast.unparse(call.func)
        env_name = call.args[0].value
        if not isinstance(env_name, str):
            continue
        if func in ("os.getenv", "os.environ.get") and len(call.args) == 2:
            default = evaluate(ast.unparse(call.args[1]), {**base, **found}, where=f"{CORE}: {name}")
            found[name] = env.get(env_name) or str(default)
        elif func == "get_config_file" and len(call.args) >= 2 and isinstance(call.args[1], ast.Name):
            found[name] = env.get(env_name) or found.get(call.args[1].id, "")
    return found


def expression_names(
    tree: AiterTree,
    *,
    archs: tuple[str, ...],
    env: Mapping[str, str],
    hip_version: str | None,
) -> dict[str, Any]:
    """The globals AITER's expressions see, reconstructed without importing aiter or torch."""
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
        "True": True, "False": False, "None": None,
    }
    configs = config_files(tree, env, names)
    names.update(configs)
    short = {k.removeprefix("AITER_CONFIG_"): v for k, v in configs.items()}
    names["AITER_CONFIGS"] = SafeObject("AITER_CONFIGS", {**configs, **short})
    return names


def _to_int(value: Any, base: Any = 10) -> int:
    if isinstance(value, str) and len(value) > 40:
        raise ValueError("string too long for int()")
    return int(value, base) if isinstance(value, str) else int(value)


def _to_str(value: Any) -> str:
    if isinstance(value, (SafeObject, SafeFunction)):
        raise TypeError(f"str() of {value.name}")
    return str(value)


def resolve_entry(key: str, raw: Mapping[str, Any], names: Mapping[str, Any]) -> dict[str, Any]:
    """Evaluate one table entry; AITER's defaults fill the keys it leaves out."""
    out = dict(DEFAULTS)
    for field, value in raw.items():
        where = f"{TABLE}: module {key!r}, key {field!r}"
        if isinstance(value, dict):  # flags_extra_hip_per_source: {glob: [expr, ...]}
            out[field] = {
                str(k): [evaluate(v, names, where=f"{where}[{k!r}]") if isinstance(v, str) else v
                         for v in (vals if isinstance(vals, list) else [vals])]
                for k, vals in value.items()
            }
        elif isinstance(value, list):
            items = []
            for i, item in enumerate(value):
                items.append(evaluate(item, names, where=f"{where}[{i}]") if isinstance(item, str) else item)
            out[field] = items
        elif isinstance(value, str):
            out[field] = evaluate(value, names, where=where)
        else:
            out[field] = value
    for field in LIST_KEYS:
        value = out.get(field)
        if value is None or value == "":
            out[field] = []
        elif isinstance(value, str):
            out[field] = [value]
        elif not isinstance(value, list):
            raise QolaError(f"{TABLE}: module {key!r}, key {field!r} must be a list, got {value!r}")
    return out
