"""``qola.toml`` → a typed, validated :class:`Manifest`.

The schema is pydantic models with ``extra="forbid"`` and strict types. Every
error names the file, the key path (``modules[1].drop_srcs``), the bad value
and what was expected; unknown keys get a did-you-mean.
"""

from __future__ import annotations

import difflib
import hashlib
import keyword
import re
import sys
from pathlib import Path
from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from qola.errors import QolaError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

GFX_RE = re.compile(r"^gfx[0-9]{2,4}[a-z]?(:(xnack|sramecc)[+-])*$")
SM_RE = re.compile(r"^sm_[0-9]{2,3}[af]?$")
C_IDENT_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
SHA_RE = re.compile(r"^[0-9a-f]{4,40}$")
C_KEYWORDS = frozenset(
    "auto break case char const continue default do double else enum extern float for goto if inline int "
    "long register restrict return short signed sizeof static struct switch typedef union unsigned void "
    "volatile while bool class namespace template typename this new delete operator private public "
    "protected virtual friend using true false nullptr".split()
)
MODES = ("pybind", "cpp_itfs")
LINKS = ("shared", "static")

Scalar = Union[str, bool, int]
Option = Union[Scalar, list[Scalar]]


def vendor(arch: str) -> str | None:
    if GFX_RE.match(arch):
        return "hip"
    if SM_RE.match(arch):
        return "cuda"
    return None


def check_archs(archs: list[str]) -> list[str]:
    for a in archs:
        if vendor(a) is None:
            raise ValueError(f"unknown architecture {a!r}: expected gfx… (HIP, e.g. gfx942) or sm_… (CUDA, e.g. sm_90)")
    kinds = {vendor(a) for a in archs}
    if len(kinds) > 1:
        raise ValueError(f"architectures mix HIP and CUDA targets ({', '.join(archs)}): build one vendor per manifest")
    if len(set(archs)) != len(archs):
        raise ValueError(f"architectures repeat an entry: {archs}")
    return archs


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class QolaSection(_Model):
    aiter_commit: str | None = None
    namespace: str = "qola"
    rocm_versions: list[str] | None = None
    cuda_versions: list[str] | None = None
    aiter_root: str | None = None  # default --aiter-root, relative to the manifest

    @field_validator("aiter_commit")
    @classmethod
    def _sha(cls, v: str | None) -> str | None:
        if v is not None and not SHA_RE.match(v.lower()):
            raise ValueError("expected a git commit sha (4 to 40 hex digits)")
        return v.lower() if v else v

    @field_validator("namespace")
    @classmethod
    def _ns(cls, v: str) -> str:
        if not C_IDENT_RE.match(v) or v in C_KEYWORDS or v.startswith("__"):
            raise ValueError("expected a valid C identifier that is not a keyword (letters, digits, _; e.g. \"te\")")
        return v

    @field_validator("rocm_versions", "cuda_versions")
    @classmethod
    def _versions(cls, v: list[str] | None) -> list[str] | None:
        for item in v or []:
            if not re.match(r"^[0-9]+(\.[0-9]+){0,2}$", item):
                raise ValueError(f"expected versions like \"7.2\" or \"13.0\", got {item!r}")
        return v


class BuildSection(_Model):
    architectures: list[str] = Field(default_factory=list)
    mode: Literal["pybind", "cpp_itfs"] | None = None
    link: Literal["shared", "static"] = "shared"
    launcher: str | None = None
    jobs: int | None = Field(default=None, ge=1)

    @field_validator("architectures")
    @classmethod
    def _archs(cls, v: list[str]) -> list[str]:
        return check_archs(v)


class ModuleSection(_Model):
    name: str
    mode: Literal["pybind", "cpp_itfs"] | None = None
    link: Literal["shared", "static"] | None = None
    receipt: int | None = Field(default=None, ge=0)
    drop_srcs: list[str] = Field(default_factory=list)
    drop_directions: list[str] = Field(default_factory=list)
    embed: list[str] = Field(default_factory=list)
    # overrides / full declaration (plain values; paths relative to the tree's csrc parent)
    srcs: list[str] | None = None
    add_srcs: list[str] = Field(default_factory=list)
    flags_extra_cc: list[str] | None = None
    flags_extra_hip: list[str] | None = None
    flags_extra_hip_per_source: dict[str, list[str]] | None = None  # file-name glob -> extra flags
    extra_include: list[str] | None = None
    extra_ldflags: list[str] | None = None
    blob_gen_cmd: list[str] | None = None
    is_python_module: bool | None = None
    is_standalone: bool | None = None
    torch_exclude: bool | None = None
    hip_clang_path: str | None = None
    md_name: str | None = None

    @field_validator("name", "md_name")
    @classmethod
    def _ident(cls, v: str | None) -> str | None:
        if v is not None and not C_IDENT_RE.match(v):
            raise ValueError("expected a module name made of letters, digits and _")
        return v


class VariantSection(_Model):
    """Generic variant matrix for any generator (issue 4)."""

    module: str
    generator: str | None = None  # substring of the generator command it applies to
    pattern: str  # instance-name pattern with {option} placeholders
    options: dict[str, Option] = Field(default_factory=dict)
    tokens: dict[str, dict[str, str]] = Field(default_factory=dict)


class MhaFwdVariant(_Model):
    module: str | None = None
    dtype: Option | None = None
    has_bias: Option | None = None
    has_alibi: Option | None = None
    has_mask: Option | None = None
    has_lse: Option | None = None
    has_dropout: Option | None = None
    has_skip: Option | None = None
    has_sink: Option | None = None
    has_logits: Option | None = None
    hdim: Option | None = None
    mode: Option | None = None
    name: Option | None = None


class MhaBwdVariant(_Model):
    module: str | None = None
    dtype: Option | None = None
    has_bias: Option | None = None
    has_alibi: Option | None = None
    has_dbias: Option | None = None
    has_mask: Option | None = None
    has_dropout: Option | None = None
    deterministic: Option | None = None
    hdim: Option | None = None
    mode: Option | None = None
    name: Option | None = None


class JitAot(_Model):
    """``[jit.aot]``: the variants built ahead, as the top-level variant tables (same keys)."""

    variants: list[VariantSection] = Field(default_factory=list)
    mha_fwd_variants: list[MhaFwdVariant] = Field(default_factory=list)
    mha_bwd_variants: list[MhaBwdVariant] = Field(default_factory=list)


class JitSection(_Model):
    """``[jit]``: instances outside ``aot`` are deferred to the on-demand JIT (docs/manifest.md)."""

    enabled: bool = True
    modules: list[str] | None = None  # modules the JIT applies to (default: every module with generators)
    aot: JitAot = Field(default_factory=JitAot)
    compiler: str | None = None  # the compiler the library runs (default: the build's)


class Manifest(_Model):
    qola: QolaSection = Field(default_factory=QolaSection)
    build: BuildSection = Field(default_factory=BuildSection)
    modules: list[ModuleSection] = Field(default_factory=list)
    variants: list[VariantSection] = Field(default_factory=list)
    mha_fwd_variants: list[MhaFwdVariant] = Field(default_factory=list)
    mha_bwd_variants: list[MhaBwdVariant] = Field(default_factory=list)
    jit: JitSection | None = None
    # set by load(), not by the file
    path: str = ""
    sha256: str = ""

    @model_validator(mode="after")
    def _unique_modules(self) -> "Manifest":
        seen: set[str] = set()
        for i, m in enumerate(self.modules):
            if m.name in seen:
                raise ValueError(f"modules[{i}].name: module {m.name!r} is listed twice")
            seen.add(m.name)
        return self

    @property
    def base_dir(self) -> Path:
        return Path(self.path).parent if self.path else Path.cwd()

    def module(self, name: str) -> ModuleSection | None:
        return next((m for m in self.modules if m.name == name), None)


# ---------------------------------------------------------------------------- errors

_EXPECT = {
    "string_type": "expected a string",
    "bool_type": "expected true or false",
    "int_type": "expected an integer",
    "list_type": "expected a list",
    "dict_type": "expected a table",
    "model_type": "expected a table",
    "model_attributes_type": "expected a table",
    "missing": "missing required key",
    "greater_than_equal": "expected a number >= {ge}",
}


def _path(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif isinstance(part, str) and (part.startswith("function-") or part in ("str", "bool", "int", "list[union[str,bool,int]]")):
            continue  # union branch names added by pydantic
        else:
            out += f".{part}" if out else str(part)
    return out


def _fields_at(loc: tuple[Any, ...]) -> list[str]:
    model: Any = Manifest
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        field = model.model_fields.get(part) if hasattr(model, "model_fields") else None
        if field is None:
            return []
        ann = field.annotation
        args = getattr(ann, "__args__", ())
        candidates = [ann, *args] + [a for arg in args for a in getattr(arg, "__args__", ())]
        model = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
        if model is None:
            return []
    return [f for f in model.model_fields if f not in ("path", "sha256")] if hasattr(model, "model_fields") else []


def _describe(err: dict[str, Any]) -> str:
    loc = tuple(err["loc"])
    kind = err["type"]
    key = _path(loc)
    if kind == "extra_forbidden":
        known = _fields_at(loc)
        close = difflib.get_close_matches(str(loc[-1]), known, n=1)
        tip = f"; did you mean {close[0]!r}?" if close else (f"; known keys: {', '.join(known)}" if known else "")
        return f"{key}: unknown key{tip}"
    if kind == "literal_error":
        return f"{key}: got {err['input']!r}; expected one of {err['ctx']['expected']}"
    if kind == "value_error":
        got = err.get("input")
        shown = f"got {got!r}; " if isinstance(got, (str, int)) and key else ""
        return f"{key}: {shown}{err['ctx']['error']}" if key else str(err["ctx"]["error"])
    expected = _EXPECT.get(kind)
    if expected:
        expected = expected.format(**err.get("ctx", {}))
        if kind == "missing":
            return f"{key}: {expected}"
        return f"{key}: got {err['input']!r}; {expected}"
    return f"{key}: {err['msg']} (got {err.get('input')!r})"


def _union_errors(errors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Collapse pydantic's one-error-per-union-branch into one error per key."""
    seen: dict[str, dict[str, Any]] = {}
    for err in errors:
        key = _path(tuple(err["loc"]))
        if key in seen and err["type"] != "extra_forbidden":
            prev = seen[key]
            if prev["type"] != "union":
                seen[key] = {**prev, "type": "union", "msg": "expected a string, true/false, an integer or a list of those"}
            continue
        seen[key] = err
    return list(seen.values())


def parse(text: str, path: str = "<string>") -> Manifest:
    """Parse and validate manifest text. Raises QolaError naming ``path`` and the key."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise QolaError(f"not valid TOML: {exc}", where=path, hint="check the line named above") from None
    try:
        manifest = Manifest.model_validate(data)
    except ValidationError as exc:
        lines = [_describe(e) for e in _union_errors(exc.errors())]
        message = lines[0] if len(lines) == 1 else "invalid manifest:\n  " + "\n  ".join(lines)
        raise QolaError(message, where=path, hint="see docs/manifest.md for every key and its type") from None
    except (RecursionError, ValueError, TypeError) as exc:
        raise QolaError(f"invalid manifest: {exc}", where=path) from None
    sha = hashlib.sha256(text.encode()).hexdigest()
    return manifest.model_copy(update={"path": path, "sha256": sha})


def load(path: str | Path) -> Manifest:
    p = Path(path)
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise QolaError(f"manifest {str(p)!r} not found", hint="pass --manifest with the path of a qola.toml") from None
    except OSError as exc:
        raise QolaError(f"cannot read manifest {str(p)!r}: {exc.strerror}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise QolaError("manifest is not UTF-8 text", where=str(p)) from None
    manifest = parse(text, str(p))
    return manifest.model_copy(update={"path": str(p.resolve()), "sha256": hashlib.sha256(raw).hexdigest()})


def is_c_keyword(name: str) -> bool:
    return name in C_KEYWORDS or keyword.iskeyword(name)
