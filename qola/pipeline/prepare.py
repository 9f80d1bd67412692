"""Stage 1 of every command that reads a manifest: :func:`prepare` (manifest, tree, plan as the
tables give it, from the settings resolved once: :class:`~qola.pipeline.spec.Given`), and for a build
:func:`resolve_build` (that, the settings with the machine asked, the table texts, the record).

The tree is the one :func:`qola.pipeline.begin.ask` chose; :func:`tree_root` checks it exists.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from qola.checkout.choice import VARIABLES as CHOICE_VARIABLES
from qola.checkout.choice import TreeChoice, named_by_env
from qola.core import inputs, owner
from qola.core import settings as declared
from qola.core.errors import QolaError
from qola.pipeline.begin import Start
from qola.pipeline.machine import settings
from qola.pipeline.record import BuildRecord, settings_record
from qola.pipeline.spec import BuildSpec, Given, Prepared, Settings
from qola.pipeline.views import git_view, only, recorded, tree_env
from qola.store.fastpath import RecordedEnv, env_keys_of

if TYPE_CHECKING:
    from qola.plan.manifest import Manifest
    from qola.plan.tree.aiter import AiterTree
    from qola.toolchain.env import ToolchainEnv


def tree_root(choice: TreeChoice, manifest_path: str) -> Path:
    """The chosen tree's root; the default checkout must exist."""
    if choice.managed and not choice.path.exists():
        raise QolaError(
            f"no kernel tree given, and the default checkout {choice.path} does not exist",
            hint="pass --aiter-root DIR, set [qola].aiter_root in the manifest, or clone it: "
            f"qola checkout --manifest {manifest_path}",
        )
    if choice.managed:  # qola's own clone (a cache under ~/.cache for an installed qola): the user's alone
        owner.check_dir(choice.path, "default kernel checkout", "--aiter-root")
    return choice.path


def pin_chooser(spec: BuildSpec, choice: TreeChoice, env: Mapping[str, str]) -> str | None:
    """Why the tree is the user's explicit choice (its pin mismatch then a recorded warning), or None."""
    if spec.skip_checkout:
        return "--skip-checkout"
    return choice.how if choice.from_env else named_by_env(choice.path, only(env, CHOICE_VARIABLES))


def hip_version(env: Mapping[str, str] | ToolchainEnv, manifest: Manifest) -> str | None:
    """The HIP version that answers ``torch.version.hip``: the installed HIP compiler's (found and
    read as the build finds and reads it), else the manifest's first accepted ROCm version."""
    from qola.toolchain.env import ToolchainEnv  # lazy: the build's own probe
    from qola.toolchain.hip import installed_version  # lazy: the build's own probe

    return installed_version(ToolchainEnv.of(env)) or next(iter(manifest.qola.rocm_versions or ()), None)


def prepare(spec: BuildSpec, given: Given, env: Mapping[str, str]) -> Prepared:
    """Manifest, tree and plan as the tables and the manifest give it, every setting as ``given``
    (no generator runs: variants and the JIT split are the next stages, :func:`qola.pipeline.run.plan`)."""
    from qola.hooks import jit as jit_hook  # lazy: start-up of the CLI and of the no-op path
    from qola.plan import groups  # lazy: start-up of the CLI and of the no-op path
    from qola.plan import manifest as manifest_mod  # lazy: start-up of the CLI and of the no-op path
    from qola.plan.planner import PinAsk, PlanInputs, check_pin, make_plan  # lazy: start-up of the CLI
    from qola.plan.tree.aiter import open_tree  # lazy: start-up of the CLI and of the no-op path
    from qola.store.usage import fragment as usage_fragment  # lazy: start-up of the CLI and of the no-op path

    values = given.values
    manifest = manifest_mod.load(spec.manifest)
    manifest = usage_fragment.merged(manifest, spec.usage_files)  # [usage] files and --usage
    manifest = usage_fragment.recording(manifest, given[declared.RECORD_AHEAD])  # --record-ahead
    manifest = jit_hook.switched(manifest, given[declared.JIT])  # --jit on|off: as [jit] enabled
    wanted = given[declared.GROUPS] or ()
    manifest = groups.select(manifest, wanted, values.where(declared.GROUPS))
    tree = open_tree(tree_root(given.choice, spec.manifest), given.choice.how)
    archs = given[declared.ARCHS]  # no source gives one: its one error ("no GPU architectures given")
    commit, notes, pin = check_pin(
        manifest,
        tree,
        PinAsk(
            spec.allow_unpinned,
            want=given[declared.AITER_COMMIT],
            want_from=values.where(declared.AITER_COMMIT),
            chosen=pin_chooser(spec, given.choice, env),
            git_env=git_view(env),
        ),
    )
    if given[declared.PATCHES_DIR]:
        from qola.checkout.request import unapplied_patches_note  # lazy: start-up of the CLI and of the no-op path

        note = unapplied_patches_note(tree.root, values, git_view(env))
        notes += [note] if note else []
    hipv = hip_version(env, manifest) if manifest_mod.vendor(archs[0]) == "hip" else None
    plan = make_plan(
        manifest,
        tree,
        PlanInputs(
            archs=archs,
            mode=given[declared.MODE],
            env=tree_env(env, tree),
            hip_version=hipv,
            tree_commit=commit,
            warnings=notes,
            pin=pin,
            fixes=given[declared.FIXES],
            fixes_from=values.where(declared.FIXES),
        ),
    )
    if wanted:
        manifest = groups.prune(manifest, plan)
    return Prepared(manifest, tree, plan, given=given)


@dataclass(frozen=True)
class Resolved:
    """Stage 1 of a build: manifest, tree and plan as the tables give it, every setting, and what
    the build key, the no-op record and manifest.json read of the environment."""

    prepared: Prepared
    settings: Settings
    table: tuple[list[str], list[str]]  # the module table's and core.py's paths, the texts of those read
    inputs: RecordedEnv  # the recorded variables (:func:`qola.store.fastpath.env_keys_of` of the texts)
    tree_given: str  # the tree's root as named (the no-op record notices a symlink re-pointed)
    record: BuildRecord  # manifest.json's ``build`` (:func:`settings_record`)


def resolve_build(spec: BuildSpec, begun: Start) -> Resolved:
    """Stage 1: :func:`prepare`, :func:`settings` (the machine asked for ``vendor``'s launcher or
    farm), the table texts and the views; the only call that reads ``begun.env`` after stage 0."""
    env = begun.env
    prepared = prepare(spec, begun.given, env)
    table = table_texts(prepared.tree)
    keys = env_keys_of(table[1], {m.name for m in prepared.plan.modules})  # what the built modules read
    inputs = recorded(env, keys)
    s = settings(spec, begun.given, begun.layout, env, prepared.plan.vendor)
    given = str(tree_root(begun.given.choice, spec.manifest))
    record = settings_record(begun.asked, inputs, keys)
    return Resolved(prepared, s, table, inputs, given, record)


def table_texts(tree: AiterTree) -> tuple[list[str], list[str]]:
    """(the module table and core.py, the texts of those that could be read)."""
    files = [str(tree.table_path), str(tree.core_path)]
    texts = []
    for f in files:
        with contextlib.suppress(OSError):
            texts.append(inputs.read_record(f, limit=inputs.MAX_SOURCE, what="tree file"))
    return files, texts
