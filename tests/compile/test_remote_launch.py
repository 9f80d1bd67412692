"""The ``--remote`` launcher's pure parts (no service): how a compile becomes an action that names
nothing of the client's dirs, and how the endpoint options are checked (issue 26)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from qola.compile.remote_launch import (
    OUT_DEP,
    OUT_OBJ,
    STAGE,
    Mapper,
    _canonical_outputs,
    deps_argv,
    errors,
    extra_roots,
)
from qola.core.errors import QolaError
from qola.store import remote
from qola.toolchain.portable import depfile_named, split_depfile

ARGV = [
    "/usr/bin/hipcc",
    "-I/src/tree/include",
    "-I",
    "/opt/venv/pybind11/include",
    "-ffile-prefix-map=/src/tree=/qola/tree",
    "-cuid=ab",
    "-MD",
    "-x",
    "hip",
    "-c",
    "/src/tree/csrc/a.cu",
    "-o",
    "obj/m/a-1.o",
]


def test_the_action_spells_roots_by_slot_and_outputs_by_fixed_names() -> None:
    roots = {"t": "/src/tree", "b": "/work/build"}
    roots.update(extra_roots(ARGV, "/work/build", roots, remote.SYSTEM))
    assert roots["x0"] == "/opt/venv/pybind11/include"
    m = Mapper(roots, remote.SYSTEM)
    spelled = [m.spell(a) for a in _canonical_outputs(ARGV)]
    assert spelled[1] == f"-I{STAGE}/t/include" and spelled[3] == f"{STAGE}/x0"
    assert f"-ffile-prefix-map={STAGE}/t=/qola/tree" in spelled
    assert f"{STAGE}/t/csrc/a.cu" in spelled
    assert spelled[spelled.index("-o") + 1] == OUT_OBJ and "-MD" in spelled and "-MF" not in spelled
    # qola's line names no depfile (-MD alone): the compiler writes it after -o, here and in the action
    assert depfile_named(ARGV) == "obj/m/a-1.d" and depfile_named(_canonical_outputs(ARGV)) == OUT_DEP
    assert (
        depfile_named([*ARGV[:-2], "-MF", "x.d", "-o", "o"]) == "x.d"
        and depfile_named(["cc", "-c", "a.c", "-o", "a.o"]) is None
    )
    assert not any("/src/tree" in a or "/work/build" in a or "a-1.o" in a for a in spelled)
    # a root's name inside another path is left alone
    assert m.spell("-I/x/src/tree") == "-I/x/src/tree" and m.spell("/src/treetop") == "/src/treetop"
    assert m.slot("/usr/include/stdio.h") is None and m.is_system("/usr/include/stdio.h")
    assert m.back("/qola-remote/t/a.h /qola-remote/b/g.h") == "/src/tree/a.h /work/build/g.h"


def test_dependency_listing_and_depfile_parsing() -> None:
    got = deps_argv(ARGV, "/tmp/d")
    assert "-c" not in got and "-o" not in got and "-MD" not in got and "obj/m/a-1.o" not in got
    assert got[-3:] == ["-M", "-MF", "/tmp/d"]
    text = "obj/a.o: /src/tree/a.cu \\\n  /src/tree/with\\ space.h /usr/include/x.h\n"
    assert split_depfile(text) == ["/src/tree/a.cu", "/src/tree/with space.h", "/usr/include/x.h"]


def test_trexe_errors_are_shortened_to_their_messages() -> None:
    log = (
        "2026-11-25T01:49:28.376+0000 [1944:1] [x.cpp:1] [ERROR] Retry limit (4) exceeded\n"
        "2026-11-25T01:49:28.376+0000 [1944:1] [y.cpp:2] [INFO] noise\n"
        "2026-11-25T01:49:28.376+0000 [1944:1] [z.cpp:3] [ERROR] Connection refused\n"
    )
    assert errors(log) == "Retry limit (4) exceeded; Connection refused"


def test_endpoints_checked(tmp_path: Path) -> None:
    assert remote.endpoint(None) is None
    assert endpoint("grpc://h:1").url == "http://h:1"
    assert endpoint("grpcs://h:443", instance="main").trexe_args()[:2] == [
        "--remote=https://h:443",
        "--instance=main",
    ]
    assert endpoint("unix:/run/s.sock").url == "unix:/run/s.sock"
    for bad in ("ftp://h", "h:1", "grpc://", "grpc://a b"):
        with pytest.raises(QolaError, match="not an REAPI endpoint"):
            endpoint(bad)
    with pytest.raises(QolaError, match="needs its key"):
        endpoint("grpcs://h:1", cert=str(tmp_path))
    with pytest.raises(QolaError, match="not a readable file"):
        endpoint("grpcs://h:1", token=str(tmp_path / "nope"))
    token = tmp_path / "t"
    token.write_text("x")
    assert f"--access-token={token}" in endpoint("grpcs://h:1", token=str(token)).trexe_args()


def test_remote_refuses_dist_and_launchers_and_stays_out_of_the_key(tmp_path: Path) -> None:
    from pathlib import Path

    from qola.compile.layout import BuildLayout
    from qola.pipeline.begin import ask
    from qola.pipeline.machine import settings
    from qola.pipeline.spec import BuildSpec, Settings
    from qola.plan import manifest as manifest_mod
    from qola.store.key import MANIFEST_IGNORED

    assert "remote" in MANIFEST_IGNORED["build"]
    m = tmp_path / "q.toml"
    m.write_text('[qola]\nnamespace = "qk"\n[build]\narchitectures = ["sm_90"]\nremote = "grpc://h:1"\n')
    manifest_mod.load(str(m))
    layout = BuildLayout(Path(tmp_path / "b"), Path(tmp_path / "o"))

    def _settings(spec: BuildSpec) -> Settings:
        env = {"PATH": "/usr/bin"}
        return settings(spec, ask(spec, env), layout, env)

    s = _settings(BuildSpec.make(manifest=str(m)))
    assert s.remote is not None and s.remote.url == "http://h:1" and s.launcher is None  # the manifest's key
    s = _settings(BuildSpec.make(manifest=str(m), remote="grpcs://other:443"))
    assert s.remote is not None and s.remote.url == "https://other:443"  # the command line wins
    for extra in ({"dist": True}, {"launcher": "ccache"}):
        with pytest.raises(QolaError, match="takes no --dist or launcher"):
            _settings(BuildSpec.make(manifest=str(m), **extra))


FAKE_TREXE = r"""#!{python}
import json, os, sys
args = sys.argv[1:]
dl = next(a[4:] for a in args if a.startswith("--d="))
meta = next(a.split("=", 1)[1] for a in args if a.startswith("--result-metadata-file="))
victim, how = os.environ["VICTIM"], os.environ["HOW"]
out = os.path.join(dl, ".qola-out")
if how == "dir-link":  # the output dir itself a link to a dir of the client's
    os.makedirs(dl, exist_ok=True)
    os.symlink(os.path.dirname(victim), out)
else:
    os.makedirs(out)
    obj, dep = os.path.join(out, "o"), os.path.join(out, "o.d")
    with open(obj if how != "obj-link" else dep, "w") as f:
        f.write("OBJ" if how != "obj-link" else ".qola-out/o: /qola-remote/t/a.cu\n")
    if how in ("dep-link", "obj-link"):
        os.symlink(victim, dep if how == "dep-link" else obj)
    elif how == "dep-fifo":
        os.mkfifo(dep)
    elif how == "dep-dangling":
        os.symlink(victim + ".gone", dep)
    else:
        with open(dep, "w") as f:
            f.write(".qola-out/o: /qola-remote/t/a.cu\n")
with open(meta, "w") as f:
    json.dump({{"actionResultMetadata": {{"exitCode": 0}}}}, f)
"""

FAKE_CC = r"""#!{python}
import sys
args = sys.argv[1:]
with open(args[args.index("-MF") + 1], "w") as f:
    f.write("x.o: {tree}/a.cu\n")
"""


@pytest.mark.parametrize("how", ["dep-link", "obj-link", "dir-link", "dep-fifo", "dep-dangling", "regular"])
def test_an_output_the_service_returns_must_be_a_regular_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """A service (or anyone who can write its action cache) returns the depfile or the object as a
    symbolic link to a file of the client's: the old launcher rewrote that file in place and moved
    the link into the build dir. Every output is checked (type, under real dirs, size) before it is
    read, rewritten or committed; the client's file is untouched and nothing reaches the build dir."""
    import os
    import sys

    from qola.compile import remote_launch

    tree, build = tmp_path / "tree", tmp_path / "build"
    tree.mkdir()
    (build / "remote").mkdir(parents=True)
    (build / "obj").mkdir()  # ninja makes an edge's output dir
    (tree / "a.cu").write_text("int a;\n")
    victim = tmp_path / "victim.d"
    victim.write_text(f"secret: {tmp_path}/keep/\n")
    trexe, cc = tmp_path / "trexe", tmp_path / "cc"
    trexe.write_text(FAKE_TREXE.format(python=sys.executable))
    cc.write_text(FAKE_CC.format(python=sys.executable, tree=tree))
    for tool in (trexe, cc):
        tool.chmod(0o755)
    monkeypatch.setenv("VICTIM", str(victim))
    monkeypatch.setenv("HOW", how)
    cfg = {
        "build_dir": str(build),
        "tree": str(tree),
        "system": ["/usr"],
        "trexe": str(trexe),
        "endpoint": [],
        "property": "p=1",
        "env": {},
        "timeout": 60,
        "map_flags": [],
    }
    argv = [str(cc), "-MD", "-MF", "obj/a.o.d", "-c", str(tree / "a.cu"), "-o", "obj/a.o"]
    before = victim.read_text()
    if how == "regular":
        assert remote_launch.remote(cfg, argv, str(build)) == (0, "remote")
        assert (build / "obj" / "a.o").read_text() == "OBJ"
        assert (build / "obj" / "a.o.d").read_text() == f"obj/a.o: {tree}/a.cu\n"
        return
    with pytest.raises(remote_launch.Infra) as info:
        remote_launch.remote(cfg, argv, str(build))
    text = str(info.value)
    assert "refused" in text or "did not arrive" in text, text
    assert victim.read_text() == before and not os.path.islink(victim)
    assert not any((build / "obj").iterdir())


def endpoint(address: str, **kw: Any) -> remote.Endpoint:
    """``remote.endpoint`` of an address that names one."""
    found = remote.endpoint(address, **kw)
    assert found is not None, address
    return found
