"""Prebuilt libraries by build key (issue 13; the key itself: test_build_key.py): ``qola package``, and
``qola build --prebuilt DIR|URL`` / ``--publish DIR`` round trips and refusals on one small module
(module_softmax, sm_90 nvcc), built once for the whole file."""

from __future__ import annotations

import gzip
import hashlib
import http.server
import io
import json
import os
import shutil
import tarfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support.common import KERNELS, run_qola
from support.softmax_manifest import write_manifest

from qola.core.errors import QolaError
from qola.output.outdir import ENTRIES, published
from qola.pipeline import run as pipeline
from qola.pipeline.report import BuildReport
from qola.pipeline.run import BuildSpec, Reporter
from qola.store import prebuilt

# ---- round trips: one real build ----------------------------------------------------------------------


class Notes(Reporter):
    def __init__(self) -> None:
        self.notes: list[str] = []

    def note(self, text: str) -> None:
        self.notes.append(text)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path, Path, Path, BuildReport]:
    """module_softmax for sm_90, built once with --publish into a store."""
    if not shutil.which("nvcc"):
        pytest.skip("needs nvcc")
    tmp = tmp_path_factory.mktemp("prebuilt")
    src = tmp / "kernels"
    shutil.copytree(KERNELS, src, ignore=shutil.ignore_patterns("hsa", "__pycache__"))
    m = write_manifest(tmp / "q.toml")
    store = tmp / "store"
    report = pipeline.build(
        BuildSpec.make(manifest=str(m), aiter_root=str(src), output_dir=str(tmp / "out"), jobs=2, publish_to=str(store))
    )
    assert report.ok and report.packaged is not None, [r.detail for r in report.modules]
    return tmp, src, m, tmp / "out", store, report


@pytest.fixture
def server() -> Iterator[Callable[..., str]]:
    """An HTTP server on 127.0.0.1 serving a dir; ``truncate`` makes it send half of each .tar.gz."""
    state: dict[str, Any] = {"dir": None, "truncate": False}

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *a: Any, **k: Any) -> None:
            super().__init__(*a, directory=state["dir"], **k)

        def log_message(self, *a: Any) -> None:
            pass

        def do_GET(self) -> None:
            if state["truncate"] and self.path.endswith(".tar.gz"):
                data = Path(state["dir"], self.path.lstrip("/")).read_bytes()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data[: len(data) // 2])
                self.close_connection = True
                return
            super().do_GET()

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()

    def serve(directory: Path, truncate: bool = False) -> str:
        state["dir"], state["truncate"] = str(directory), truncate
        return f"http://127.0.0.1:{httpd.server_address[1]}/"

    yield serve
    httpd.shutdown()
    httpd.server_close()


def files_of(out: Path) -> dict[str, bytes]:
    """OUT's published files (not .qola), which must be real files in real dirs."""
    found = {}
    for p in sorted(out.rglob("*")):
        rel = p.relative_to(out).as_posix()
        if rel.split("/")[0] in ENTRIES:
            assert not p.is_symlink(), rel
            if p.is_file():
                found[rel] = p.read_bytes()
    return found


def install_from(
    built: tuple[Path, Path, Path, Path, Path, BuildReport], source: str, name: str
) -> pipeline.BuildReport:
    tmp, src, m, _, _, _ = built
    return pipeline.build(
        BuildSpec.make(manifest=str(m), aiter_root=str(src), output_dir=str(tmp / name), jobs=2, prebuilt=source)
    )


@pytest.mark.slow
def test_publish_writes_a_deterministic_archive_named_by_the_key(
    built: tuple[Path, Path, Path, Path, Path, BuildReport], tmp_path: Path
) -> None:
    _tmp, _, _, out, store, report = built
    assert report.key is not None and report.packaged is not None
    data = json.loads((out / "manifest.json").read_text())
    assert data["build_key"] == report.key == report.packaged.key
    assert set(data["build_key_parts"]) >= {"manifest", "plan", "tree", "toolchain"}
    name = prebuilt.archive_name("qk", report.key)
    archive = store / name
    assert report.packaged.archive == archive
    assert (store / f"{name}.sha256").read_text() == f"{hashlib.sha256(archive.read_bytes()).hexdigest()}  {name}\n"
    assert json.loads((store / f"{name}.json").read_text())["build_key"] == report.key
    with tarfile.open(archive) as tar:
        members = tar.getmembers()
    assert [m.name for m in members] == sorted(m.name for m in members)
    assert all(
        m.mtime == 0 and m.uid == 0 and m.gid == 0 and not m.uname and (m.isfile() or m.isdir()) for m in members
    )
    again = run_qola("package", str(out), "--into", str(tmp_path), check=True)
    assert report.key in again.stdout
    assert (tmp_path / name).read_bytes() == archive.read_bytes()
    refused = run_qola("package", str(out), "--into", str(out / "lib"))
    assert refused.returncode == 2 and "into the output dir" in refused.stderr


@pytest.mark.slow
def test_prebuilt_from_a_dir_installs_without_compiling(
    built: tuple[Path, Path, Path, Path, Path, BuildReport],
) -> None:
    tmp, _, _, out, store, report = built
    assert report.key is not None and report.packaged is not None
    got = install_from(built, str(store), "from-dir")
    assert got.prebuilt is not None and got.compiled is None and not got.up_to_date
    assert got.key == report.key
    build_dir = tmp / "from-dir.build"
    assert not (build_dir / "build.ninja").exists() and not (build_dir / "obj").exists()
    assert files_of(tmp / "from-dir") == files_of(out)
    assert json.loads((tmp / "from-dir" / "manifest.json").read_text())["build_key"] == report.key
    audit = run_qola("audit", str(tmp / "from-dir"))
    assert audit.returncode == 0, audit.stderr
    assert not list(build_dir.glob(prebuilt.WORK_PREFIX + "*"))
    assert install_from(built, str(store), "from-dir").up_to_date  # OUT holds the key already


@pytest.mark.slow
def test_prebuilt_over_http_installs_without_compiling(
    built: tuple[Path, Path, Path, Path, Path, BuildReport], server: Callable[..., str]
) -> None:
    tmp, _, _, out, store, _report = built
    got = install_from(built, server(store), "from-http")
    assert got.prebuilt is not None and got.prebuilt.origin.startswith("http://127.0.0.1:")
    assert not (tmp / "from-http.build" / "build.ninja").exists()
    assert files_of(tmp / "from-http") == files_of(out)


@pytest.mark.slow
def test_missing_archive_falls_back_to_building_with_a_note(
    built: tuple[Path, Path, Path, Path, Path, BuildReport],
) -> None:
    tmp, src, m, _out, _, report = built
    assert report.key is not None and report.packaged is not None
    empty = tmp / "empty-store"
    empty.mkdir(exist_ok=True)
    notes = Notes()
    # the fixture's build dir: ninja finds the objects up to date (nothing compiles)
    got = pipeline.build(
        BuildSpec.make(
            manifest=str(m),
            aiter_root=str(src),
            output_dir=str(tmp / "fallback"),
            jobs=2,
            build_dir=str(tmp / "out.build"),
            prebuilt=str(empty),
        ),
        notes,
    )
    assert got.ok and got.prebuilt is None and got.compiled is not None and got.key == report.key
    assert any("no prebuilt archive" in n and "building" in n for n in notes.notes), notes.notes


# ---- refusals: OUT keeps its version ------------------------------------------------------------------


def members_of(archive: Path) -> list[tuple[tarfile.TarInfo, bytes]]:
    with tarfile.open(archive) as tar:
        return [(m, _read(tar, m)) for m in tar.getmembers()]


def write_store(
    store: Path, name: str, members: list[tuple[tarfile.TarInfo, bytes]], *, sha: str | None = None
) -> Path:
    """An archive of ``members`` ((TarInfo, bytes)) as ``store/name``, with a matching .sha256 (a writer of
    the shared store can write both) unless ``sha`` is given."""
    store.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    with (
        gzip.GzipFile(fileobj=buf, mode="wb", mtime=0) as gz,
        tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if info.isfile() else None)
    (store / name).write_bytes(buf.getvalue())
    digest = sha or hashlib.sha256(buf.getvalue()).hexdigest()
    (store / f"{name}.sha256").write_text(f"{digest}  {name}\n")
    return store / name


def info(name: str, data: bytes = b"", **kw: Any) -> tarfile.TarInfo:
    ti = tarfile.TarInfo(name)
    ti.size = len(data)
    for k, v in kw.items():
        setattr(ti, k, v)
    return ti


def tampered(built: tuple[Path, Path, Path, Path, Path, BuildReport], store: Path, how: str) -> str:
    """A copy of the good store, damaged ``how``."""
    _, _, _, _, good, report = built
    assert report.key is not None and report.packaged is not None
    name = prebuilt.archive_name("qk", report.key)
    shutil.copytree(good, store)
    archive = store / name
    members = members_of(archive)
    if how == "wrong-sha256":
        (store / f"{name}.sha256").write_text(f"{'0' * 64}  {name}\n")
    elif how == "truncated":
        archive.write_bytes(archive.read_bytes()[: archive.stat().st_size // 2])
    elif how == "truncated-consistent":  # the .sha256 matches the cut archive
        data = archive.read_bytes()[: archive.stat().st_size // 2]
        archive.write_bytes(data)
        (store / f"{name}.sha256").write_text(f"{hashlib.sha256(data).hexdigest()}  {name}\n")
    elif how == "dotdot":
        write_store(store, name, [*members, (info("lib/../../escaped.txt", b"x"), b"x")])
    elif how == "absolute":
        write_store(store, name, [*members, (info("/tmp/qola-absolute-escape", b"x"), b"x")])
    elif how == "symlink":
        link = info("lib/evil.so", type=tarfile.SYMTYPE, linkname="/etc/passwd")
        write_store(store, name, [*members, (link, b"")])
    elif how == "hardlink":
        link = info("include/evil.h", type=tarfile.LNKTYPE, linkname="lib/qk_module_softmax.so")
        write_store(store, name, [*members, (link, b"")])
    elif how == "extra-file":
        write_store(store, name, [*members, (info("lib/extra.so", b"\x7fELF"), b"\x7fELF")])
    elif how == "other-key":
        changed = []
        for ti, data in members:
            if ti.name == "manifest.json":
                doc = json.loads(data)
                doc["build_key"] = "f" * 64
                data = json.dumps(doc).encode()
                ti = info("manifest.json", data)
            changed.append((ti, data))
        write_store(store, name, changed)
    elif how == "pax-bomb":  # a 4 MiB name: a PAX header tar would hold in memory
        write_store(store, name, [*members, (info("lib/" + "x" * (4 << 20), b"x"), b"x")])
    elif how == "changed-library":
        changed = [(ti, data[:-1] + bytes([data[-1] ^ 1]) if ti.name.endswith(".so") else data) for ti, data in members]
        write_store(store, name, changed)
    return name


CASES = {
    "wrong-sha256": "sha256",
    "truncated": "sha256",
    "truncated-consistent": "not a readable tar.gz",
    "dotdot": "not a plain relative path",
    "absolute": "not a plain relative path",
    "symlink": "a symlink",
    "hardlink": "a hard link",
    "extra-file": "not recorded",
    "other-key": "records build key",
    "changed-library": "sha256",
    "pax-bomb": "header over",
}


@pytest.mark.slow
@pytest.mark.parametrize("how", sorted(CASES))
def test_a_damaged_or_hostile_archive_is_refused_and_out_keeps_its_version(
    built: tuple[Path, Path, Path, Path, Path, BuildReport], tmp_path: Path, how: str
) -> None:
    _tmp, _, _, _, good, report = built
    assert report.key is not None and report.packaged is not None
    out = tmp_path / "out"
    first = prebuilt.install(str(good), "qk", report.key, out, tmp_path / "work")
    before = files_of(out)
    bad = tmp_path / "bad-store"
    tampered(built, bad, how)
    with pytest.raises(QolaError, match=CASES[how]) as err:
        prebuilt.install(str(bad), "qk", report.key, out, tmp_path / "work")
    assert "Traceback" not in err.value.render() and err.value.hint
    assert first.out == out and files_of(out) == before
    assert sorted(p.name for p in (out / ".qola").iterdir()) == ["switch.lock"]
    assert not (tmp_path / "escaped.txt").exists() and not os.path.lexists("/tmp/qola-absolute-escape")


@pytest.mark.slow
def test_a_truncated_http_download_is_refused(
    built: tuple[Path, Path, Path, Path, Path, BuildReport], tmp_path: Path, server: Callable[..., str]
) -> None:
    _, _, _, _, good, report = built
    assert report.key is not None and report.packaged is not None
    out = tmp_path / "out"
    with pytest.raises(QolaError, match=r"truncated|broke off"):
        prebuilt.install(server(good, truncate=True), "qk", report.key, out, tmp_path / "work")
    assert not published(out)


@pytest.mark.slow
def test_the_build_command_refuses_a_hostile_store_and_installs_nothing(
    built: tuple[Path, Path, Path, Path, Path, BuildReport], tmp_path: Path
) -> None:
    _tmp, src, m, _, _, _ = built
    bad = tmp_path / "bad-store"
    tampered(built, bad, "symlink")
    out = tmp_path / "out"
    done = run_qola("build", "-m", str(m), "--aiter-root", str(src), "-o", str(out), "--prebuilt", str(bad))
    assert done.returncode == 2, done.stderr
    assert "a symlink: refused" in done.stderr and "hint:" in done.stderr and "Traceback" not in done.stderr
    assert not published(out) and not (out / "lib").exists()


def _read(tar: tarfile.TarFile, member: tarfile.TarInfo) -> bytes:
    """A member's bytes (nothing for what is not a regular file)."""
    if not member.isfile():
        return b""
    data = tar.extractfile(member)
    assert data is not None
    return data.read()
