"""Secrets (issue 33): credentials in any URL qola is given (``--remote``, ``--prebuilt``, the clone URL)
never reach the console, a log or a file; one type (:class:`qola.core.secret.Secret`) holds them and
prints as ``***``."""

from __future__ import annotations

import http.server
import json
import os
import pickle
import threading
from pathlib import Path
from typing import Any, ClassVar

import pytest
from support.cli import MODULE
from support.common import KERNELS, run_qola
from support.fake_nvcc import fake_nvcc, make_tree
from support.fake_nvcc import pytestmark as needs_fake_nvcc  # g++ and a CUDA toolkit's cudart

from qola.core.errors import FailedProcessError, QolaError
from qola.core.secret import MASK, Secret, UnsplittableURL, redact, redact_argv, split_url

PASSWORD = "S3cr3t-pw"  # what must never be seen


def leaked(root: Path) -> list[str]:
    """Files under ``root`` holding the password (text or bytes)."""
    found = []
    for d, _, files in os.walk(root):
        for name in files:
            p = Path(d) / name
            if p.is_file() and not p.is_symlink() and PASSWORD.encode() in p.read_bytes():
                found.append(str(p))
    return found


def test_a_secret_shows_as_stars_and_refuses_records() -> None:
    s = Secret(PASSWORD)
    for shown in (str(s), repr(s), f"{s}", f"{s!s}", f"{s:>20}", "%s" % s, format(s)):
        assert PASSWORD not in shown and MASK in shown
    assert s.reveal() == PASSWORD and s == Secret(PASSWORD) and bool(s)
    with pytest.raises(TypeError):
        json.dumps({"password": s})
    with pytest.raises(TypeError):
        pickle.dumps(s)
    with pytest.raises(AttributeError):
        s._value = "x"


@pytest.mark.parametrize(
    "url, public",
    [
        (f"grpc://user:{PASSWORD}@h:1", "grpc://h:1"),
        (f"https://user:{PASSWORD}@example.org/aiter.git", "https://example.org/aiter.git"),
        (f"http://{PASSWORD}@example.org:8080/store/", "http://example.org:8080/store/"),
        (f"grpcs://u:p@ss{PASSWORD}@h:443", "grpcs://h:443"),  # an unescaped '@' in the password
        ("https://example.org/a@b", "https://example.org/a@b"),  # '@' in the path: no credentials
    ],
)
def test_split_and_redact(url: str, public: str) -> None:
    got, secret = split_url(url)
    assert got == public
    assert (secret is None) == (url == public)
    for text in (f"cannot reach {url}: refused", f"--remote={url}", f"x {url} y {url}"):
        assert PASSWORD not in redact(text)
    assert redact_argv(["qola", "--prebuilt", url]) == ["qola", "--prebuilt", redact(url)]


def test_every_error_redacts_urls() -> None:
    exc = QolaError(f"cannot fetch https://u:{PASSWORD}@h/x", hint=f"try http://{PASSWORD}@h", where="x")
    assert PASSWORD not in exc.render()
    failed = FailedProcessError(
        ["git", "clone", f"https://u:{PASSWORD}@h/r.git"], 128, f"fatal: https://u:{PASSWORD}@h"
    )
    assert PASSWORD not in failed.render() and PASSWORD not in str(failed)


def _manifest(tmp_path: Path) -> Path:
    m = tmp_path / "q.toml"
    m.write_text('[qola]\nnamespace = "qk"\n[build]\narchitectures = ["sm_90"]\n[[modules]]\nname = "module_softmax"\n')
    return m


@pytest.mark.parametrize("scheme", ["grpc", "grpcs", "http", "https"])
def test_remote_credentials_in_the_url_are_refused_and_never_shown_or_written(tmp_path: Path, scheme: str) -> None:
    """``--remote grpc://user:PASSWORD@host``: the old build printed the password twice and wrote it
    into .qola-noop.json, .qola.lock and remote/config.json."""
    out = tmp_path / "out"
    proc = run_qola(
        "build",
        "-m",
        str(_manifest(tmp_path)),
        "--aiter-root",
        str(KERNELS),
        "-o",
        str(out),
        "--remote",
        f"{scheme}://user:{PASSWORD}@127.0.0.1:1",
        "--dry-run",
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "credentials in the URL" in proc.stderr and "--remote-token" in proc.stderr, proc.stderr
    assert PASSWORD not in proc.stdout + proc.stderr
    assert leaked(tmp_path) == []


class _Recorder(http.server.BaseHTTPRequestHandler):
    seen: ClassVar[list[str | None]] = []

    def do_GET(self) -> None:
        type(self).seen.append(self.headers.get("Authorization"))
        self.send_response(404)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def test_prebuilt_credentials_go_in_a_header_never_in_a_message(tmp_path: Path) -> None:
    import base64

    from qola.store import download

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        source = f"http://user:{PASSWORD}@127.0.0.1:{server.server_address[1]}/store"
        with pytest.raises(download.Missing) as info:
            download.get(source, "x.tar.gz", lambda b: None, 1 << 20, 10)
    finally:
        server.shutdown()
        server.server_close()
    assert PASSWORD not in str(info.value) and "404" in str(info.value)
    assert _Recorder.seen == ["Basic " + base64.b64encode(f"user:{PASSWORD}".encode()).decode()]


def test_clone_credentials_go_to_git_through_its_environment_only(tmp_path: Path) -> None:
    """``--aiter-url https://user:PASSWORD@host/…``: the clone runs on the URL without them (so neither
    .git/config nor a message holds them); git gets them as an Authorization header for that host,
    in its environment-only config. A password in an ssh URL is refused; an ssh user is kept."""
    from qola.checkout.request import clone_url
    from qola.checkout.sync import Request

    public, creds = clone_url(f"https://user:{PASSWORD}@git.example.org/aiter.git")
    assert public == "https://git.example.org/aiter.git" and creds is not None
    req = Request(
        root=tmp_path,
        commit="abcd",
        commit_from="x",
        url=public,
        credentials=creds,
        env={"GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "a.b", "GIT_CONFIG_VALUE_0": "c"},
    )
    env = req.network_env()
    assert env["GIT_CONFIG_COUNT"] == "2" and env["GIT_CONFIG_KEY_0"] == "a.b"
    assert env["GIT_CONFIG_KEY_1"] == "http.https://git.example.org/.extraHeader"
    assert env["GIT_CONFIG_VALUE_1"].startswith("Authorization: Basic ") and PASSWORD not in repr(req)
    assert clone_url("ssh://git@host/aiter.git") == ("ssh://git@host/aiter.git", None)
    with pytest.raises(QolaError, match="password") as info:
        clone_url(f"ssh://git:{PASSWORD}@host/aiter.git")
    assert PASSWORD not in info.value.render()

    root = tmp_path / "aiter"  # nothing listens on port 1: the clone fails, and says so without the password
    proc = run_qola(
        "checkout",
        "--aiter-root",
        str(root),
        "--aiter-commit",
        "0123456789abcdef",
        "--aiter-url",
        f"http://user:{PASSWORD}@127.0.0.1:1/aiter.git",
    )
    assert proc.returncode == 2 and "127.0.0.1:1" in proc.stderr, proc.stderr
    assert PASSWORD not in proc.stdout + proc.stderr and leaked(tmp_path) == []


def test_url_credentials_that_cannot_be_split_are_refused_unshown(tmp_path: Path) -> None:
    """A raw '/' in a password (``https://u:ab/PW@host``) ended the authority early: the split found no
    credentials, so the old qola printed the URL whole and wrote it into .qola.lock and
    .qola-noop.json (issue 41). It is refused where it is given, naming where and how to fix it, and
    showing no part of the secret; a numeric port before a path '@' is no credential."""
    raw = f"https://user:ab/{PASSWORD}@127.0.0.1:1/aiter.git"
    with pytest.raises(UnsplittableURL) as info:
        split_url(raw)
    assert PASSWORD not in str(info.value) + info.value.hint and "%2F" in info.value.hint
    assert redact(f"see {raw} now") == "see https://***@127.0.0.1:1/aiter.git now"
    assert split_url("https://host:8080/pkg@1.0/x") == ("https://host:8080/pkg@1.0/x", None)
    for argv, where in (
        (["build", "-m", str(_manifest(tmp_path)), "-a", str(KERNELS), "-o", str(tmp_path / "o"), "--remote", raw], "--remote"),
        (["checkout", "-m", str(_manifest(tmp_path)), "-a", str(tmp_path / "tree"), "--aiter-url", raw], "--aiter-url"),
    ):  # fmt: skip
        proc = run_qola(*argv, cwd=tmp_path)
        said = proc.stdout + proc.stderr
        assert proc.returncode == 2 and "Traceback" not in said and where in said and "%2F" in said, said
        assert PASSWORD not in said
    assert leaked(tmp_path) == []


@needs_fake_nvcc
def test_an_environment_url_password_reaches_no_record(tmp_path: Path) -> None:
    """``QOLA_AITER_URL=https://user:PW@host/…`` set while building: the old build published it in
    OUT/manifest.json's recorded environment (and the no-op record's). The recorded view masks it, and
    a second build with another password is still a no-op (the password changes nothing built)."""
    tree = make_tree(tmp_path / "tree")
    m = tmp_path / "q.toml"
    m.write_text('[qola]\nnamespace = "qk"\n[build]\narchitectures = ["sm_90"]\n' + MODULE)
    args = ("build", "--manifest", m, "--aiter-root", tree, "-o", tmp_path / "out", "-j", "2")
    env = {"CUDACXX": str(fake_nvcc(tmp_path / "nvcc")), "QOLA_AITER_URL": f"https://user:{PASSWORD}@h.invalid/a.git"}
    first = run_qola(*args, env=env, cwd=tmp_path)
    assert first.returncode == 0, first.stdout + first.stderr
    recorded = json.loads((tmp_path / "out" / "manifest.json").read_text())["build"]["env"]
    assert recorded["QOLA_AITER_URL"] == "https://***@h.invalid/a.git"
    again = run_qola(*args, env={**env, "QOLA_AITER_URL": "https://user:other@h.invalid/a.git"}, cwd=tmp_path)
    assert again.returncode == 0 and "is up to date" in again.stderr, again.stderr
    assert PASSWORD not in first.stdout + first.stderr and leaked(tmp_path) == []


@needs_fake_nvcc
@pytest.mark.parametrize("given", ["manifest", "flag"])
def test_a_manifest_or_flag_url_password_reaches_no_record(tmp_path: Path, given: str) -> None:
    """``[qola].aiter_url`` or ``--aiter-url`` with a password (issue 41 item 4): no file the build
    leaves (OUT/manifest.json, .qola-noop.json, the locks, the logs) and nothing it prints holds it;
    the next build is still a no-op."""
    tree = make_tree(tmp_path / "tree")
    url = f"https://user:{PASSWORD}@h.invalid/a.git"
    m = tmp_path / "q.toml"
    aiter_url = f'aiter_url = "{url}"\n' if given == "manifest" else ""
    m.write_text(f'[qola]\nnamespace = "qk"\n{aiter_url}[build]\narchitectures = ["sm_90"]\n' + MODULE)
    args: tuple[Any, ...] = ("build", "--manifest", m, "--aiter-root", tree, "-o", tmp_path / "out", "-j", "2")
    args += ("--aiter-url", url) if given == "flag" else ()
    env = {"CUDACXX": str(fake_nvcc(tmp_path / "nvcc"))}
    first = run_qola(*args, env=env, cwd=tmp_path)
    assert first.returncode == 0, first.stdout + first.stderr
    assert (tmp_path / "out.build" / ".qola-noop.json").is_file()
    again = run_qola(*args, env=env, cwd=tmp_path)
    assert again.returncode == 0 and "is up to date" in again.stderr, again.stderr
    said = first.stdout + first.stderr + again.stdout + again.stderr
    assert PASSWORD not in said and leaked(tmp_path) == [(str(m))] * (given == "manifest"), leaked(tmp_path)


@pytest.mark.parametrize(
    "url",
    [
        f"https://alice:pa#{PASSWORD}@host/x.git",  # a raw '#' ended the authority: no credentials were found
        f"https://alice:pa?{PASSWORD}@host/x.git",  # a raw '?'
        f"https://alice:pa {PASSWORD}@host/x.git",  # a raw space
        f"https://tok#{PASSWORD}@host/x.git",  # a bare token with a raw '#'
    ],
)
def test_a_raw_hash_query_or_space_in_a_password_is_refused_and_masked(url: str) -> None:
    """A password holding a raw '#', '?' or space (issue 51): the old pattern found no credentials, so
    the URL was printed whole and went on git's argv. The parse refuses it (naming no part of it),
    the clone URL's check says how to fix it, and any text holding it shows it masked."""
    from qola.core.rules import url_problem

    with pytest.raises(UnsplittableURL):
        split_url(url)
    problem = url_problem(url)
    assert problem is not None and "%23" in problem and PASSWORD not in problem
    for text in (f"see {url} now", f'"value": "{url}"', f"--prebuilt={url}"):
        assert PASSWORD not in redact(text) and "host/x.git" in redact(text), redact(text)


def test_credential_like_variables_are_recorded_as_digests() -> None:
    """A variable whose name says it is a credential (``HF_TOKEN``, ``*_KEY``, ``*PASSWORD*``) is
    recorded as a digest of its value (a change still counts); any other keeps its value."""
    from qola.core.secret import credential_name, recorded_value
    from qola.store.fastpath import RecordedEnv

    for name in ("HF_TOKEN", "GITHUB_TOKEN", "AWS_SECRET_ACCESS_KEY", "DB_PASSWORD", "API_KEY", "my_api_key"):
        assert credential_name(name), name
    for name in ("PATH", "CUDACXX", "KEYBOARD", "QK_RMSNORM_USE_RSQRT", "MONKEY"):
        assert not credential_name(name), name
    view = RecordedEnv.of({"HF_TOKEN": PASSWORD, "CUDACXX": "/usr/bin/nvcc"}, ["HF_TOKEN", "CUDACXX"])
    assert view.get("CUDACXX") == "/usr/bin/nvcc" and PASSWORD not in repr(view)
    assert view.get("HF_TOKEN") == recorded_value("HF_TOKEN", PASSWORD) != recorded_value("HF_TOKEN", "other")
