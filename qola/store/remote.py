"""``qola build --remote``: every compile of the graph as a Remote Execution API (REAPI) action.

qola speaks no REAPI itself: buildbox's ``trexe`` (Debian's ``buildbox`` package) sends each
action to the service the user names (BuildGrid, Buildbarn, BuildBuddy, NativeLink, EngFlow …) and
:mod:`qola.compile.remote_launch` is the compiler launcher that builds the action (docs/distributed.md).

* :class:`Endpoint`: the service: URL (``grpc://``/``http://`` plain, ``grpcs://``/``https://`` TLS,
  ``unix:``), instance name, CA certificate, client certificate and key (mTLS), an access-token
  file (sent as ``Authorization: Bearer``); never part of the build key;
* :func:`toolchain_id`: the compiler's identity from the build key's toolchain record, the value of
  the action's ``qola-toolchain`` platform property: only a worker started with that property
  (``buildbox-worker --platform qola-toolchain=<id>``) is given qola's compiles;
* :func:`prepare`: checks that ``trexe`` is there, runs ``<compiler> --version`` as an uncached
  action (the service answers, accepts the credentials and has a worker with this toolchain, whose
  compiler says what the local one says), then writes the launcher's config and script;
* :func:`service`: the build's executor (:class:`qola.compile.executor.Service`), prepared once the
  toolchain is known; :class:`qola.compile.executor.Tally` reads where each compile ran (remote,
  cached, local fallback, failed), for the progress line and the summary.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qola.compile.executor import Connected, Service, Where
from qola.compile.remote_launch import errors
from qola.core import inputs, proc
from qola.core.errors import QolaError
from qola.core.fsutil import atomic_write
from qola.core.secret import UnsplittableURL, redact, split_url
from qola.core.selfrun import launcher_script
from qola.store.key import binary_sha256, digest
from qola.toolchain import find_toolchain
from qola.toolchain.identity import compiler_env

if TYPE_CHECKING:
    from qola.toolchain import Toolchain

DOCS = "docs/distributed.md"
PROPERTY = "qola-toolchain"
PROBE_TIMEOUT = 120.0  # seconds for the start-up action (a worker must pick it up)
ACTION_TIMEOUT = 3600.0  # seconds for one compile action, queue included
SCHEMES = {"grpc": "http", "http": "http", "grpcs": "https", "https": "https"}
# where toolchains live: headers and tools under these come from the worker, never uploaded
SYSTEM = ("/usr", "/bin", "/lib", "/lib64", "/etc", "/opt/rocm")
# the compile's environment as the action carries it (besides the compiler variables set)
ACTION_PATH = "/usr/local/bin:/usr/bin:/bin"


@dataclass(frozen=True)
class Endpoint:
    url: str
    instance: str = ""
    ca: str | None = None  # the server's CA certificate (PEM), for a private CA
    cert: str | None = None  # client certificate (mTLS)
    key: str | None = None  # client key (mTLS)
    token: str | None = None  # a file holding an access token (JWT / OAuth)

    def trexe_args(self) -> list[str]:
        args = [f"--remote={self.url}", f"--instance={self.instance}"]
        for opt, value in (
            ("server-cert", self.ca),
            ("client-cert", self.cert),
            ("client-key", self.key),
            ("access-token", self.token),
        ):
            if value:
                args.append(f"--{opt}={value}")
        return args


def endpoint(
    url: str | None,
    *,
    instance: str | None = None,
    ca: str | None = None,
    cert: str | None = None,
    key: str | None = None,
    token: str | None = None,
) -> Endpoint | None:
    """The service ``url`` names (None: no remote build), its options checked."""
    if not url:
        return None
    try:
        public, credentials = split_url(url)
    except UnsplittableURL as exc:
        raise QolaError(f"--remote: {exc}", hint=exc.hint) from None
    if credentials is not None:  # REAPI clients take no user:password; shown, they would be leaked
        raise QolaError(
            f"--remote: {public} is given with credentials in the URL ({redact(url)}); they are never sent, "
            "shown or recorded",
            hint="put the access token in a file and pass --remote-token FILE (or use mTLS: "
            "--remote-client-cert/--remote-client-key); drop user:password@ from the URL",
        )
    scheme, sep, rest = url.partition("://")
    if url.startswith("unix:"):
        norm = url
    elif sep and scheme in SCHEMES and rest and not any(c.isspace() for c in rest):
        norm = f"{SCHEMES[scheme]}://{rest}"
    else:
        raise QolaError(
            f"--remote: {redact(url)!r} is not an REAPI endpoint",
            hint="give grpc://host:port (plain), grpcs://host:port (TLS) or unix:/path",
        )
    if bool(cert) != bool(key):
        raise QolaError("--remote: a client certificate needs its key (--remote-client-cert with --remote-client-key)")
    for what, path in (
        ("CA certificate", ca),
        ("client certificate", cert),
        ("client key", key),
        ("access token", token),
    ):
        if path and not os.path.isfile(path):
            raise QolaError(f"--remote: the {what} {path} is not a readable file")
    return Endpoint(norm, instance or "", _abs(ca), _abs(cert), _abs(key), _abs(token))


def _abs(path: str | None) -> str | None:
    return os.path.abspath(path) if path else None


def toolchain_id(tc: Toolchain, env: Mapping[str, str]) -> str:
    """The compiler's identity: kind, version, ``--version`` output, the compiler's and host C++
    compiler's sha256 and the compiler environment — the build key's toolchain record, less what
    only links read."""

    record = {
        "kind": tc.kind,
        "version": tc.version,
        "version_output": tc.version_output,
        "rocm_version": tc.rocm_version,
        "compiler": tc.compiler,
        "compiler_sha256": binary_sha256(tc.compiler),
        "host_cxx_sha256": binary_sha256(tc.host_cxx),
        "child_env": dict(sorted(tc.child_env.items())),
        "env": compiler_env(env),
    }
    return digest(record)[:32]


def action_env(tc: Toolchain, env: Mapping[str, str]) -> dict[str, str]:
    """The environment every action carries: a fixed PATH (the compiler's dir first), the compiler
    variables the build sets. Nothing of the client's own (home, venv, user) enters the key."""

    dirs = [os.path.dirname(tc.compiler), os.path.dirname(tc.host_cxx or ""), *ACTION_PATH.split(":")]
    path = ":".join(dict.fromkeys(d for d in dirs if d))
    return {"PATH": path, "LANG": "C.UTF-8", **compiler_env({**env, **tc.child_env})}


def system_dirs(tc: Toolchain) -> list[str]:
    """The toolchain's dirs (never uploaded): the usual system ones and the compiler's install."""
    extra = []
    for tool in (tc.compiler, tc.host_cxx):
        if tool:
            extra.append(os.path.dirname(os.path.dirname(os.path.realpath(tool))))
    return list(dict.fromkeys([*SYSTEM, *(e for e in extra if e not in ("", "/"))]))


def find_trexe(env: Mapping[str, str]) -> str:
    found = shutil.which("trexe", path=env.get("PATH"))
    if not found:
        raise QolaError(
            "--remote: trexe (buildbox's REAPI client) is not on PATH",
            hint=f"install buildbox (apt-get install buildbox on Debian unstable); {DOCS}",
        )
    return found


def probe(trexe: str, ep: Endpoint, tc: Toolchain, env: dict[str, str], prop: str, work: Path) -> None:
    """``<compiler> --version`` as an uncached action; a QolaError that names what failed."""
    meta = work / "probe.json"
    meta.unlink(missing_ok=True)
    argv = [
        trexe,
        *ep.trexe_args(),
        f"--platform-properties={PROPERTY}={prop}",
        "--do-not-cache",
        "--skip-cache-lookup",
        *(f"--env={k}={v}" for k, v in sorted(env.items())),
        f"--result-metadata-file={meta}",
        f"--stdout-file={work / 'probe.out'}",
        "--",
        tc.compiler,
        "--version",
    ]
    hint = (
        f"check the endpoint, instance and credentials, and that a worker runs with --platform "
        f"{PROPERTY}={prop} (the id of this compiler; {DOCS})"
    )
    try:
        got = proc.run(argv, timeout=PROBE_TIMEOUT, out=proc.SEPARATE)
    except proc.TimeoutExpired:
        raise QolaError(
            f"--remote: {ep.url}: no worker with this toolchain ({PROPERTY}={prop}) answered within "
            f"{PROBE_TIMEOUT:.0f} s",
            hint=hint,
        ) from None
    except OSError as exc:
        raise QolaError(f"--remote: cannot run {trexe}: {exc}") from None
    try:
        result = json.loads(inputs.read_record(meta))["actionResultMetadata"]
    except (OSError, ValueError, KeyError, TypeError):
        raise QolaError(
            f"--remote: {ep.url} did not run the start-up action: {errors(got.stderr or '') or 'no answer'}", hint=hint
        ) from None
    try:
        out = inputs.read_record(work / "probe.out", what="the start-up action's output")
    except OSError:
        out = ""
    if int(result.get("exitCode", 0) or 0) != 0 or out.strip() != (tc.version_output or "").strip():
        raise QolaError(
            f"--remote: the worker's {os.path.basename(tc.compiler)} differs from this one "
            f"(exit {result.get('exitCode', 0)}, --version: {out.strip()[:200]!r})",
            hint=f"give workers with another compiler another {PROPERTY} ({DOCS})",
        )


@dataclass(frozen=True)
class RemoteUse:
    """How a build uses the service: ``fallback``: a compile the service cannot run runs here;
    ``dry_run``: nothing is asked of the service."""

    fallback: bool
    dry_run: bool = False


def prepare(
    ep: Endpoint,
    tc: Toolchain,
    build_dir: Path,
    tree_root: str,
    env: Mapping[str, str],
    use: RemoteUse,
) -> Connected:
    """Probe the service (not in a dry run) and write the launcher (``<build>/remote/cc`` +
    ``config.json``). ``env``: PATH (where trexe is found) and the compilers' variables
    (:data:`qola.toolchain.identity.COMPILER_ENV`: the toolchain's id and the action's environment);
    nothing else of the build's environment."""
    fallback, dry_run = use.fallback, use.dry_run

    trexe = find_trexe(env)
    build_dir.mkdir(parents=True, exist_ok=True)
    work = build_dir / "remote"
    work.mkdir(parents=True, exist_ok=True)
    prop = toolchain_id(tc, env)
    aenv = action_env(tc, env)
    if not dry_run:
        probe(trexe, ep, tc, aenv, prop, work)
    cfg: dict[str, Any] = {
        "url": ep.url,
        "trexe": trexe,
        "endpoint": ep.trexe_args(),
        "property": f"{PROPERTY}={prop}",
        "tree": os.path.realpath(tree_root),
        "build_dir": str(build_dir.resolve()),
        "system": system_dirs(tc),
        "env": aenv,
        "timeout": ACTION_TIMEOUT,
        "fallback": fallback,
        "map_flags": tc.prefix_map_flags([("{old}", "{new}")]),
    }
    atomic_write(work / "config.json", json.dumps(cfg, indent=1, sort_keys=True).encode())
    script = launcher_script("qola.compile.remote_launch", str(work / "config.json"))
    atomic_write(work / "cc", script.encode(), mode=0o755)
    (work / "tally").unlink(missing_ok=True)
    return Connected(str(work / "cc"), f"{PROPERTY}={prop}")


def service(ep: Endpoint, jobs: int, use: RemoteUse) -> Service:
    """The executor of a ``--remote`` build (:mod:`qola.compile.executor`): ``ep``, probed and its
    launcher written (:func:`prepare`) once the toolchain is known."""

    def connect(where: Where) -> Connected:
        return prepare(ep, where.toolchain, where.build_dir, where.tree_root, where.env, use)

    return Service(ep.url, jobs, connect)


def main(argv: list[str]) -> int:
    """``python -m qola.store.remote toolchain-id ARCH…``: the ``qola-toolchain`` property of this
    machine's compiler for those archs (run on a worker to start it with the clients' id)."""
    import tempfile

    if len(argv) < 2 or argv[0] != "toolchain-id":
        print("usage: python -m qola.store.remote toolchain-id ARCH [ARCH…]   (e.g. gfx942, sm_90)", file=sys.stderr)
        return 2
    env = dict(os.environ)
    try:
        with tempfile.TemporaryDirectory(prefix="qola-id-") as tmp:
            tc = find_toolchain(argv[1:], env=env, accepted_versions=None, cache_dir=tmp)
            print(f"{PROPERTY}={toolchain_id(tc, env)}")
    except QolaError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
