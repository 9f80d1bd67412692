"""The fixes qola makes to a kernel tree's code before compiling it: its one home.

Transformer Engine builds AITER through QoLA, whose ``patches/aiter/`` are "the fixes TE needs on top
of AITER", applied to the checkout by default. qola carries the same fixes as its own declared
units (:data:`FIXES`), written from what each of QoLA's patches changes and why, and applies them to
staged copies in the build dir (:mod:`qola.compile.overlay`): the tree itself is never modified.

A fix is recognised by content, never by a commit name. Each one names its file (relative to the
tree's meta dir), the code it is about (``concerns``: every pattern must be found, else the tree has
no such code and the fix is *absent* there, silently right: the sdist's older AITER), and its edits.
An edit's ``anchor`` must match exactly once; its ``done`` pattern says the fixed code is already
there. Per tree a fix is:

* ``applied`` — every edit's anchor found once (or the edit already done);
* ``present`` — every edit already done: AITER (or an earlier patch) has the fix; a plan note;
* ``absent`` — no file, or not the code the fix is about; nothing to do;
* ``changed`` — the code is there but an anchor is not found once: a half-matching AITER. Every
  module that reads the file fails naming the fix (never skipped silently).

:func:`decide` is pure (it reads the tree's files); :func:`fixed_text` gives the staged copy's text.
``[qola] fixes`` chooses which are on (:func:`chosen`): all by default, ``"none"`` for none.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qola.core.errors import QolaError
from qola.plan.tree.files import read_text

MAX_FIXED = 4 << 20  # one file a fix reads (AITER's mha_bwd.cu: about 25 KiB)
ALL, NONE = "all", "none"
APPLIED, PRESENT, ABSENT, CHANGED = "applied", "present", "absent", "changed"


@dataclass(frozen=True)
class Edit:
    anchor: str  # a regex (MULTILINE) that must match exactly once; its groups feed ``replace``
    replace: str  # the match's replacement (``re`` template: ``\g<name>``)
    done: str  # a regex (MULTILINE | DOTALL): the edit's result is already in the file


@dataclass(frozen=True)
class Fix:
    name: str
    file: str  # relative to the tree's meta dir
    why: str  # what goes wrong without it (plan, docs)
    concerns: tuple[str, ...]  # regexes, all found: the file holds the code the fix is about
    edits: tuple[Edit, ...]
    qola_patch: str  # the patch of QoLA's patches/aiter/ that makes the same change


_IND = r"(?P<ind>[ \t]*)"

FIXES: tuple[Fix, ...] = (
    Fix(
        "bwd-probe-no-fallback",
        "csrc/cpp_itfs/mha_bwd.cu",
        "mha_bwd(v3_api_check) is a probe (would the assembly backward run?), but where the assembly "
        "path says no it runs the CK backward: the probe writes dq, dk and dv",
        (r"\bv3_api_check\b", r"\bfmha_v3_bwd\s*\(\s*a\s*,"),
        (
            Edit(
                r"^" + _IND + r"(?P<ret>if\s*\(\s*asm_ret\s*!=\s*-1\s*\)\s*return\s+asm_ret\s*;)[ \t]*$",
                "\\g<ind>\\g<ret>\n"
                "\\g<ind>if(a.v3_api_check) // qola fix bwd-probe-no-fallback: a probe never runs the CK backward\n"
                "\\g<ind>    return -1;",
                r"asm_ret\s*;\s*(?://[^\n]*\s*)*if\s*\(\s*a\.v3_api_check\s*\)\s*(?://[^\n]*\s*)*return\s+-1\s*;",
            ),
        ),
        "0007-mha-bwd-v3-api-check-dry-run",
    ),
    Fix(
        "bwd-probe-before-load",
        "csrc/cpp_itfs/mha_bwd.cu",
        "fmha_v3_bwd answers a v3_api_check probe only after it has loaded its three code objects",
        (r"\bv3_api_check\b", r"\bfmha_v3_bwd\s*\([^;{)]*\)\s*\{", r"\bAiterAsmKernel\b"),
        (
            Edit(
                r"(?P<head>\bfmha_v3_bwd\s*\([^;{)]*\)\s*\{(?:(?!AiterAsmKernel)[\s\S])*?\n)"
                + _IND
                + r"(?=[^\n]*AiterAsmKernel)",
                "\\g<head>\\g<ind>if(a.v3_api_check) // qola fix bwd-probe-before-load: answer before any "
                "code object is loaded\n\\g<ind>    return 1;\n\n\\g<ind>",
                r"\bfmha_v3_bwd\s*\([^;{)]*\)\s*\{(?:(?!AiterAsmKernel).)*?if\s*\(\s*a\.v3_api_check\s*\)\s*"
                r"(?://[^\n]*\s*)*return\s+1\s*;",
            ),
        ),
        "0007-mha-bwd-v3-api-check-dry-run",
    ),
    Fix(
        "bwd-det-group-zero-ws",
        "csrc/cpp_itfs/mha_bwd.cu",
        "in deterministic group (varlen) mode the CK backward's workspace is not zeroed where the "
        "launcher does not zero it itself (non-causal padding): dq differs from run to run",
        (r"\bworkspace_alloc\s*\(\s*launcher\.workspace_size\b", r"\bis_deterministic\b", r"\bis_group_mode\b"),
        (
            Edit(
                r"(?P<head>\bworkspace_alloc\s*\(\s*launcher\.workspace_size\s*,\s*(?:/\*\s*zero_init\s*=\s*\*/\s*)?)"
                r"false(?P<tail>\s*\))",
                "\\g<head>a.is_deterministic && a.is_group_mode /* qola fix bwd-det-group-zero-ws */\\g<tail>",
                r"is_deterministic\s*&&\s*a\.is_group_mode.{0,400}?workspace_alloc\s*\(\s*launcher\.workspace_size"
                r"|workspace_alloc\s*\(\s*launcher\.workspace_size\s*,[^;]*is_deterministic",
            ),
        ),
        "0006-bwd-group-det-zero-ws",
    ),
    Fix(
        "bwd-gfx1250-causal",
        "csrc/cpp_itfs/mha_bwd.cu",
        "gfx1250 ships only bottom-right causal backward kernels and TE's causal mask is top-left: the "
        "assembly backward finds no kernel and returns -1, though with seqlen_q == seqlen_k the masks are one",
        (r"\bmt\s*=\s*1\s*;",),
        (
            Edit(
                r"(?P<head>^" + _IND + r"if\s*\(\s*arch_id\s*==\s*\"gfx942\"[^\n]*\bmt\s*==\s*2[^\n]*\)\s*\{\s*"
                r"mt\s*=\s*1\s*;[^\n]*\n[ \t]*\}[^\n]*\n)",
                "\\g<head>\\g<ind>// qola fix bwd-gfx1250-causal: gfx1250 has bottom-right causal kernels only; "
                "top-left is the same mask when seqlen_q == seqlen_k\n"
                '\\g<ind>if(arch_id == "gfx1250" && mt == 1 && a.seqlen_q == a.seqlen_k)\n'
                "\\g<ind>{\n\\g<ind>    mt = 2;\n\\g<ind>}\n",
                r"\"gfx1250\"[^{;]*\bmt\s*==\s*1[^{;]*\{\s*mt\s*=\s*2\s*;",
            ),
        ),
        "0004-gfx1250-causal-mask-remap",
    ),
    Fix(
        "asm-embedded-first",
        "csrc/include/aiter_hip_common.h",
        "the assembly-kernel loader reads $AITER_ASM_DIR before the embedded code objects, and `import "
        "aiter` sets that variable: a library with embedded code objects, in a process that also imported "
        "PyTorch's AITER, loads that AITER's .co files",
        (r"\bload_hsaco_file\b", r"\bAITER_EMBEDDED_HSA_MAP\b"),
        (
            Edit(
                r"(?P<get>^" + _IND + r"const\s+char\s*\*\s*AITER_ASM_DIR\s*=\s*std::getenv\(\s*\"AITER_ASM_DIR\"\s*\)"
                r"\s*;[^\n]*\n)(?P<mid>(?:(?!\bif\s*\()[\s\S]){0,400}?)(?P<cond>\bif\s*\(\s*)AITER_ASM_DIR\s*!=\s*nullptr\s*\)",
                "\\g<get>#if defined(AITER_EMBEDDED_HSA_HEADER) && defined(AITER_EMBEDDED_HSA_MAP)\n"
                "\\g<ind>constexpr bool qola_asm_dir_first = false; // qola fix asm-embedded-first: the embedded "
                "code objects win\n#else\n\\g<ind>constexpr bool qola_asm_dir_first = true;\n#endif\n"
                "\\g<mid>\\g<cond>qola_asm_dir_first && AITER_ASM_DIR != nullptr)",
                r"\A(?!.*getenv\(\s*\"AITER_ASM_DIR\"\s*\)).*AITER_EMBEDDED_HSA_MAP\s*\.\s*find"
                r"|qola_asm_dir_first",
            ),
        ),
        "0002-hsa-only-aiter-hip-common",
    ),
)
NAMES = tuple(f.name for f in FIXES)


@dataclass(frozen=True)
class FixUse:
    """One fix on one tree: its status (module docstring), the modules that read its file, the
    sha256 of the file's staged text after every fix of it (``applied``), and what to say."""

    name: str
    file: str
    status: str
    modules: tuple[str, ...] = ()
    sha256: str | None = None
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> FixUse:
        return cls(
            str(data["name"]),
            str(data["file"]),
            str(data["status"]),
            tuple(str(m) for m in data.get("modules") or ()),
            data.get("sha256"),
            str(data.get("note") or ""),
        )


def chosen(names: Sequence[str] | None, where: str | None = None) -> tuple[Fix, ...]:
    """The fixes ``[qola] fixes`` / ``--fixes`` turns on (:func:`qola.core.settings.fix_names`):
    None or ``("all",)``: every one; ``()`` (``"none"``): none; names: those, in :data:`FIXES`'
    order (an unknown name is an error with the nearest ones). ``where``: who gave them."""
    if names is None or tuple(names) == (ALL,):
        return FIXES
    for n in names:
        if n not in NAMES:
            near = difflib.get_close_matches(n, NAMES, n=2, cutoff=0.5)
            raise QolaError(
                f"{where or '[qola].fixes'}: no fix named {n!r}"
                + (f" (did you mean {' or '.join(near)}?)" if near else ""),
                hint=f'the fixes: {", ".join(NAMES)}; or "all" (the default) or "none"',
            )
    return tuple(f for f in FIXES if f.name in names)


def _once(pattern: str, text: str) -> list[re.Match[str]]:
    return list(re.finditer(pattern, text, re.M))


def _edit(fix: Fix, edit: Edit, text: str) -> tuple[str, str]:
    """(the text after ``edit``, ``applied`` | ``present`` | ``changed``): its result already there
    is ``present``, before its anchor is looked for."""
    if re.search(edit.done, text, re.M | re.S):
        return text, PRESENT
    found = _once(edit.anchor, text)
    if len(found) == 1:
        m = found[0]
        return text[: m.start()] + m.expand(edit.replace) + text[m.end() :], APPLIED
    return text, CHANGED


def apply_fix(fix: Fix, text: str) -> tuple[str, str, str]:
    """(the text after ``fix``, its status, a note) for a file's text (module docstring)."""
    if not all(re.search(c, text, re.M) for c in fix.concerns):
        return text, ABSENT, ""
    states = []
    for i, edit in enumerate(fix.edits):
        text, state = _edit(fix, edit, text)
        if state == CHANGED:
            many = len(_once(edit.anchor, text))
            return (
                text,
                CHANGED,
                f"fix {fix.name}: {fix.file} holds the code it is about, but not as the fix knows it (edit "
                f"{i + 1} of {len(fix.edits)}: its anchor matches {many} times, not once, and the fixed "
                f"code is not there either)",
            )
        states.append(state)
    if all(s == PRESENT for s in states):
        return text, PRESENT, f"fix {fix.name}: {fix.file} already has it (nothing to do)"
    return text, APPLIED, ""


def fixed_text(fixes: Sequence[Fix], file: str, text: str) -> str:
    """The staged copy's text of ``file``: ``text`` after every one of ``fixes`` that edits it."""
    for fix in fixes:
        if fix.file == file:
            text, _state, _note = apply_fix(fix, text)
    return text


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def read_fixed(meta_dir: Path, file: str) -> str | None:
    """The tree's ``file`` (relative to the meta dir) as text, through the one checked open; None
    when it is not there."""
    path = meta_dir / file
    try:
        return read_text(path, limit=MAX_FIXED, what=f"file {file} of the tree", hint="fixes read it to stage a copy")
    except FileNotFoundError:
        return None


def decide(fixes: Iterable[Fix], meta_dir: Path, readers: Mapping[str, tuple[str, ...]]) -> tuple[FixUse, ...]:
    """Each fix on the tree at ``meta_dir``; ``readers``: per file, the modules that read it
    (:func:`qola.plan.planner.make_plan` says which). A fix no module reads is left out."""
    out: list[FixUse] = []
    texts: dict[str, str | None] = {}
    for fix in fixes:
        mods = readers.get(fix.file, ())
        if not mods:
            continue
        if fix.file not in texts:
            texts[fix.file] = read_fixed(meta_dir, fix.file)
        text = texts[fix.file]
        if text is None:
            continue
        after, state, note = apply_fix(fix, text)
        if state == ABSENT:
            continue
        if state == APPLIED:
            texts[fix.file] = after
        out.append(FixUse(fix.name, fix.file, state, mods, note=note))
    final = {f: sha256(t) for f, t in texts.items() if t is not None}
    return tuple(dataclasses.replace(u, sha256=final[u.file]) if u.status == APPLIED else u for u in out)


def by_name(name: str) -> Fix:
    return next(f for f in FIXES if f.name == name)
