"""The usage fragment: ``[usage]`` as its own TOML file, written by ``qola usage merge`` and read by
``qola plan``/``qola build`` (``[usage] files`` in the manifest, or ``--usage FILE``).

A fragment holds only ``[usage]`` with ``commit`` and ``variants`` (one inline table per line, so
the runtime's coverage message can name the exact line to add). Fragments are merged into the
manifest's own ``[usage] variants`` before planning, so the build key covers the set.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from pydantic import ValidationError

from qola.core import tomlfile
from qola.core.errors import QolaError
from qola.plan.manifest import Manifest, UsageSection, UsageVariant
from qola.plan.tree.files import MAX_MANIFEST, read_small

HINT = "a usage fragment is what `qola usage merge` writes: [usage] with commit and variants (docs/usage.md)"


def line(module: str, name: str) -> str:
    """One ``[usage] variants`` line (the runtime prints the same in its coverage messages)."""
    return f'{{ module = "{module}", name = "{name}" }},'


def render(variants: Iterable[tuple[str, str]], commit: str | None, comments: Sequence[str] = ()) -> str:
    """A fragment for ``(module, name)`` pairs (sorted, de-duplicated)."""
    head = ["# qola usage fragment (docs/usage.md): the variants recorded runs used, built ahead by",
            "# `qola build --usage <this file>` or a manifest's [usage] files = [\"<this file>\"].",
            *(f"# {c}" for c in comments), "[usage]"]  # fmt: skip
    if commit:
        head.append(f'commit = "{commit}"')
    body = ["variants = ["] + [f"    {line(m, n)}" for m, n in sorted(set(variants))] + ["]"]
    return "\n".join(head + body) + "\n"


def load(path: str | Path) -> UsageSection:
    """The ``[usage]`` of fragment file ``path`` (``files`` is not allowed in a fragment)."""
    p = Path(path)
    try:
        raw = read_small(p, limit=MAX_MANIFEST, what="usage fragment", hint=HINT)
    except FileNotFoundError:
        raise QolaError(f"usage fragment {str(p)!r} not found", hint=HINT) from None
    try:
        data = tomlfile.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, tomlfile.TOMLDecodeError) as exc:
        raise QolaError(f"not a valid TOML usage fragment: {exc}", where=str(p), hint=HINT) from None
    if set(data) != {"usage"} or not isinstance(data["usage"], dict) or set(data["usage"]) - {"commit", "variants"}:
        raise QolaError("a usage fragment holds [usage] with commit and variants only", where=str(p), hint=HINT)
    try:
        return UsageSection.model_validate(data["usage"])
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(x) for x in err["loc"])
        raise QolaError(f"usage.{where}: {err['msg']}", where=str(p), hint=HINT) from None


def merged(manifest: Manifest, extra_files: Sequence[str] = ()) -> Manifest:
    """``manifest`` with the variants of its ``[usage] files`` (relative to it) and of ``extra_files``
    (``--usage``, relative to the working dir) added to its ``[usage] variants``. A fragment made at
    another tree commit than another's is an error naming both."""
    own = manifest.usage
    files = [manifest.base_dir / f for f in (own.files if own else [])] + [Path(f) for f in extra_files]
    if not files:
        return manifest
    variants: list[UsageVariant] = list(own.variants) if own else []
    commit, source = (own.commit, "the manifest") if own and own.commit else (None, "")
    for f in files:
        frag = load(f)
        if frag.commit and commit and not (frag.commit.startswith(commit) or commit.startswith(frag.commit)):
            raise QolaError(
                f"usage fragment {f} was made at tree commit {frag.commit}, {source} at {commit}",
                hint="merge the records again against one tree (qola usage merge)",
            )
        if frag.commit and not commit:
            commit, source = frag.commit, str(f)
        variants += frag.variants
    seen = {(v.module, v.name): v for v in variants}
    section = UsageSection(files=list(own.files) if own else [], commit=commit, variants=list(seen.values()),
                           record_ahead=bool(own and own.record_ahead))  # fmt: skip
    return manifest.model_copy(update={"usage": section})


def recording(manifest: Manifest, record_ahead: bool) -> Manifest:
    """``manifest`` with ``[usage] record_ahead = true`` when ``record_ahead`` (``--record-ahead``):
    the switch is then part of the manifest the build key hashes, as when the file says it."""
    if not record_ahead or (manifest.usage is not None and manifest.usage.record_ahead):
        return manifest
    own = manifest.usage or UsageSection()
    return manifest.model_copy(update={"usage": own.model_copy(update={"record_ahead": True})})
