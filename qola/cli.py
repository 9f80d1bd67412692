"""Command-line entry point: parse arguments, dispatch, turn errors into exit codes.

Each subcommand lives in ``qola.commands.<name>`` and provides
``register(subparsers)`` (adds its parser, sets ``func``) — this file only wires
them together and owns error reporting.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import importlib
import importlib.util
import io
import os
import signal
import sys
import traceback
from collections.abc import Sequence

from qola import __version__
from qola.core import knobs, proc
from qola.core.errors import EXIT_USER, QolaError

# subcommand name -> module under qola.commands (imported lazily, in this order)
COMMANDS = ("plan", "build", "checkout", "package", "variants", "embed", "jit", "cache", "usage", "audit", "doctor")


def _wanted(argv: Sequence[str]) -> tuple[str, ...]:
    """The subcommand named in ``argv`` (only it is imported: start-up stays fast), else all of them."""
    first = next((a for a in argv if not a.startswith("-")), None)
    return (first,) if first in COMMANDS else COMMANDS


def _parser(names: Sequence[str] = COMMANDS) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="qola",
        description="Build JIT-first GPU kernel libraries (AITER layout) ahead of time from a TOML manifest.",
    )
    parser.add_argument("--version", action="version", version=f"qola {__version__}")
    parser.add_argument("--debug", action="store_true", help="show a traceback on errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in names:
        try:
            module = importlib.import_module(f"qola.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"qola.commands.{name}":
                continue  # subcommand not part of this build
            raise
        module.register(sub)
    return parser


# qola's third-party imports -> the requirement that provides each (pyproject.toml's dependencies;
# tests/clients/test_cli_compat.py keeps the two in step): a missing one is one line, not a traceback
DEPENDENCIES = {
    "ninja": "ninja>=1.11",
    "ninja_syntax": "ninja>=1.11",
    "elftools": "pyelftools>=0.30",
    "rich": "rich>=13",
    "pydantic": "pydantic>=2.5",
    "pydantic_core": "pydantic>=2.5",
    "pybind11": "pybind11>=2.11",
    "tomli": "tomli>=2",
}


def missing_dependency(exc: ModuleNotFoundError) -> str | None:
    """The one-line message for a qola dependency this interpreter lacks (None: not one of qola's)."""
    top = (exc.name or "").partition(".")[0]
    req = DEPENDENCIES.get(top)
    if req is None:
        return None
    return (
        f"error: qola needs the Python package {req.split('>')[0]!r}, which {sys.executable} cannot "
        f"import; install it with: {sys.executable} -m pip install '{req}'"
    )


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a finder that refuses it, a broken parent package
        return False


EVERY = ("pydantic", "ninja", "rich", "pybind11", "elftools")
# what a command needs beyond the standard library where it is not EVERY: `checkout` runs on
# Transformer Engine's build requirements (ninja, pybind11), as TE's CMake calls it before anything else
COMMAND_NEEDS: dict[str, tuple[str, ...]] = {"checkout": ()}


def missing_dependencies(command: str | None = None) -> str | None:
    """Every dependency of qola ``command`` needs that this interpreter cannot import, in one
    message with one pip command and the requirement lines a project adds (None: none missing). A
    lookup, not an import: the no-op path stays fast."""
    tops = COMMAND_NEEDS.get(command or "", EVERY) + (("tomli",) if sys.version_info < (3, 11) else ())
    missing = [DEPENDENCIES[t] for t in tops if not _importable(t)]
    if not missing:
        return None
    names = ", ".join(req.split(">")[0] for req in missing)
    reqs = " ".join(f"'{req}'" for req in missing)
    return (
        f"error: qola needs the Python package(s) {names}, which {sys.executable} cannot import\n"
        f"hint: install them with: {sys.executable} -m pip install {reqs}\n"
        f"hint: a project that builds through qola (Transformer Engine's pyproject.toml [build-system] "
        f"requires) adds these lines: {', '.join(repr(r) for r in missing)}"
    )


STREAMS = ((0, "stdin", os.O_RDONLY), (1, "stdout", os.O_WRONLY), (2, "stderr", os.O_WRONLY))


class Diagnostics(io.TextIOWrapper):
    """``sys.stderr`` as qola writes it: messages and progress only. A write the fd refuses (a full
    disk, ``2>/dev/full``, an unwritable pipe) is dropped, and the command does its work and exits as
    that work went: there is no other channel to say so on. (stdout is a command's product: a failed
    write there is an error, said on stderr.)"""

    def write(self, s: str) -> int:
        try:
            return super().write(s)
        except OSError:
            return len(s)

    def flush(self) -> None:
        with contextlib.suppress(OSError):
            super().flush()


def standard_streams() -> None:
    """Each of fds 0-2 that the caller closed (``qola plan >&-``, a service manager's job) is opened on
    /dev/null and its ``sys`` stream made again, before anything runs: Python leaves ``sys.stdout``
    None for a closed fd (a ``.flush()`` or ``.write()`` on it was a traceback), and a file qola or a
    child opens next would take the free number and receive what is printed. The one place every
    command passes; nothing else in qola checks for a missing stream."""
    for fd, name, mode in STREAMS:
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, mode)
            if null != fd:  # the lowest free number is fd itself unless a lower one is closed too
                os.dup2(null, fd)
                os.close(null)
        if getattr(sys, name) is None:
            setattr(sys, name, open(fd, "r" if fd == 0 else "w", closefd=False, encoding="utf-8", errors="replace"))  # noqa: SIM115
    if not isinstance(sys.stderr, Diagnostics) and getattr(sys.stderr, "fileno", None) is not None:
        try:
            fd = sys.stderr.fileno()
        except (OSError, ValueError):  # a replaced stream without an fd (an embedding caller's): kept
            return
        sys.stderr.flush()
        raw = io.FileIO(fd, "w", closefd=False)
        sys.stderr = Diagnostics(raw, encoding=sys.stderr.encoding, errors="backslashreplace", line_buffering=True)


def main(argv: Sequence[str] | None = None) -> int:
    standard_streams()
    words = sys.argv[1:] if argv is None else argv
    command = next((a for a in words if not a.startswith("-")), None)
    if command in COMMANDS:  # a command will run: check first
        line = missing_dependencies(command)
        if line is not None:
            print(line, file=sys.stderr)
            return EXIT_USER
    try:
        code = _main(argv)
        sys.stdout.flush()  # a reader that went away (`| head`) is noticed here, not at exit
        return code
    except BrokenPipeError:
        return _reader_gone()
    except ModuleNotFoundError as exc:
        line = missing_dependency(exc)
        if line is None:
            raise
        print(line, file=sys.stderr)
        return EXIT_USER


def undecodable(argv: Sequence[str]) -> str | None:
    """The message for the first argument that is not valid UTF-8 (Python carries such bytes as
    surrogate escapes; paths qola writes into build files, records and logs must be text)."""
    for i, arg in enumerate(argv, 1):
        bad = next((c for c in arg if "\udc80" <= c <= "\udcff"), None)
        if bad is not None:
            shown = arg.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
            return (
                f"error: argument {i} ('{shown}') is not valid UTF-8 (byte 0x{ord(bad) - 0xDC00:02x})\n"
                "hint: qola writes paths into build files, manifest.json and logs as UTF-8 text: rename the "
                "file or directory, or use a path without that byte"
            )
    return None


def _main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    bad = undecodable(argv)
    if bad is not None:
        print(bad, file=sys.stderr)
        return EXIT_USER
    parser = _parser(_wanted(argv))
    args = parser.parse_args(argv)
    args.argv = argv  # the command line as given (the build's no-op record keys on it)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    args.debug = getattr(args, "debug", False)
    try:
        # Ctrl-C, SIGTERM, SIGHUP: every child process group qola started is ended, then we exit here
        with proc.signals_end_children():
            # every QOLA_* knob, before any work (issue 41 item 6)
            knobs.check_environment({k: v for k, v in os.environ.items() if k.startswith(knobs.PREFIX)})
            _check_cwd()
            return int(args.func(args) or 0)
    except QolaError as exc:
        if args.debug:
            traceback.print_exc()
        print(exc.render(), file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt as exc:
        code = exc.exit_code if isinstance(exc, proc.Interrupted) else 130
        print("interrupted" if code == 130 else f"terminated (signal {code - 128})", file=sys.stderr)
        return code
    except (
        UnicodeDecodeError,
        UnicodeEncodeError,
        UnicodeTranslateError,
    ) as exc:  # a name from the environment or a tree that is not UTF-8: one line
        if args.debug:
            traceback.print_exc()
        print(
            f"error: text that is not valid UTF-8 ({exc.reason}): {exc.object[exc.start : exc.end]!r}"
            + ("" if args.debug else " (--debug shows the traceback)"),
            file=sys.stderr,
        )
        return EXIT_USER
    except BrokenPipeError:  # `qola … | head`: the reader has what it wanted
        return _reader_gone()
    except (OSError, RecursionError, MemoryError) as exc:  # last resort: one line, no traceback
        if args.debug:
            traceback.print_exc()
        print(f"error: {last_resort(exc)}" + ("" if args.debug else " (--debug shows the traceback)"), file=sys.stderr)
        return EXIT_USER


def _check_cwd() -> None:
    """Refuse, before any work, a working directory that was deleted: every relative path (and Python's
    own) would fail later with a bare ENOENT, after a build dir was made."""
    try:
        os.getcwd()
    except FileNotFoundError:
        where = os.environ.get("PWD") or "(the shell's $PWD is not set)"
        raise QolaError(
            f"the working directory {where} no longer exists (deleted after the shell entered it)",
            hint="cd to a directory that exists and run the command again",
        ) from None


def _reader_gone() -> int:
    """stdout's reader closed the pipe (``| head``): exit quietly, as a command killed by SIGPIPE
    would (141), with stdout pointed at /dev/null so that the interpreter's last flush says nothing."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass
    return 128 + signal.SIGPIPE


def last_resort(exc: BaseException) -> str:
    """One line for an error nothing more specific caught: the path(s) and errno of an OSError."""
    if isinstance(exc, OSError):
        name = errno.errorcode.get(exc.errno or 0, "")
        what = exc.strerror or str(exc) or type(exc).__name__
        paths = " -> ".join(repr(str(p)) for p in (exc.filename, exc.filename2) if p is not None)
        code = f" (errno {exc.errno}{', ' + name if name else ''})" if exc.errno else ""
        return f"{what}{': ' + paths if paths else ''}{code}"
    if isinstance(exc, RecursionError):
        return f"input nested too deeply for qola to process ({exc})"
    return "out of memory (an input is far larger than expected)"


if __name__ == "__main__":  # python -m qola.cli
    raise SystemExit(main())
