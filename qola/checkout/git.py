"""git for the checkout: every call through :func:`qola.core.proc.run` with a timeout, never a shell, never
a prompt; a failure is a :class:`~qola.core.errors.QolaError` with the command, git's own message and, for
network steps, the URL tried."""

from __future__ import annotations

import shlex
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qola.core import deadlines, proc
from qola.core.errors import QolaError, tail

# deadlines (qola.core.deadlines, QOLA_GIT_TIMEOUT): 600 s for a local step (a status, a checkout of a large
# tree), 3600 s for one that reaches the network (a clone or fetch of AITER and its submodules)
# what every git call runs with: no prompts (a missing credential fails instead of waiting), messages
# in English (qola quotes them), no transport that runs commands
SAFE = ("-c", "protocol.ext.allow=never", "-c", "core.quotePath=false")


QUIET = {"GIT_TERMINAL_PROMPT": "0", "GCM_INTERACTIVE": "never", "LC_ALL": "C", "LANGUAGE": "C"}


@dataclass(frozen=True)
class GitEnv(proc.TimedEnv):
    """git's view of the build's environment, resolved once: the environment git runs under
    (opaque) and ``QOLA_GIT_TIMEOUT`` as set (checked when git first runs)."""

    KNOB = deadlines.GIT_LOCAL


Env = Mapping[str, str] | GitEnv  # a caller's mapping, or the build's resolved view


def argv(root: Path | None, args: Sequence[str]) -> list[str]:
    return ["git", *(["-C", str(root)] if root is not None else []), *SAFE, *args]


def shown(args: Sequence[str]) -> str:
    return shlex.join(["git", *args])


def run(
    root: Path | None,
    *args: str,
    env: Env,
    network: str | None = None,
    timeout: float | None = None,
    check: bool = True,
    stdout: Any = proc.PIPE,
) -> proc.CompletedProcess[Any]:
    """``git -C root args``; stdout captured as text (or written to ``stdout``, a file, as bytes),
    stderr separate. ``network``: the URL this step reaches (named in the error). A non-zero exit
    raises unless ``check`` is false."""
    text = stdout is proc.PIPE
    cmd = argv(root, args)
    genv = GitEnv.of(env)
    limit = timeout or genv.timeout(deadlines.GIT_NETWORK if network else deadlines.GIT_LOCAL)
    try:
        done = proc.run(cmd, env=genv.child.plus(QUIET), timeout=limit, out=proc.Output(stdout, proc.PIPE, text=text))
    except proc.TimeoutExpired as exc:
        raise GitError(
            args,
            root,
            proc.why_ended(exc),
            network=network,
            hint=f"a git that hangs or is slow: fix it, or raise {deadlines.GIT_LOCAL.variable} "
            f"(now {deadlines.shown(limit)})"
            if network is None
            else None,
        ) from None
    except OSError as exc:
        raise QolaError(
            f"cannot run git: {exc.strerror or exc}",
            hint="install git (apt-get install git) and make sure it is on PATH",
        ) from None
    if check and done.returncode != 0:
        err = done.stderr if isinstance(done.stderr, str) else done.stderr.decode(errors="replace")
        raise GitError(args, root, err, code=done.returncode, network=network)
    return done


def out(root: Path | None, *args: str, env: Env, **kw: Any) -> str:
    return str(run(root, *args, env=env, **kw).stdout).strip()


def digest(root: Path | None, *args: str, env: Env, into: Any) -> None:
    """Feed what ``git args`` prints into the hash ``into``: written to a temporary file and read
    back in chunks, never held (a ``git diff --binary`` of a changed AITER tree runs past the 64 MiB a
    captured output may hold)."""
    with tempfile.TemporaryFile() as f:
        run(root, *args, env=env, stdout=f)
        f.seek(0)
        for chunk in iter(lambda: f.read(1 << 20), b""):
            into.update(chunk)


def ok(root: Path | None, *args: str, env: Env) -> bool:
    return run(root, *args, env=env, check=False).returncode == 0


class GitError(QolaError):
    """A git step failed: the command, where, git's message (and the URL of a network step)."""

    def __init__(
        self,
        args: Sequence[str],
        root: Path | None,
        message: str,
        *,
        code: int | None = None,
        network: str | None = None,
        hint: str | None = None,
    ):
        what = f"`{shown(args)}`" + (f" in {root}" if root is not None else "")
        status = f" (exit {code})" if code is not None else ""
        body = tail(message or "(git printed nothing)", lines=20).replace("\n", "\n    ")
        reach = f" while reaching {network}" if network else ""
        if network and hint is None:
            hint = (
                "check the network and the URL (--aiter-url, [qola].aiter_url or QOLA_AITER_URL), or "
                "work offline: pass --skip-checkout with a tree you already have"
            )
        super().__init__(f"{what} failed{reach}{status}:\n    {body}", hint=hint)
        self.git_message = message
