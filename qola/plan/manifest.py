"""``qola.toml`` → a typed, validated :class:`Manifest`.

The schema is pydantic models with ``extra="forbid"`` and strict types. Every
error names the file, the key path (``modules[1].drop_srcs``), the bad value
and what was expected; unknown keys get a did-you-mean.
"""

from __future__ import annotations

import difflib
import hashlib
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, field_validator, model_validator

from qola.core import rules, settings, tomlfile
from qola.core.errors import QolaError
from qola.core.setting import SettingValueError
from qola.plan.tree.files import MAX_MANIFEST, read_small

MAX_VARIANTS = 1024  # concrete variants one variant table may expand to (the product of its lists)
MAX_VARIANTS_TOTAL = 4096  # … and all of the manifest's variant tables together
MODES = ("pybind", "cpp_itfs")
LINKS = ("shared", "static")

Scalar = str | bool | int
Option = Scalar | list[Scalar]


vendor = rules.vendor  # the one arch syntax (qola.core.rules)


def check_archs(archs: list[str]) -> list[str]:
    problem = rules.arch_list_problem(archs)  # the one rule of --arch, GPU_ARCHS and this key
    if problem:
        raise ValueError(problem)
    return archs


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


_M = TypeVar("_M", bound=_Model)


class _QolaBase(_Model):
    namespace: str = "qola"
    rocm_versions: list[str] | None = None
    cuda_versions: list[str] | None = None
    if TYPE_CHECKING:  # the settings' fields (qola.core.settings; made by _with_settings), typed for readers
        aiter_commit: str | None = None
        aiter_root: str | None = None  # default --aiter-root, relative to the manifest
        patches_dir: str | None = None  # QoLA's: *.patch applied by `qola checkout` (relative to the manifest)
        aiter_url: str | None = None  # where `qola checkout` clones the tree from (default: ROCm/aiter on GitHub)

    @field_validator("namespace")
    @classmethod
    def _ns(cls, v: str) -> str:
        problem = rules.namespace_problem(v)
        if problem and len(v) > rules.MAX_NAMESPACE:
            raise ValueError(f"the namespace {problem}")
        if problem:
            raise ValueError('expected a valid C identifier that is not a keyword (letters, digits, _; e.g. "te")')
        return v

    @field_validator("rocm_versions", "cuda_versions")
    @classmethod
    def _versions(cls, v: list[str] | None) -> list[str] | None:
        for item in v or []:
            if not rules.VERSION_RE.match(item):
                raise ValueError(f'expected versions like "7.2" or "13.0", got {item!r}')
        return v


class _BuildBase(_Model):
    link: Literal["shared", "static"] = "shared"
    if TYPE_CHECKING:  # the settings' fields (qola.core.settings; made by _with_settings)
        architectures: list[str] = []
        mode: Literal["pybind", "cpp_itfs"] | None = None
        launcher: str | None = None
        remote: str | None = None  # an REAPI endpoint every compile is sent to (qola build --remote)
        jobs: int | None = None
    # entries of AITER's HIP flag set (spelled as AITER does) that this build leaves out
    drop_hip_flags: list[str] = Field(default_factory=list)

    @field_validator("drop_hip_flags")
    @classmethod
    def _flags(cls, v: list[str]) -> list[str]:
        for flag in v:
            if any(ord(c) < 32 or ord(c) == 127 for c in flag):
                raise ValueError(f"{flag!r} holds a NUL, line break or other control character; no flag does")
        return v


class ModuleSection(_Model):
    name: str
    mode: Literal["pybind", "cpp_itfs"] | None = None
    link: Literal["shared", "static"] | None = None
    receipt: int | None = Field(default=None, ge=0)
    drop_srcs: list[str] = Field(default_factory=list)
    drop_directions: list[str] = Field(default_factory=list)
    embed: list[str] | None = None  # hsa kernel types to embed (None: the registry's, in cpp_itfs mode)
    hsa_subdirs: list[str] | None = None  # QoLA's name for embed (an alias: give one of the two)
    group: str | None = None  # QoLA's module group: `--group G` / QOLA_BUILD_GROUPS build only its modules
    # overrides / full declaration: plain values or expression strings (qola.plan.tree.overrides)
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
        problem = None if v is None else rules.module_key_problem(v)
        if problem and v is not None and len(v) > rules.MAX_NAME:
            raise ValueError(f"the name {problem}")
        if problem:
            raise ValueError("expected a module name made of letters, digits and _")
        return v

    @field_validator("group")
    @classmethod
    def _group(cls, v: str | None) -> str | None:
        problem = None if v is None else rules.group_problem(v)
        if problem:
            raise ValueError(f"the group {problem}")
        return v

    @field_validator("drop_srcs")
    @classmethod
    def _patterns(cls, v: list[str]) -> list[str]:
        for item in v:
            problem = rules.relative_pattern_problem(item)
            if problem:
                raise ValueError(f"{item!r} {problem}")
        return v

    @model_validator(mode="after")
    def _one_embed_key(self) -> ModuleSection:
        if self.embed is not None and self.hsa_subdirs is not None:
            raise ValueError(
                "embed and hsa_subdirs are the same key (hsa_subdirs is QoLA's name for embed): give one of them"
            )
        return self

    @property
    def embed_dirs(self) -> list[str] | None:
        """``embed`` or its alias ``hsa_subdirs``; None when neither is given."""
        return self.embed if self.embed is not None else self.hsa_subdirs


def variant_count(options: dict[str, Any]) -> int:
    """How many concrete variants ``options`` expand to (lists multiply; computed, never expanded)."""
    return math.prod(len({(type(x), x) for x in v}) for v in options.values() if isinstance(v, list))


def _check_count(options: dict[str, Any]) -> None:
    total = variant_count(options)
    if total > MAX_VARIANTS:
        sizes = " × ".join(
            f"{len({(type(x), x) for x in v})} {k}" for k, v in options.items() if isinstance(v, list) and len(v) > 1
        )
        raise ValueError(
            f"expands to {total:,} variants ({sizes}); at most {MAX_VARIANTS:,} are allowed per table: "
            "split it, or leave an option out (omitted = every value, without expanding)"
        )


class VariantSection(_Model):
    """Generic variant matrix for any generator (issue 4)."""

    module: str
    generator: str | None = None  # substring of the generator command it applies to
    pattern: str  # instance-name pattern with {option} placeholders
    options: dict[str, Option] = Field(default_factory=dict)
    tokens: dict[str, dict[str, str]] = Field(default_factory=dict)

    def count(self) -> int:
        return variant_count(self.options)

    @model_validator(mode="after")
    def _bounded(self) -> VariantSection:
        _check_count(self.options)
        return self


class _MhaVariant(_Model):
    """Shared by the CK fMHA variant tables: ``name`` (any-of globs) is not an option of the product."""

    module: str | None = None

    def options(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in type(self).model_fields if k not in ("module", "name")}

    def count(self) -> int:
        return variant_count(self.options())

    @model_validator(mode="after")
    def _bounded(self) -> _MhaVariant:
        _check_count(self.options())
        return self


class MhaFwdVariant(_MhaVariant):
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


class MhaBwdVariant(_MhaVariant):
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

    @model_validator(mode="after")
    def _bounded(self) -> JitAot:
        _check_total(self)
        return self


def _check_total(tables: Any) -> None:
    total = sum(t.count() for t in (*tables.variants, *tables.mha_fwd_variants, *tables.mha_bwd_variants))
    if total > MAX_VARIANTS_TOTAL:
        raise ValueError(
            f"the variant tables expand to {total:,} variants together; at most {MAX_VARIANTS_TOTAL:,} are allowed"
        )


class _JitBase(_Model):
    """``[jit]``: instances outside ``aot`` are deferred to the on-demand JIT (docs/manifest.md)."""

    if TYPE_CHECKING:  # the setting's field (qola.core.settings.JIT)
        enabled: bool = True
    modules: list[str] | None = None  # modules the JIT applies to (default: every module with generators)
    aot: JitAot = Field(default_factory=JitAot)
    compiler: str | None = None  # the compiler the library runs (default: the build's)


MAX_USAGE_VARIANTS = 100_000  # [usage] variants (a whole model zoo's set is a few thousand)


class UsageVariant(_Model):
    """One line of ``[usage] variants``: a variant (generated instance file stem) of a module."""

    module: str
    name: str

    @field_validator("module")
    @classmethod
    def _module(cls, v: str) -> str:
        problem = rules.module_key_problem(v)
        if problem:
            raise ValueError(f"module name {v!r} {problem}")
        return v

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        problem = rules.usage_name_problem(v)
        if problem:
            raise ValueError(f"variant name {v!r} {problem}")
        return v


class _UsageBase(_Model):
    """``[usage]``: the variants a workload uses (``qola usage merge`` writes them), built ahead
    exactly; ``files``: fragment files holding more (relative to the manifest). docs/usage.md."""

    files: list[str] = Field(default_factory=list)
    commit: str | None = None  # the tree commit the names were checked against (qola usage merge)
    variants: list[UsageVariant] = Field(default_factory=list, max_length=MAX_USAGE_VARIANTS)
    if TYPE_CHECKING:  # the setting's field (qola.core.settings.RECORD_AHEAD): built-ahead variants record
        record_ahead: bool = False  # their first call in each process (event "ahead"), as deferred ones do


def _with_settings(base: type[_M], section: str) -> type[_M]:
    """``base`` with a field for each setting whose manifest key is in ``section``
    (:meth:`qola.core.setting.Setting.schema_field`: its TOML type, then its one check)."""
    keys = [(s.manifest_key, s) for s in settings.declared() if s.manifest_key]
    fields = {key: s.schema_field() for (sec, key), s in keys if sec == section}
    made: type[_M] = create_model(base.__name__[1:].replace("Base", "Section"), __base__=base, **fields)  # type: ignore[call-overload]
    return made


if TYPE_CHECKING:
    QolaSection = _QolaBase
    BuildSection = _BuildBase
    JitSection = _JitBase
    UsageSection = _UsageBase
else:
    QolaSection = _with_settings(_QolaBase, "qola")
    BuildSection = _with_settings(_BuildBase, "build")
    JitSection = _with_settings(_JitBase, "jit")
    UsageSection = _with_settings(_UsageBase, "usage")


class Manifest(_Model):
    qola: QolaSection = Field(default_factory=QolaSection)
    build: BuildSection = Field(default_factory=BuildSection)
    modules: list[ModuleSection] = Field(default_factory=list)
    variants: list[VariantSection] = Field(default_factory=list)
    mha_fwd_variants: list[MhaFwdVariant] = Field(default_factory=list)
    mha_bwd_variants: list[MhaBwdVariant] = Field(default_factory=list)
    jit: JitSection | None = None
    usage: UsageSection | None = None
    # set by load(), not by the file
    path: str = ""
    sha256: str = ""

    @model_validator(mode="after")
    def _unique_modules(self) -> Manifest:
        seen: set[str] = set()
        for i, m in enumerate(self.modules):
            if m.name in seen:
                raise ValueError(f"modules[{i}].name: module {m.name!r} is listed twice")
            seen.add(m.name)
        _check_total(self)
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
        elif isinstance(part, str) and (
            part.startswith("function-") or part in ("str", "bool", "int", "list[union[str,bool,int]]")
        ):
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
        if isinstance(got, str) and len(got) > 80:
            got = got[:60] + f"…({len(got)} characters)"
        said = err["ctx"]["error"]  # a setting's check names the value itself (as -j and MAX_JOBS say it)
        named = isinstance(said, SettingValueError) and "got " in str(said)
        shown = f"got {got!r}; " if isinstance(got, (str, int)) and key and not named else ""
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
                seen[key] = {
                    **prev,
                    "type": "union",
                    "msg": "expected a string, true/false, an integer or a list of those",
                }
            continue
        seen[key] = err
    return list(seen.values())


def parse(text: str, path: str = "<string>") -> Manifest:
    """Parse and validate manifest text. Raises QolaError naming ``path`` and the key."""
    try:
        data = tomlfile.loads(text)
    except tomlfile.TOMLDecodeError as exc:
        raise QolaError(f"not valid TOML: {exc}", where=path, hint="check the line named above") from None
    except (RecursionError, MemoryError):
        raise QolaError(
            "manifest nests arrays or tables too deeply to read",
            where=path,
            hint="a qola.toml needs only a few levels; see docs/manifest.md",
        ) from None
    except ValueError as exc:  # an integer of more than 4300 digits (Python's int/str conversion limit)
        raise QolaError(
            f"not valid TOML: {exc}".split("; use sys.")[0],
            where=path,
            hint="numbers in a qola.toml are small (jobs, receipt)",
        ) from None
    try:
        manifest = Manifest.model_validate(data)
    except ValidationError as exc:
        lines = [_describe(e) for e in _union_errors([dict(e) for e in exc.errors()])]
        message = lines[0] if len(lines) == 1 else "invalid manifest:\n  " + "\n  ".join(lines)
        raise QolaError(message, where=path, hint="see docs/manifest.md for every key and its type") from None
    except (RecursionError, ValueError, TypeError) as exc:
        raise QolaError(f"invalid manifest: {exc}", where=path) from None
    sha = hashlib.sha256(text.encode()).hexdigest()
    return manifest.model_copy(update={"path": path, "sha256": sha})


def load(path: str | Path) -> Manifest:
    """Read and validate the manifest at ``path``: a regular file of at most 4 MiB (a FIFO or
    ``/dev/zero`` is refused before anything is read from it)."""
    p = Path(path)
    try:
        raw = read_small(p, limit=MAX_MANIFEST, what="manifest", hint="pass --manifest with the path of a qola.toml")
    except FileNotFoundError:
        raise QolaError(f"manifest {str(p)!r} not found", hint="pass --manifest with the path of a qola.toml") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise QolaError("manifest is not UTF-8 text", where=str(p)) from None
    manifest = parse(text, str(p))
    return manifest.model_copy(update={"path": str(p.resolve()), "sha256": hashlib.sha256(raw).hexdigest()})
