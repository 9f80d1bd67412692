"""How far the build's settings travel (issue 24): follow them from the CLI to the compile step.

Runs ``qola build`` (the command line's own entry, in this process) on the bundled example tree under
a profiler and records every call into a qola function that receives the build's settings: the
command's arguments, the :class:`BuildSpec`, the resolved :class:`Settings`, the raw environment (a
mapping holding ``PATH``), or any dataclass holding one of those (two levels down: the stage-0
:class:`~qola.pipeline.spec.Start`, which keeps the environment, the stage-1
:class:`~qola.pipeline.spec.Resolved`, the pipeline's ``Ready``). The typed views a stage gets
instead (``ToolchainEnv``, ``ChildEnv``, ``GeneratorEnv``, ``GitEnv``, ``RecordedEnv``, a dict of a
few variables) are not settings: they hold only what that stage reads. The files of those calls, in
order (a repeat of the file just left is one step), give:

* files: how many distinct files the settings enter;
* steps: how many times they move into a file;
* back: how many of those steps go back into a file already left (and the share of steps).

It stops at the first call into the compile step (``compile_graph``), as the issue's measure does.

    python bench/settings_path.py [--arch sm_90] [--show]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from qola import cli  # noqa: E402
from qola.pipeline.spec import BuildSpec, Settings  # noqa: E402

PKG = str(REPO / "qola")
STOP = "compile_graph"


class Done(Exception):
    pass


def carries_settings(value: object, depth: int = 0) -> bool:
    if isinstance(value, (BuildSpec, Settings, argparse.Namespace)):
        return True
    if isinstance(value, Mapping):  # the raw environment (a copy, a read-only proxy)
        return "PATH" in value and len(value) > 3
    if depth < 2 and dataclasses.is_dataclass(value) and not isinstance(value, type):
        return any(carries_settings(getattr(value, f.name, None), depth + 1) for f in dataclasses.fields(value))
    return False


def follow(argv: list[str]) -> list[tuple[str, str]]:
    calls: list[tuple[str, str]] = []

    def profile(frame, event, arg):
        if event != "call":
            return
        code = frame.f_code
        if not code.co_filename.startswith(PKG):
            return
        if code.co_name == STOP:
            calls.append((code.co_filename, code.co_name))
            raise Done
        args = [frame.f_locals.get(n) for n in code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]]
        if any(carries_settings(a) for a in args):
            calls.append((code.co_filename, code.co_name))

    sys.setprofile(profile)
    try:
        cli.main(argv)
    except Done:
        pass
    finally:
        sys.setprofile(None)
    return calls


def measure(calls: list[tuple[str, str]]) -> tuple[int, int, int, list[str]]:
    files = [f for f, _ in calls]
    seq = [f for i, f in enumerate(files) if i == 0 or files[i - 1] != f]
    seen: set[str] = set()
    back = 0
    for f in seq:
        back += f in seen
        seen.add(f)
    return len(seen), len(seq), back, seq


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--show", action="store_true", help="print the sequence of calls")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        m = Path(tmp) / "q.toml"
        m.write_text(
            f'[qola]\nnamespace = "qk"\n[build]\narchitectures = ["{args.arch}"]\n\n[[modules]]\nname = "module_rmsnorm"\n'
        )
        argv = ["build", "--manifest", str(m), "--aiter-root", str(REPO / "examples" / "kernels"), "-o", f"{tmp}/out"]
        calls = follow(argv)
    files, steps, back, _seq = measure(calls)
    if args.show:
        for f, name in calls:
            print(f"  {Path(f).relative_to(REPO)}:{name}")
    print("| measure | value |\n|---|---:|")
    print(f"| files the settings enter | {files} |\n| steps (moves into a file) | {steps} |")
    print(f"| steps back into a file already left | {back} ({back / max(steps, 1):.0%}) |")
    print(f"| calls that receive the settings | {len(calls)} |")


if __name__ == "__main__":
    main()
