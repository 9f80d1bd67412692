"""Link steps that isolate a module's symbols: version scripts, shared and static links.

Shared: ``<linker> -shared`` with a generated version script that exports only
``qola::<ns>::…`` and ``<ns>_…`` (see :class:`qola.compile.elf.ExportRule`) — ``local: *`` hides the rest,
so a second copy of the same library (another namespace) never interposes.

Static (an archive has no version script), :func:`static_archive_steps`:

1. ``ld -r --force-group-allocation`` of all the module's objects (``@rsp``) into one relocatable
   object. ``--force-group-allocation`` dissolves COMDAT groups: without it the localised inline
   functions / template instantiations of two copies share a group signature, the final link keeps
   one group and the other copy's now-local references end in "defined in discarded section";
2. ``python -m qola.compile.link localize``: reads that object (pyelftools), writes every defined
   global / weak / GNU-unique symbol outside the allowed set to a list and rebinds the unique ones
   (``u``, g++'s inline-function statics) to GLOBAL in place — objcopy cannot localise
   STB_GNU_UNIQUE, and a left-over unique symbol silently merges the two copies' statics; then
   ``objcopy --localize-symbols=LIST`` (explicit list, not ``--keep-global-symbols``: an empty keep
   list localises nothing). An empty list (every global is an export) skips objcopy, which exits 1
   on one without a word: the object is the member as it is;
3. ``ar rcsD`` of the single ``<name>.o`` (deterministic: zero timestamps/uids).

``isolate=False`` (debugging) skips the version script / step 2 and the group dissolution.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from qola.compile.elf import ExportRule, demangle
from qola.core import deadlines, proc
from qola.core.errors import QolaError
from qola.core.fsutil import atomic_copy, inside, write_if_changed  # write_if_changed: callers import it from here too
from qola.core.selfrun import module_argv

_RSP_SPECIAL = set(" \t\n\r\v\f'\"\\")


def version_script(namespace: str, c_prefix: str | None = None, extra: Iterable[str] = ()) -> str:
    """The linker version script exporting exactly :class:`ExportRule`'s set. Inside
    ``extern "C++"`` the pattern is unquoted: a quoted one is literal and matches nothing."""
    rule = ExportRule(namespace, c_prefix, tuple(extra))
    mangled = "\n".join(f"    {p}*;" for p in rule.mangled_prefixes)
    extras = "".join(f"    {name};\n" for name in sorted(rule.extra))
    return (
        f"/* qola: exports of namespace {namespace} - generated, do not edit */\n"
        "{\n"
        "  global:\n"
        '    extern "C++" {\n'
        f"      {rule.cxx_prefix}*;\n"
        "    };\n"
        "    /* vtables, VTTs, typeinfo (+ names) and templates whose demangled name starts with\n"
        "       their return type: by mangled prefix */\n"
        f"{mangled}\n"
        f"    {rule.prefix}*;\n"
        f"{extras}"
        "  local:\n"
        "    *;\n"
        "};\n"
    )


def rsp_text(paths: Iterable[str | os.PathLike[str]]) -> str:
    """A response file (``@file``) for GNU ld / gcc / ar: one argument a line, special characters
    backslash-escaped (libiberty's rules)."""

    def esc(arg: str) -> str:
        return "".join("\\" + c if c in _RSP_SPECIAL else c for c in arg)

    return "".join(esc(os.fspath(p)) + "\n" for p in paths)


BUILD_ID = "-Wl,--build-id=sha1"  # every shared object: a content hash note (reproducible, debuginfod)
NO_UNDEFINED = "-Wl,--no-undefined"
GC_SECTIONS = "-Wl,--gc-sections"  # sections no export reaches are dropped (AITER's flags: -ffunction-sections)


def shared_link_argv(
    linker: str,
    objs_rsp: str | os.PathLike[str],
    out: str | os.PathLike[str],
    ldflags: Sequence[str],
    runtime_libs: Sequence[str] = (),
) -> list[str]:
    """The one shared-link command (:meth:`qola.toolchain.Toolchain.shared_link_argv` is this with
    the toolchain's host compiler and GPU runtime): ``<linker> -shared @objs -o out``, a build-id
    note, then ``ldflags`` (per module: :func:`library_ldflags` / :func:`python_module_ldflags`
    and the table's) and ``runtime_libs`` last, after the objects that need them."""
    rsp = os.fspath(objs_rsp)
    return [
        linker,
        "-shared",
        rsp if rsp.startswith("@") else "@" + rsp,
        "-o",
        os.fspath(out),
        BUILD_ID,
        *ldflags,
        *runtime_libs,
    ]


def library_ldflags(version_script: str | os.PathLike[str] | None, soname: str) -> list[str]:
    """Link flags of a torch-free shared library (a cpp_itfs module): ``--no-undefined`` — every
    symbol is defined in its objects or comes from a library it names (the GPU runtime, ``-ldl``),
    so it carries DT_NEEDED for it and a missing symbol fails this link, not the consumer's dlopen —
    ``--gc-sections`` (what no export, constructor or kept section reaches is dropped: a dropped
    direction's dispatch, AITER API functions no wrapper calls; a reference from dropped code is no
    longer an undefined symbol, one from kept code still fails the link), its soname and, isolated
    (``version_script`` not None), the export version script."""
    flags = [NO_UNDEFINED, GC_SECTIONS, f"-Wl,-soname,{soname}"]
    if version_script is not None:
        flags.append(f"-Wl,--version-script={os.fspath(version_script)}")
    return flags


def python_module_ldflags(version_script: str | os.PathLike[str] | None) -> list[str]:
    """Link flags of a Python extension module: no ``--no-undefined`` (libpython's symbols are
    the interpreter's, resolved at import); isolated, a version script exporting PyInit_* only."""
    return [] if version_script is None else [f"-Wl,--version-script={os.fspath(version_script)}"]


@dataclass(frozen=True)
class BinTools:
    """Programs of the static steps (GNU binutils on PATH by default; lld's ``ld.lld -r`` also
    supports ``--force-group-allocation`` since LLVM 17)."""

    ld: str = "ld"
    objcopy: str = "objcopy"
    ar: str = "ar"
    python: str = field(default_factory=lambda: sys.executable)


def _stem(out: Path) -> str:
    name = Path(out).name
    for suffix in (".a", ".lib"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


@dataclass(frozen=True)
class Archiving:
    """How a static archive is made: ``isolate`` (steps 2-3 and the group dissolution; False:
    debugging), the export rule's ``c_prefix`` and ``extra`` names, ``localize_hidden`` (with
    ``isolate``: every hidden symbol made local too, objcopy ``--localize-hidden``) and
    ``discard_locals`` (the objects' local symbols dropped in the partial link, ``ld -r
    --discard-all``: relocations keep section symbols, as the toolchain's shared link does)."""

    isolate: bool = True
    c_prefix: str | None = None
    extra: tuple[str, ...] = ()
    localize_hidden: bool = False
    discard_locals: bool = False


def static_archive_steps(
    objs: Sequence[Path],
    out: Path,
    namespace: str,
    work_dir: Path,
    *,
    tools: BinTools | None = None,
    how: Archiving = Archiving(),
) -> list[list[str]]:
    """The commands that turn ``objs`` into the isolated archive ``out`` (run them in order); the
    object list ``work_dir/<stem>.objs.rsp`` they read is written now (only when it changes)."""
    steps, rsp, text = archive_steps(objs, out, namespace, work_dir, tools=tools, how=how)
    write_if_changed(rsp, text)
    return steps


def archive_steps(
    objs: Sequence[Path],
    out: Path,
    namespace: str,
    work_dir: Path,
    *,
    tools: BinTools | None = None,
    how: Archiving = Archiving(),
) -> tuple[list[list[str]], Path, str]:
    """(commands, path of the object list they read, its text): nothing is written.

    The commands write every other file: ``<stem>.r.o`` (partial link), ``<stem>.localize`` (symbol
    list), ``<stem>.o`` (the archive's one member). ``ar r`` replaces that member in an existing
    ``out``; remove ``out`` first if it may hold anything else."""
    tools = tools or BinTools()
    rule = ExportRule(namespace, how.c_prefix, how.extra)
    if not objs:
        raise QolaError(f"no objects to archive into {out}")
    work = Path(work_dir)
    stem = _stem(out)
    rsp = inside(work, f"{stem}.objs.rsp")
    partial, member = inside(work, f"{stem}.r.o"), inside(work, f"{stem}.o")
    relink = (
        [tools.ld, "-r"]
        + (["--force-group-allocation"] if how.isolate else [])
        + (["--discard-all"] if how.discard_locals else [])
    )
    steps = [[*relink, "-o", os.fspath(partial if how.isolate else member), f"@{rsp}"]]
    if how.isolate:
        symlist = inside(work, f"{stem}.localize")
        ask = [*module_argv(tools.python, "qola.compile.link"), "localize", "--namespace", rule.namespace]
        if how.c_prefix is not None:
            ask += ["--c-prefix", how.c_prefix]
        for name in rule.extra:
            ask += ["--extra", name]
        ask += ["--objcopy", tools.objcopy] + (["--localize-hidden"] if how.localize_hidden else [])
        steps.append([*ask, os.fspath(partial), os.fspath(symlist), os.fspath(member)])
    steps.append([tools.ar, "rcsD", os.fspath(out), os.fspath(member)])
    return steps, rsp, rsp_text(objs)


def localize_list(
    obj: Path, namespace: str, out_list: Path, *, c_prefix: str | None = None, extra: Iterable[str] = ()
) -> list[str]:
    """Step 2: write the defined globals of relocatable ``obj`` that must become local to
    ``out_list`` (one a line) and rebind such GNU-unique symbols to GLOBAL in ``obj``."""
    from elftools.elf.elffile import ELFFile
    from elftools.elf.sections import SymbolTableSection

    rule = ExportRule(namespace, c_prefix, tuple(extra))
    obj = Path(obj)
    with obj.open("r+b") as f:
        elf = ELFFile(f)
        if elf["e_type"] != "ET_REL":
            raise QolaError(f"{obj} is not a relocatable object")
        table = elf.get_section_by_name(".symtab")
        found: list[tuple[int, str, str]] = []  # (index, name, bind)
        for i, sym in enumerate(table.iter_symbols() if isinstance(table, SymbolTableSection) else ()):
            bind = sym["st_info"]["bind"]
            if (
                bind in ("STB_GLOBAL", "STB_WEAK", "STB_LOOS", "STB_GNU_UNIQUE")
                and sym.name
                and sym["st_shndx"] != "SHN_UNDEF"
            ):
                found.append((i, sym.name, bind))
        names = demangle([name for _, name, _ in found])
        hide = [
            (i, name, bind) for (i, name, bind), dem in zip(found, names, strict=False) if not rule.allows(name, dem)
        ]
        if table is not None:
            base, size = table["sh_offset"], table["sh_entsize"]
            info_at = 4 if elf.elfclass == 64 else 12  # st_info within Elf64_Sym / Elf32_Sym
            for i, _, bind in hide:
                if bind in ("STB_LOOS", "STB_GNU_UNIQUE"):
                    f.seek(base + i * size + info_at)
                    info = f.read(1)[0]
                    f.seek(base + i * size + info_at)
                    f.write(bytes([(1 << 4) | (info & 0xF)]))  # STB_GLOBAL, same type
    listed = sorted({name for _, name, _ in hide})
    write_if_changed(Path(out_list), "".join(n + "\n" for n in listed))
    return listed


def localize(obj: Path, symlist: Path, member: Path, rule: ExportRule, *, objcopy: str, hidden: bool) -> list[str]:
    """Step 2: :func:`localize_list`, then ``member`` made from ``obj`` by ``objcopy`` with those symbols
    (and with ``hidden`` every hidden one) local; with nothing to make local, a copy of ``obj``
    (objcopy exits 1 on an empty ``--localize-symbols`` list, without a message)."""
    listed = localize_list(obj, rule.namespace, symlist, c_prefix=rule.c_prefix, extra=rule.extra)
    flags = (["--localize-hidden"] if hidden else []) + ([f"--localize-symbols={symlist}"] if listed else [])
    if flags:
        run_step([objcopy, *flags, os.fspath(obj), os.fspath(member)])
    else:
        atomic_copy(obj, member)
    return listed


def run_step(cmd: Sequence[str], cwd: Path | None = None) -> str:
    """Run one step, output captured; FailedProcessError when it fails (:func:`qola.core.proc.run_checked`)."""
    return str(proc.run_checked(cmd, cwd=cwd, timeout=deadlines.COMPILE).stdout)


def run_static(
    objs: Sequence[Path],
    out: Path,
    namespace: str,
    work_dir: Path,
    *,
    tools: BinTools | None = None,
    how: Archiving = Archiving(),
) -> Path:
    """Run :func:`static_archive_steps` (a fresh ``out``); returns ``out``."""
    out = Path(out)
    steps = static_archive_steps(objs, out, namespace, work_dir, tools=tools, how=how)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.unlink(missing_ok=True)
    for cmd in steps:
        run_step(cmd)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m qola.compile.link localize --namespace NS --objcopy PROG OBJ LIST MEMBER`` (step 2 of the
    static link)."""
    parser = argparse.ArgumentParser(prog="python -m qola.compile.link")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("localize", help="write the symbols to localise, rebind unique ones, make them local")
    p.add_argument("--namespace", required=True)
    p.add_argument("--c-prefix")
    p.add_argument("--extra", action="append", default=[])
    p.add_argument("--objcopy", default="objcopy")
    p.add_argument("--localize-hidden", action="store_true")
    p.add_argument("obj", type=Path)
    p.add_argument("out_list", type=Path)
    p.add_argument("member", type=Path)
    args = parser.parse_args(argv)
    try:
        rule = ExportRule(args.namespace, args.c_prefix, tuple(args.extra))
        localize(args.obj, args.out_list, args.member, rule, objcopy=args.objcopy, hidden=args.localize_hidden)
    except (QolaError, OSError) as exc:
        print(exc.render() if isinstance(exc, QolaError) else f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
