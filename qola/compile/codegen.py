"""Run a module's generator commands into a staging dir, then bring the module's blob dir to it.

Each generator command is reused or rerun on its own (:mod:`qola.compile.genruns`): its key (its
command, the variables qola sets for it: the archs, the merged configs it names) and what it read
when it last ran (its depfile, :mod:`qola.plan.genread`: every file and module it opened, wherever
it lies, the variables it looked up, the interpreter) decide; a reused command's files are linked
from the blob dir into the staging dir at its turn, and a generator that started another program
has no depfile and reruns every time. Every run starts from an empty staging dir, so instances from
an earlier filter, or a removed generator's files, never survive. The blob dir is synced file by file
(:func:`qola.core.fsutil.sync_dir`): a generated file whose bytes did not change keeps its mtime, so a
rerun generator (an edited comment, a new option that selects the same instances) recompiles only
what it really changed. A generator's exit code is checked (AITER ignores it). Staging dirs carry
their owner's pid (``.staging-<pid>``, ``.blob.old-<pid>``): :func:`clean_stale` removes those of
killed runs.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from qola.compile import genruns, gensums
from qola.compile.layout import BLOB, CONFIGS, gen_module_dir
from qola.core import deadlines, inputs, proc
from qola.core.errors import FailedProcessError, QolaError
from qola.core.fsutil import atomic_write, old_prefix, pid_tempdir, remove_stale, sync_dir
from qola.plan import genread
from qola.plan.genrules import asm_arch, missing_package_hint, skip_warning
from qola.plan.model import Generator
from qola.plan.planner import OUTPUT_DIR
from qola.plan.tree.aiter_configs import (
    CONFIGS_TOKEN,
    MergedConfig,
    merge,
    render,
    write_merged,
)
from qola.plan.variants import GenEnv, GeneratorEnv

STAMP = gensums.STAMP
GENERATED_EXTS = genruns.GENERATED_EXTS
# gen_root/<module>/.staging-<pid>, .blob.old-<pid> (and .old-<pid>, what qola before issue 12 left)
STAGING_PREFIXES = (".staging-", old_prefix("blob"), ".old-")
LISTING_PREFIX = "qola-list-"  # <tmp>/qola-list-<pid>-…: a generator's --list_blobs run (qola.plan.variants)


@dataclass(frozen=True)
class GenJob:
    """One module's generators, with the extra arguments (filters) qola adds to each."""

    module: str
    generators: tuple[Generator, ...]
    extra_args: tuple[tuple[str, ...], ...] = ()  # per generator; () = none
    configs: tuple[MergedConfig, ...] = ()  # merged tuned configs its commands name as {qola_configs}/<name>
    configs_dir: str | None = None  # where they were written (set by write_configs)
    config_digests: tuple[tuple[str, str], ...] = ()  # (name, sha256 of the written file)
    env: tuple[tuple[str, str], ...] = ()  # the variables qola sets for its generators (genrules.aiter_env)

    def argvs(self, out_dir: str, python: str) -> list[list[str]]:
        result = []
        for i, gen in enumerate(self.generators):
            argv = [a.replace(OUTPUT_DIR, out_dir) for a in gen.run_argv]
            if self.configs_dir is not None:
                argv = [a.replace(CONFIGS_TOKEN, self.configs_dir) for a in argv]
            extra = list(self.extra_args[i]) if i < len(self.extra_args) else []
            result.append([python, *argv, *extra])
        return result


@dataclass(frozen=True)
class GenResult:
    module: str
    blob_dir: Path
    sources: tuple[str, ...]
    skipped: bool
    seconds: float
    commands: tuple[str, ...] = field(default=())
    warnings: tuple[str, ...] = field(default=())  # absent per-arch asm generators, skipped
    output: str = ""  # each command run and what it printed (at most proc.LOG_KEEP bytes each: head and tail)
    groups: tuple[tuple[str, ...], ...] = ()  # each generator's sources, in command order (() = not known)
    reused: tuple[str, ...] = ()  # the commands not run: what they read is unchanged (their files kept)


def stamp_of(job: GenJob, python: str) -> str:
    digests = dict(job.config_digests) or {
        c.name: hashlib.sha256(render(merge(c)).encode()).hexdigest() for c in job.configs
    }
    argv = job.argvs(OUTPUT_DIR, python)
    payload: dict[str, object] = {"argv": argv, "format": genread.FORMAT}
    if job.env:  # what qola tells the generators besides argv (the archs): another arch, another output
        payload["env"] = dict(job.env)
    if digests:  # merged tuned configs: their content, not just their name, decides a rerun
        payload["configs"] = digests
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


NEVER_SAME = "/proc/self"  # its state (the process's own /proc dir) differs in every process


def _runs_of(blob_dir: Path) -> tuple[list[genruns.RunRecord], list[str]] | None:
    """The runs the stamp beside ``blob_dir`` records and the variables qola set for them (None: no stamp)."""
    try:
        done = json.loads(inputs.read_record(blob_dir.parent / STAMP))
    except (OSError, ValueError):
        return None
    given = done.get("given") if isinstance(done, dict) else None
    return genruns.load(done), [str(g) for g in given] if isinstance(given, list) else []


def recorded_inputs(blob_dir: Path) -> list[str]:
    """What the generators writing ``blob_dir`` read when they last ran (their depfiles in the stamp
    beside it), for the no-op record: a build whose generators read a changed file is no no-op. A
    module whose generators cannot be reused (one started a program, or iterated the whole
    environment) gives :data:`NEVER_SAME`: then no build is a no-op, and its generators run in each."""
    got = _runs_of(blob_dir)
    if got is None:
        return []
    runs = got[0]
    if not runs or any(r.deps is None or r.deps.whole_env is not None for r in runs):
        return [NEVER_SAME]
    return sorted({p for r in runs if r.deps is not None for p in r.deps.paths()})


def recorded_variables(blob_dir: Path) -> dict[str, str | None]:
    """The variables the generators writing ``blob_dir`` looked up, each with the hash of the value
    they read (:func:`qola.plan.genread.value_hash`; None: unset), for the no-op record; those qola
    sets for them (the archs, its asm dir) are left out: the stamp holds them."""
    got = _runs_of(blob_dir)
    if got is None:
        return {}
    runs, given = got
    return {k: v for r in runs if r.deps is not None for k, v in r.deps.env if k not in given}


def generated_sources(blob_dir: Path, module: str = "?") -> tuple[str, ...]:
    """The sources a generator wrote under ``blob_dir``. A name with a control character (a newline
    would break build.ninja's syntax) or one that is not UTF-8 fails the module, naming the file."""
    if not blob_dir.is_dir():
        return ()
    for p in blob_dir.rglob("*"):
        rel = str(p.relative_to(blob_dir))
        if any(ord(c) < 32 or ord(c) == 127 or "\udc80" <= c <= "\udcff" for c in rel):
            shown = rel.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
            raise QolaError(
                f"module {module}: its generator wrote a file named {shown!r} (a control character or "
                "bytes that are not UTF-8), which no build file can name",
                hint="fix the generator (or the variant filter that named the file)",
            )
    return tuple(sorted(str(p) for p in blob_dir.rglob("*") if p.suffix in GENERATED_EXTS and p.is_file()))


def write_configs(job: GenJob, gen_root: Path) -> GenJob:
    """Write the merged tuned configs ``job`` names into ``gen_root/configs`` (each atomically, and
    only when its content changed); the job, now with their dir and digests."""
    if not job.configs:
        return job
    directory = gen_root / CONFIGS
    digests = tuple((cfg.name, write_merged(cfg, directory)) for cfg in job.configs)
    return replace(job, configs_dir=str(directory), config_digests=digests)


def run_generators(
    job: GenJob,
    gen_root: Path,
    *,
    env: GenEnv,
    python: str = sys.executable,
    force: bool = False,
    hsa_dir: str | os.PathLike[str] | None = None,
) -> GenResult:
    """Generate ``job`` into ``gen_root/<module>/blob``, each generator command rerun only when what
    it read changed (:mod:`qola.compile.genruns`). Raises FailedProcessError on a failing generator,
    QolaError on an absent one — except an absent script under ``hsa_dir/<gfx…>/`` (a per-arch asm
    generator, :mod:`qola.plan.genrules`), which is skipped and named in ``GenResult.warnings``."""
    job = write_configs(job, gen_root)
    mod_dir = gen_module_dir(gen_root, job.module)
    blob, stamp_file = mod_dir / BLOB, mod_dir / STAMP
    start = time.perf_counter()
    genv = GeneratorEnv.of(env)
    keys = run_keys(job, python)
    prev = [] if force or not blob.is_dir() else (_runs_of(blob) or ([], []))[0]
    chosen = genruns.reusable(prev, keys, blob, genv.child.as_dict())
    if prev and len(chosen) == len(keys) and sorted(chosen.values()) == list(range(len(prev))):
        return _kept(job, blob, [prev[chosen[i]] for i in range(len(keys))])
    mod_dir.mkdir(parents=True, exist_ok=True)
    staging = mod_dir / f".staging-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    stamp_file.unlink(missing_ok=True)  # a run cut short leaves no stamp (reused files are linked from the blob dir)
    try:
        reuse = {i: prev[j] for i, j in chosen.items()}
        ran = _generate(job, (staging, blob), python, (genv, keys, reuse), hsa_dir)
        generated_sources(staging, job.module)  # refused before anything reaches the blob dir
        sync_dir(staging, blob)
        record = {
            "stamp": stamp_of(job, python),
            "runs_format": genruns.FORMAT,
            "runs": [r.to_json() for r in ran.runs],
            "given": sorted(k for k, _ in job.env),
            "commands": ran.commands,
            "warnings": ran.warnings,
            "groups": ran.groups,
        }
        atomic_write(stamp_file, json.dumps(record, indent=1).encode())
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    sources = generated_sources(blob, job.module)
    reused = tuple(r.command for i, r in enumerate(ran.runs) if i in reuse and r.ran)
    done = tuple(c for c in ran.commands if c not in reused)
    return GenResult(
        job.module,
        blob,
        sources,
        False,
        time.perf_counter() - start,
        done,
        tuple(ran.warnings),
        "\n".join(ran.output),
        _groups(blob, ran.groups, sources),
        reused,
    )


def run_keys(job: GenJob, python: str) -> list[str]:
    """Each generator command's key (:func:`qola.compile.genruns.run_key`)."""
    digests = dict(job.config_digests) or {
        c.name: hashlib.sha256(render(merge(c)).encode()).hexdigest() for c in job.configs
    }
    return [genruns.run_key(argv, job.env, digests) for argv in job.argvs(OUTPUT_DIR, python)]


def _kept(job: GenJob, blob: Path, runs: list[genruns.RunRecord]) -> GenResult:
    """``job``'s result when every one of its runs is reused (``runs``: in command order)."""
    sources = generated_sources(blob, job.module)
    warnings = tuple(w for r in runs for w in r.warnings)
    groups = _groups(blob, [list(r.group) for r in runs if r.ran], sources)
    reused = tuple(r.command for r in runs if r.ran)
    return GenResult(job.module, blob, sources, True, 0.0, warnings=warnings, groups=groups, reused=reused)


LEFTOVERS = (".rej", ".orig")  # what `patch` leaves beside a file it could not patch or revert cleanly
LEFTOVER_SCAN = 5000  # entries looked at under a generator's directory at most


def patch_leftovers(script: Path) -> list[str]:
    """Files under ``script``'s directory that a patch left behind (``*.rej``, ``*.orig``), relative to it."""
    top, found, seen = script.parent, [], 0
    for here, dirs, files in os.walk(top):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        seen += len(files) + len(dirs)
        found += [os.path.relpath(os.path.join(here, f), top) for f in sorted(files) if f.endswith(LEFTOVERS)]
        if seen > LEFTOVER_SCAN:
            break
    return found


def leftover_warning(module: str, script: Path) -> list[str]:
    """A warning when ``script``'s directory holds a patch's leftovers: the generator may run code a
    patch changed in part (ck-jit's ``full`` applies its codegen hints to CK's generator and leaves
    ``.rej``/``.orig`` files when a hunk does not apply or revert)."""
    left = patch_leftovers(script)
    if not left:
        return []
    shown = ", ".join(left[:5]) + (f" and {len(left) - 5} more" if len(left) > 5 else "")
    return [
        f"module {module}: beside generator {script} a patch left {shown}: the generator may run half-patched "
        f"code (see `git -C {script.parent} status`; restore the files and remove these, or apply the patch whole)"
    ]


@dataclass(frozen=True)
class _Ran:
    """What ``job``'s generators did in the staging dir: each command, each skip's warning, what each
    printed, the generated sources each wrote (relative to the staging dir), each one's run record."""

    commands: list[str]
    warnings: list[str]
    output: list[str]
    groups: list[list[str]]
    runs: list[genruns.RunRecord]


Reuse = tuple[GeneratorEnv, list[str], dict[int, genruns.RunRecord]]  # the env, each run's key, the runs reused


def _generate(
    job: GenJob, dirs: tuple[Path, Path], python: str, reuse: Reuse, hsa_dir: str | os.PathLike[str] | None
) -> _Ran:
    """Run ``job``'s generators in the staging dir (``dirs``: it, the blob dir), in order, or replay
    those reused (``reuse``: the environment they run under, ``QOLA_GENERATOR_TIMEOUT``, each
    command's key, the runs reused by index); an absent per-arch asm generator is skipped with a warning."""
    ran = _Ran([], [], [], [], [])
    genv, keys, reused = reuse
    limit = genv.timeout()
    staging, blob = dirs
    with pid_tempdir(LISTING_PREFIX) as records:  # pid in the name: a killed run's is removed later
        for i, argv in enumerate(job.argvs(str(staging), python)):
            before = genruns.snapshot(staging)
            if i in reused:
                genruns.replay(reused[i], blob, staging)
                _note(ran, replace(reused[i], key=keys[i]), before, staging)
                ran.output.append(f"$ {shlex.join(argv)}\n(reused: what it read is unchanged)")
                continue
            run = (argv, os.path.join(records, f"reads-{i}.json"), keys[i])
            _note(ran, _generate_one(job, run, (staging, genv, limit), hsa_dir, ran), before, staging)
    # each run's files as the last run left them: what the blob dir will hold, checked before a reuse
    ran.runs[:] = [replace(r, sums=gensums.sums(staging, r.wrote)) for r in ran.runs]
    return ran


def _note(ran: _Ran, run: genruns.RunRecord, before: genruns.Snapshot, staging: Path) -> None:
    """Add ``run`` to ``ran`` with what it did in ``staging`` since ``before``."""
    wrote, removed, new = genruns.changes(before, genruns.snapshot(staging))
    ran.runs.append(replace(run, wrote=wrote, removed=removed, group=new))
    ran.warnings.extend(run.warnings)
    if run.ran:
        ran.commands.append(run.command)
        ran.groups.append(list(new))  # what this generator wrote: its files' archs


def _generate_one(
    job: GenJob,
    run: tuple[list[str], str, str],
    where: tuple[Path, GeneratorEnv, float | None],
    hsa_dir: str | os.PathLike[str] | None,
    ran: _Ran,
) -> genruns.RunRecord:
    """Run one of ``job``'s generators (``run``: its argv, where its read record goes, its key); its
    run record, what it did in the staging dir still to note."""
    argv, record, key = run
    staging, genv, limit = where
    script = argv[1] if len(argv) > 1 else ""
    arch = asm_arch(script, hsa_dir)
    if arch and not Path(script).exists():
        return genruns.RunRecord(
            key, " ".join(argv), genread.absent(script), warnings=(skip_warning(job.module, script, arch),), ran=False
        )
    if not Path(script).exists():
        raise QolaError(
            f"module {job.module}: generator script {script} does not exist",
            hint="check blob_gen_cmd in the module table or the manifest",
        )
    warnings = tuple(leftover_warning(job.module, Path(script)))
    done = _run_one(job.module, (argv, record), staging, genv, limit)
    printed = (done.stdout or "").rstrip("\n")
    shown = f"{printed}\n" if printed else ""
    ran.output.append(f"$ {shlex.join(argv)}\n{shown}(exit code {done.returncode})")
    deps = genread.collect(record, env=genv.child.as_dict(), exclude=[str(staging), os.path.dirname(record)])
    read_out = genread.read_under(record, str(staging))
    return genruns.RunRecord(key, " ".join(argv), deps, read_out=read_out, warnings=warnings)


def _run_one(
    module: str, run: tuple[list[str], str], staging: Path, genv: GeneratorEnv, limit: float | None
) -> proc.CompletedProcess[str]:
    """Run one generator (``run``: its argv, the interpreter first; where its read record goes) in
    ``staging``, under qola's recorder (:mod:`qola.plan.genread`). Its own process group, ended with qola
    (Ctrl-C, SIGTERM, qola killed) or past its deadline; what it prints is kept for the log, cut in the
    middle past proc.LOG_KEEP bytes (:mod:`qola.core.proc`)."""
    argv, record = run
    try:
        done = proc.run_checked(
            genread.argv(argv[0], record, argv[1:]), cwd=staging, env=genv.child, timeout=limit, out=proc.FOR_LOG
        )
    except FailedProcessError as exc:
        timed_out = exc.returncode == 124
        more = f" (or raise {deadlines.GENERATOR.variable}, now {deadlines.shown(limit)})" if timed_out else ""
        hint = missing_package_hint(exc.output, argv[0]) or (
            f"module {module}: its generator failed; fix the command or the generator{more}"
        )
        # the generator's own command, not the recorder's around it
        raise FailedProcessError(argv, exc.returncode, exc.output, hint, reason=exc.reason) from None
    return done


def _groups(blob: Path, recorded: object, sources: tuple[str, ...]) -> tuple[tuple[str, ...], ...]:
    """Each generator's sources as paths in ``blob`` (``recorded``: their names, from the run or its
    stamp); () when the stamp has none (written before qola recorded them) or names a file not there."""
    if not isinstance(recorded, list) or not all(isinstance(g, list) for g in recorded):
        return ()
    have = set(sources)
    out = tuple(tuple(str(blob / n) for n in g if isinstance(n, str)) for g in recorded)
    return out if all(p in have for g in out for p in g) else ()


def clean_stale(gen_root: Path) -> list[Path]:
    """Remove the staging dirs that killed runs left in ``gen_root/<module>/`` (owner pid gone);
    the paths removed."""
    gone: list[Path] = []
    try:
        mods = sorted(p for p in Path(gen_root).iterdir() if p.is_dir() and not p.is_symlink())
    except OSError:
        return gone
    for mod_dir in mods:
        for prefix in STAGING_PREFIXES:
            gone += remove_stale(mod_dir, prefix)
    return gone
