"""QoLA (ROCm/QoLA) made to build the amd-aiter sdist tree, for bench/vs_qola.py: every change is made to
scratch copies at run time, and each is one of the workarounds listed in vs_qola's docstring.

Nothing here is QoLA's code: the driver below wraps QoLA's CLI (``qola.cli.main`` of the checkout it is
given) with small run-time adjustments; the manifest and wrapper rewrites are text edits of the copy.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

# The process QoLA runs in: argv = QoLA copy, tree, '|'-separated hip flags to drop, then QoLA's CLI args.
DRIVER = '''"""vs_qola's launcher for QoLA's CLI (written by bench/vs_qola.py; see its docstring, workarounds 3-7)."""
import builtins, inspect, logging, os, re, sys, types

qsrc, tree, drop = sys.argv[1], sys.argv[2], [f for f in sys.argv[3].split("|") if f]
sys.path[:0] = [qsrc, os.path.join(tree, "aiter", "jit", "utils"), os.path.join(tree, "aiter", "jit")]
builtins.logger, builtins.re = logging.getLogger("aiter"), re  # names core.py's config block uses (W4)


def _available():
    for line in open("/proc/meminfo"):
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


vm = types.SimpleNamespace(virtual_memory=lambda: types.SimpleNamespace(available=_available()))
sys.modules.setdefault("psutil", vm)  # W6
import cpp_extension  # noqa: E402

_compile = cpp_extension._jit_compile


def _jit_compile(*a, extra_cuda_cflags=None, **k):  # W7: the flags both sides drop
    return _compile(*a, extra_cuda_cflags=[f for f in extra_cuda_cflags or [] if f not in drop], **k)


cpp_extension._jit_compile = _jit_compile
from qola.build_tools import builder, resolver  # noqa: E402

_configs = resolver._build_aiter_configs


def _build_aiter_configs(core, root):  # W4: this core.py has no AITER_CONFIGS singleton
    try:
        return _configs(core, root)
    except KeyError:
        return None


resolver._build_aiter_configs = _build_aiter_configs
_load = builder.load_build_module_fn


def _load_build_module_fn(root):  # W5: keyword arguments this build_module does not take are left out
    fn = _load(root)
    known = set(inspect.signature(fn).parameters)
    return lambda **kw: fn(**{k: v for k, v in kw.items() if k in known})


builder.load_build_module_fn = _load_build_module_fn
from qola.cli import main  # noqa: E402

rc = main(sys.argv[4:])
print("[vs_qola] MAX_JOBS after build_module:", os.environ.get("MAX_JOBS"))
sys.exit(rc)
'''

# W3: Debian's hipconfig is a link to hipcc; AITER resolves it (realpath) and runs hipcc --version
HIPCONFIG = '#!/bin/sh\nexec /usr/bin/hipconfig "$@"\n'


def qola_commit(path: Path) -> str:
    """The commit of a QoLA checkout: ``git rev-parse HEAD``, else its COMMIT file, else ``unknown``."""
    rc = subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True)
    if rc.returncode == 0 and rc.stdout.strip():
        return rc.stdout.strip()
    f = path / "COMMIT"
    return f.read_text().strip() if f.is_file() else "unknown"


def make_tree(sdist: Path, dst: Path, patches: Path) -> dict[str, list[str]]:
    """The sdist as a develop tree (W1, W2) in a fresh git repo; QoLA's patches applied where they apply."""
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(sdist, dst, symlinks=True)
    meta = dst / "aiter_meta"
    if meta.is_dir():  # W1: csrc/, hsa/, 3rdparty/ at the root, as in AITER's git tree
        for p in meta.iterdir():
            p.rename(dst / p.name)
        meta.rmdir()
    (dst / "op_tests" / "cpp" / "mha").mkdir(parents=True, exist_ok=True)  # W2
    git = ["git", "-C", str(dst), "-c", "user.name=vs_qola", "-c", "user.email=vs_qola@localhost"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True, capture_output=True)
    subprocess.run([*git, "commit", "-qm", "sdist"], check=True)
    done: dict[str, list[str]] = {"applied": [], "skipped": []}
    for p in sorted(patches.glob("*.patch")):
        ok = subprocess.run([*git, "apply", "--check", str(p)], capture_output=True).returncode == 0
        if ok:
            subprocess.run([*git, "apply", str(p)], check=True)
        done["applied" if ok else "skipped"].append(p.name)
    if done["applied"]:
        subprocess.run([*git, "commit", "-qam", "QoLA patches"], check=True)
    return done


def drop_absent_blob_cmds(registry: str, meta: Path) -> tuple[str, list[str]]:
    """W8: registry ``add_blob_gen_cmd`` lists whose scripts (``{AITER_META_DIR}/…``) the tree lacks, removed."""
    gone: list[str] = []

    def keep(m: re.Match[str]) -> str:
        scripts = re.findall(r"\{AITER_META_DIR\}/(\S+\.py)", m.group(0))
        missing = [s for s in scripts if not (meta / s).is_file()]
        gone.extend(missing)
        return "" if missing else m.group(0)

    return re.sub(r"(?ms)^add_blob_gen_cmd\s*=\s*\[.*?^\]\n", keep, registry), gone


def _ptype(t: str) -> str:
    """A parameter type of an ``aiter::`` declaration, written from outside that namespace."""
    return re.sub(r"(?<![\w:])(\w+_(?:args|traits))\b", r"aiter::\1", t)


def render_params(params: list[dict[str, Any]], defaults: bool, kept: dict[str, str] | None = None) -> str:
    """The tree's parameters as C++; one QoLA's wrapper already declares (``kept``: name -> text) keeps its text."""
    out = []
    for p in params:
        d = f" = {p['default']}" if defaults and p.get("default") is not None else ""
        out.append((kept or {}).get(p["name"]) or f"{_ptype(p['type'])} {p['name']}{d}")
    return ", ".join(out)


def _named(params: str) -> dict[str, str]:
    """``name -> text`` of a C++ parameter list (the name is each parameter's last word)."""
    return {m.group(1): p.strip() for p in params.split(",") if (m := re.search(r"(\w+)\s*(?:=.*)?$", p.strip()))}


def port_wrapper(text: str, decls: list[dict[str, Any]], header: bool) -> tuple[str, list[str]]:
    """W9: each forwarding function of QoLA's wrapper whose parameter list is not the tree's declaration
    gets the tree's parameters (defaults in the header) and forwards every one of them."""
    changed: list[str] = []
    for d in decls:
        name, ret = d["name"], d["returns"]
        decl = re.compile(rf"(?<![\w:]){re.escape(ret)}(\s+){name}\s*\(([^()]*)\)")
        call = re.compile(rf"::aiter::{name}\s*\([^()]*\)")

        def sub(m: re.Match[str], d: dict[str, Any] = d, name: str = name, ret: str = ret) -> str:
            return f"{ret}{m.group(1)}{name}({render_params(d['params'], header, _named(m.group(2)))})"

        new = decl.sub(sub, text)
        new = call.sub(f"::aiter::{name}({', '.join(p['name'] for p in d['params'])})", new)
        if new != text:
            changed.append(name)
        text = new
    return text, changed


def prepare_qola(src: Path, dst: Path, tree: Path, plan: dict[str, Any]) -> dict[str, Any]:
    """A scratch copy of the QoLA checkout with W8 and W9 applied; returns what was changed."""
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst, symlinks=True, ignore=shutil.ignore_patterns(".git", "build", "__pycache__"))
    itfs = dst / "qola" / "cpp_itfs"
    reg = itfs / "registry.toml"
    text, gone = drop_absent_blob_cmds(reg.read_text(), tree)
    reg.write_text(text)
    ported: dict[str, list[str]] = {}
    for mod in plan["modules"]:
        decls = mod["api"]["decls"] if mod.get("api") else []
        stem = "qola_" + mod["name"].removeprefix("lib")
        for suffix in (".h", ".cu"):
            f = itfs / f"{stem}{suffix}"
            if f.is_file() and decls:
                new, names = port_wrapper(f.read_text(), decls, header=suffix == ".h")
                f.write_text(new)
                ported[f.name] = names
    return {"registry_cmds_removed": gone, "wrappers_ported": ported}


def _toml(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return str(v)
    if isinstance(v, str):
        return json.dumps(v)
    return "[" + ", ".join(_toml(x) for x in v) + "]"


def qola_manifest(ours: dict[str, Any], plan: dict[str, Any]) -> str:
    """QoLA's manifest for the slice: ours, less qola-only keys, with each module's generator commands as
    qola resolved them (its variant filters included) in ``blob_gen_cmd`` (W10, W11)."""
    q, b = ours.get("qola", {}), ours.get("build", {})
    lines = ["[qola]", f"namespace = {_toml(q['namespace'])}", f"rocm_versions = {_toml(q['rocm_versions'])}", ""]
    lines += ["[build]", f"architectures = {_toml(b['architectures'])}", 'mode = "cpp_itfs"', ""]
    gens = {m["name"]: m["generators"] for m in plan["modules"]}
    for m in ours["modules"]:
        lines += ["[[modules]]", f"name = {_toml(m['name'])}", 'mode = "cpp_itfs"']
        for key in ("drop_srcs", "drop_directions"):
            if key in m:
                lines.append(f"{key} = {_toml(m[key])}")
        if "embed" in m:
            lines.append(f"hsa_subdirs = {_toml(m['embed'])}")
        cmds = [repr(shlex.join(g["run_argv"])) for g in gens[m["name"]]]  # Python literals: QoLA eval()s them
        lines += ["blob_gen_cmd = [", *(f"  {_toml(c)}," for c in cmds), "]", ""]
    for section in ("mha_fwd_variants", "mha_bwd_variants"):  # as given (QoLA reads them in pybind mode only)
        for v in ours.get(section, []):
            lines += [f"[[{section}]]", *(f"{k} = {_toml(x)}" for k, x in v.items()), ""]
    return "\n".join(lines)
