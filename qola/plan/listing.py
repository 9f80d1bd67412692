"""Listing a generator's instances (``--list_blobs``), cached by content (:mod:`qola.plan.listcache`),
and the names that read a listing: the CK filter shim, a generator's flavor, the ``*_api`` stem.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from qola.core import deadlines, inputs
from qola.core import proc as runner
from qola.core.errors import QolaError
from qola.core.fsutil import pid_tempdir
from qola.plan import genread, genrules, listcache
from qola.plan.model import OUTPUT_DIR, Generator, Plan
from qola.plan.registry import genwrap_script

ARCH_SUFFIX = re.compile(r"_gfx[0-9a-z]+$")  # CK's per-arch filename_suffix (not part of the kernel name)
ANY_CK, ANY_PLAIN, NOT = "|", ",", "!"  # the shim's any-of separator; a "!" part excludes what it matches


def shim() -> Path:
    """The wrapper that lets CK's generate.py take a `|`-separated filter (any of)."""
    return genwrap_script("filter_any.py")


def flavor_of(gen: Generator) -> str:
    return genrules.flavor_of(gen.script)


@dataclass(frozen=True)
class GeneratorEnv(runner.TimedEnv):
    """What listing a generator's instances reads of the build's environment, resolved once: the
    environment it runs under (opaque), ``QOLA_GENERATOR_TIMEOUT`` as set (checked when a
    generator first runs, :mod:`qola.core.deadlines`), and the variables the plan gives every
    generator (:meth:`for_plan`: the generation gets the same, :func:`qola.plan.genrules.aiter_env`)."""

    KNOB = deadlines.GENERATOR
    listings: str | None = None  # where listings are cached (qola.plan.listcache); None: not cached
    given: tuple[tuple[str, str], ...] = ()  # set over ``child`` for each listing (for_plan)
    place: genread.Place | None = None  # where the plan's tree lies (for_plan): listings kept by place

    def for_plan(self, plan: Plan) -> GeneratorEnv:
        """This view with the variables ``plan``'s generators get at generation (its archs, its asm
        dir): a listing sees exactly the environment its generation will."""
        given = tuple(sorted(genrules.aiter_env(plan.archs, plan.meta_dir).items()))
        return replace(self, given=given, place=genread.Place.of(plan.tree_root))

    def run_env(self) -> runner.ChildEnv:
        """The environment a listing runs under."""
        return self.child.plus(dict(self.given))

    @classmethod
    def of(cls, env: Mapping[str, str] | runner.TimedEnv) -> GeneratorEnv:
        """The view of ``env``: a mapping's children environment, deadline and listing cache."""
        if isinstance(env, GeneratorEnv):
            return env
        assert isinstance(env, Mapping), f"GeneratorEnv.of: a mapping or a GeneratorEnv, not {type(env).__name__}"
        return cls(runner.ChildEnv.of(env), env.get(cls.KNOB.variable), listcache.cache_dir(env))


GenEnv = Mapping[str, str] | GeneratorEnv  # a test's mapping, or the build's resolved view


def list_blobs(gen: Generator, env: GenEnv, filt: str | None = None, python: str = sys.executable) -> list[str]:
    """File stems the generator would write (``--list_blobs``), optionally under ``filt``. Run under
    qola's recorder (:mod:`qola.plan.genread`) and cached (:mod:`qola.plan.listcache`) by what it read
    when ``env`` names a cache dir, one run at a time per key (:func:`qola.plan.listcache.single_flight`).
    ``env``: the plan's view (:meth:`GeneratorEnv.for_plan`)."""
    genv = GeneratorEnv.of(env)
    extra = ["--filter", filt] if filt else []
    wrap = [str(shim())] if filt and ANY_CK in filt else []
    template = [python, *wrap, *gen.argv, "--list_blobs", "<listing>", *extra]  # the key's: no temp path
    key = listcache.key_of(template, genv.place) if genv.listings else None
    if key is None or genv.listings is None:
        return _listed(gen, genv, [python, *wrap], extra)[0]
    with listcache.single_flight(genv.listings, key, gen.command):
        found = listcache.load(genv.listings, key, genv.run_env().as_dict(), genv.place)
        if found is not None:
            return found
        stems, deps = _listed(gen, genv, [python, *wrap], extra, keep=True)
        if deps is not None:
            listcache.store(genv.listings, key, stems, deps, genv.place)
        return stems


def _listed(
    gen: Generator, genv: GeneratorEnv, head: list[str], extra: list[str], *, keep: bool = False
) -> tuple[list[str], genread.Deps | None]:
    """Run the generator's listing (``head``: the interpreter and the filter shim, if any): its stems
    and, with ``keep`` (a listing to cache), what it read (the tree held by ``genv``'s place)."""
    child = genv.run_env()
    with pid_tempdir("qola-list-") as tmp:  # pid in the name: a killed run's is removed later
        out, record = Path(tmp) / "blobs.txt", os.path.join(tmp, "reads.json")
        argv = [a.replace(OUTPUT_DIR, str(Path(tmp) / "out")) for a in gen.argv]
        cmd = genread.argv(head[0], record, [*head[1:], *argv, "--list_blobs", str(out), *extra])
        limit = genv.timeout()
        try:  # under the generators' deadline; its output only shown: cut past proc.LOG_KEEP, never held whole
            done = runner.run(cmd, cwd=tmp, env=child, timeout=limit, out=runner.FOR_LOG)
        except OSError as exc:
            raise QolaError(f"cannot run `{gen.command}` to list its instances: {exc.strerror}") from None
        except runner.TimeoutExpired as exc:
            raise QolaError(
                f"listing the instances of `{gen.command}` failed ({runner.why_ended(exc)})",
                hint=f"fix the generator, or raise {deadlines.GENERATOR.variable}",
            ) from None
        if done.returncode != 0 or not out.is_file():
            raise QolaError(
                f"listing the instances of `{gen.command}` failed (exit {done.returncode}):\n"
                f"    {done.stdout.strip()[-2000:]}",
                hint="run the generator by hand with --list_blobs",
            )
        listing = inputs.read_checked(out, limit=inputs.MAX_RECORD, what="generator listing").decode()
        stems = [Path(line.strip()).stem for line in listing.splitlines() if line.strip()]
        deps = genread.collect(record, env=child.as_dict(), exclude=[tmp], place=genv.place) if keep else None
    return stems, deps


def is_api(stem: str) -> bool:  # CK's fmha_*_api.cpp, the example's attn_fwd_api.cu
    return stem.endswith("_api")


def kernel_name(stem: str, flavor: str) -> str:
    return ARCH_SUFFIX.sub("", stem) if flavor == "ck" else stem
