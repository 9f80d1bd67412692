"""Issue 32, item 3: every command in README.md, docs/ and the examples' header comments runs as written
on a fresh machine. Each is extracted from the text (fenced sh/bash blocks, the examples' `#   `
command lines, backslash continuations joined):

* every qola command line parses with qola's own parser (a renamed or misspelled flag fails here);
* none runs a `qola` executable inside the ROCm 7 chroot (it has none: `python -m qola`), none starts
  with `sudo` (a fresh root box has no sudo; the README says where root is needed), a PKG_CONFIG_PATH
  is absolute (pkg-config pastes it into the program's RUNPATH as given);
* the cheap ones (:data:`RUN`, kept beside them here: a list each entry of which must still be in the
  docs) run as written, from a fresh directory holding the repository's examples.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
from support.common import REPO, run_qola

from qola import cli

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
EXAMPLES = sorted((REPO / "examples").glob("*.toml"))
QOLA = re.compile(r"^(?:python3? -m qola(?:\.cli)?|qola)\s")


def _fenced(text: str) -> list[str]:
    """Lines of fenced blocks that hold shell (sh, bash, console or no language)."""
    lines, lang = [], None
    for line in text.splitlines():
        m = re.match(r"^\s*```(\w*)", line)
        if m:
            lang = None if lang is not None else m.group(1)
            continue
        if lang in ("sh", "bash", "console", ""):
            lines.append(line)
    return lines


def _joined(lines: list[str]) -> list[str]:
    out: list[str] = []
    for line in lines:
        if out and out[-1].endswith("\\"):
            out[-1] = out[-1][:-1].rstrip() + " " + line.strip()
        else:
            out.append(line.strip())
    return out


def shell_lines() -> list[tuple[str, str]]:
    """(where, command line) of every shell line in the docs and the examples' headers."""
    found = []
    for f in DOCS:
        for line in _joined(_fenced(f.read_text())):
            found.append((f.name, line.removeprefix("$ ")))
    for f in EXAMPLES:
        head = [ln[1:] for ln in f.read_text().splitlines() if ln.startswith("#   ")]
        found += [(f.name, line) for line in _joined(head)]
    return [(w, re.sub(r"\s+#\s.*$", "", ln)) for w, ln in found if ln and not ln.startswith("#")]


def qola_argv(line: str) -> list[list[str]]:
    """The qola command lines in a shell line (after `&&`, variables, `scripts/rocm7.sh run`), as argv
    past the program; documentation's optional brackets (`[-j N]`) taken as given."""
    argvs = []
    for part in line.split("&&"):
        if not re.search(r"(^|\s)(python3? -m )?qola(\.cli)?\s", part):
            continue
        try:
            words = shlex.split(part.replace("[", " ").replace("]", " "), comments=True)
        except ValueError:
            words = ["qola", "<unbalanced quotes>"]
        while words and re.match(r"^[A-Z_]+=", words[0]):
            words = words[1:]
        if words[:2] == ["scripts/rocm7.sh", "run"] or words[:3] == ["bash", "scripts/rocm7.sh", "run"]:
            words = words[2:] if words[0] != "bash" else words[3:]
        text = " ".join(words) + " "
        m = QOLA.match(text)
        if m:  # a placeholder count (`-j N`) as a number
            argvs.append(["2" if w == "N" else w for w in shlex.split(text[m.end() :])])
    return argvs


def test_docs_have_commands() -> None:
    lines = shell_lines()
    assert sum(1 for _, ln in lines for _ in qola_argv(ln)) >= 15, lines


@pytest.mark.parametrize("where,line", [p for p in shell_lines() if qola_argv(p[1])])
def test_every_qola_command_parses(where: str, line: str) -> None:
    for argv in qola_argv(line):
        try:
            args = cli._parser().parse_args(argv)
        except SystemExit as exc:
            pytest.fail(f"{where}: `{line}` does not parse (exit {exc.code})")
        assert getattr(args, "func", None), f"{where}: `{line}` names no command"


def test_no_command_that_cannot_run_as_written() -> None:
    bad = []
    for f in [*DOCS, *EXAMPLES, REPO / "CONTRIBUTING.md"]:
        text = f.read_text()
        for m in re.finditer(r"rocm7\.sh run qola\b", text):  # the chroot has no qola executable
            bad.append(f"{f.name}: {m.group(0)}")
        for m in re.finditer(r"PKG_CONFIG_PATH=(\S+)", text):
            if not m.group(1).strip("\"'").startswith(("/", "$PWD", "${PWD}", "$(pwd)")):
                bad.append(f"{f.name}: relative {m.group(0)}")
    for where, line in shell_lines():
        if line.startswith("sudo "):
            bad.append(f"{where}: {line}")
    assert not bad, bad


# (the command as the docs write it, what else it needs) -- each is run exactly as written
RUN = [
    ("qola plan --manifest examples/quickstart.toml --aiter-root examples/kernels", None),
    ("qola variants --manifest examples/quickstart.toml --aiter-root examples/kernels", None),
    # the README's command 1 and the quickstart header: compiled for real by tests/compile (minutes);
    # here as a dry run (the manifest, the tree, the toolchain and the graph, nothing compiled)
    ("qola build --manifest examples/quickstart.toml --aiter-root examples/kernels --output-dir out", "nvcc"),
    ("qola build --manifest examples/quickstart.toml --output-dir out", "nvcc"),
]


def test_run_list_is_still_in_the_docs() -> None:
    written = {" ".join(a) for _, ln in shell_lines() for a in qola_argv(ln)}
    for cmd, _ in RUN:
        assert cmd.removeprefix("qola ") in written, f"not in the docs any more: {cmd}"


@pytest.mark.parametrize("cmd,needs", RUN)
def test_cheap_commands_run_as_written(cmd: str, needs: str | None, tmp_path: Path) -> None:
    if needs and not shutil.which(needs):
        pytest.skip(f"needs {needs}")
    os.symlink(REPO / "examples", tmp_path / "examples")
    argv = shlex.split(cmd)[1:] + (["--dry-run"] if argv_is_build(cmd) else [])
    env = {k: v for k, v in os.environ.items() if k not in ("QOLA_AITER_SOURCE_DIR", "NVTE_AITER_SOURCE_DIR")}
    env["PYTHONPATH"] = str(REPO)
    proc = run_qola(*argv, cwd=tmp_path, env=env, whole_env=True)
    assert proc.returncode == 0, f"`{cmd}` failed:\n{proc.stdout}\n{proc.stderr}"
    assert "error:" not in proc.stderr


def argv_is_build(cmd: str) -> bool:
    return cmd.startswith("qola build")


def test_setup_output_is_quiet_unless_it_fails(tmp_path: Path) -> None:
    """Item 4: scripts/rocm7.sh's `quietly` keeps the tools' chatter in its log; a failure shows its tail."""
    script = (REPO / "scripts" / "rocm7.sh").read_text()
    body = re.search(r"^quietly\(\) \{.*?^\}", script, re.S | re.M)
    assert body, "scripts/rocm7.sh has no quietly()"
    log = tmp_path / "setup.log"
    run = (
        f"{body.group(0)}\nSETUP_LOG={shlex.quote(str(log))}\n"
        'quietly sh -c "echo chatter; echo more chatter >&2"\n'
        'quietly sh -c "echo line1; echo the-real-error >&2; exit 3" || echo "rc=$?"\n'
    )
    proc = subprocess.run(["bash", "-c", run], capture_output=True, text=True)
    assert "chatter" not in proc.stdout and proc.stderr.count("chatter") == 2  # only in the failure's tail
    assert "the-real-error" in proc.stderr and "rc=3" in proc.stdout
    assert "more chatter" in log.read_text()
