"""The build key and the cheap checks of prebuilt archives (issue 13, moved from test_prebuilt.py): no
compile. Formatting, paths, jobs
and the launcher leave it alone; what changes the output changes it; its material round-trips."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from support.common import KERNELS, run_qola
from support.softmax_manifest import write_manifest

from qola.core.errors import QolaError
from qola.pipeline import run as pipeline
from qola.pipeline.run import BuildSpec
from qola.store import download, prebuilt
from qola.store.key import BuildKey
from qola.toolchain import Toolchain

REFORMATTED = """[[modules]]
name    =    'module_softmax'

[build]
# a comment, and the keys in another order
architectures = [ 'sm_90' ]
jobs = 3
launcher = "sccache"

[qola]
namespace='qk'
"""


def fake_toolchain(version: str = "13.0", compiler: str = "/usr/bin/true") -> Toolchain:
    return Toolchain(
        "cuda",
        compiler,
        version,
        f"Cuda compilation tools, release {version}",
        "ab" * 32,
        ("sm_90",),
        "/usr/bin/true",
        {},
        base_flags=("-O3", "-gencode", "arch=compute_90,code=sm_90"),
        lang_args=("-x", "cu"),
    )


@pytest.fixture
def key_of(monkeypatch: pytest.MonkeyPatch) -> KeyOf:
    """The build key of a manifest and tree through the pipeline (toolchain faked: no compiler needed)."""
    key = KeyOf()
    monkeypatch.setattr(pipeline, "_toolchain", lambda *a, **k: key.tcs["tc"])
    return key


class KeyOf:
    """``key_of(m, tree, **spec)``: the build key; ``tcs["tc"]`` is the toolchain the pipeline sees."""

    def __init__(self) -> None:
        self.tcs = {"tc": fake_toolchain()}

    def __call__(self, m: Path, tree: Path, **kw: Any) -> BuildKey:
        return pipeline.build_key(
            BuildSpec.make(manifest=str(m), aiter_root=str(tree), env={"PATH": "/usr/bin:/bin"}, **kw)
        )


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    dst = tmp_path / "kernels"
    shutil.copytree(KERNELS, dst, ignore=shutil.ignore_patterns("hsa", "__pycache__"))
    return dst


# ---- the key: cheap, no compile ---------------------------------------------------------------------


def test_key_ignores_formatting_paths_jobs_and_launcher(tmp_path: Path, tree: Path, key_of: KeyOf) -> None:
    base = key_of(write_manifest(tmp_path / "a.toml"), tree)
    (tmp_path / "sub").mkdir()
    other = tmp_path / "sub" / "b.toml"
    other.write_text(REFORMATTED)
    moved = tmp_path / "elsewhere" / "tree"
    shutil.copytree(tree, moved)
    again = key_of(other, moved)
    assert again.key == base.key, {k: v for k, v in again.digests.items() if base.digests[k] != v}
    text = json.dumps(base.explain())
    for path in (str(tmp_path), str(tree), str(moved)):
        assert path not in text  # no absolute path of the tree (or the manifest) in the inputs
    assert "<tree>/csrc/kernels/softmax.cu" in base.parts["tree"]["files"]


@pytest.mark.parametrize(
    "change, part",
    [
        ("arch", "plan"),
        ("mode", "plan"),
        ("flag", "plan"),
        ("source", "tree"),
        ("header", "tree"),
        ("table", "tree"),
        ("compiler", "toolchain"),
        ("isolation", "build"),
    ],
)
def test_key_changes_with_what_changes_the_output(
    tmp_path: Path, tree: Path, key_of: KeyOf, change: str, part: str
) -> None:
    m = write_manifest(tmp_path / "q.toml", module_extra='mode = "pybind"\n')  # beats --mode: a valid mode change
    base = key_of(m, tree)
    kw: dict[str, Any] = {}
    if change == "arch":
        write_manifest(m).write_text(m.read_text().replace('"sm_90"', '"sm_80"'))
    elif change == "mode":
        kw["mode"] = "cpp_itfs"  # the default mode (manifest.json's "mode")
    elif change == "flag":
        write_manifest(m, module_extra='mode = "pybind"\nflags_extra_hip = ["-DQK_SOFTMAX_FAST_EXP=1"]\n')
    elif change == "source":
        with open(tree / "csrc/kernels/softmax.cu", "a") as fh:
            fh.write("// edited\n")
    elif change == "header":
        with open(tree / "csrc/include/softmax.h", "a") as fh:
            fh.write("// edited\n")
    elif change == "table":
        table = tree / "aiter/jit/optCompilerConfig.json"
        table.write_text(table.read_text() + "\n")
    elif change == "compiler":
        key_of.tcs["tc"] = fake_toolchain(version="12.8")
    elif change == "isolation":
        kw["isolate"] = False
    changed = key_of(m, tree, **kw)
    assert changed.key != base.key
    assert changed.digests[part] != base.digests[part]


def test_key_material_round_trips_and_rehashes_the_tree(
    tmp_path: Path, tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The incremental path keeps the material in its record and rehashes only the tree's files."""
    from qola.store import key as buildkey

    monkeypatch.setattr(pipeline, "_toolchain", lambda *a, **k: fake_toolchain())
    spec = BuildSpec.make(
        manifest=str(write_manifest(tmp_path / "q.toml")), aiter_root=str(tree), env={"PATH": "/usr/bin:/bin"}
    )
    prepared = pipeline.plan(spec)
    material = pipeline._material(prepared, prepared.plan, fake_toolchain(), True, spec.environ())
    again = buildkey.Material.of(json.loads(json.dumps(material.to_json())))
    before = material.key()
    assert again.key().key == before.key == pipeline.build_key(spec).key
    with open(tree / "csrc/include/softmax.h", "a") as fh:
        fh.write("// edited\n")
    after = again.key()
    assert after.key == pipeline.build_key(spec).key != before.key
    assert [k for k in after.digests if after.digests[k] != before.digests[k]] == ["tree"]


def test_publish_into_the_output_dir_is_refused_before_anything_runs(tmp_path: Path, tree: Path) -> None:
    spec = BuildSpec.make(
        manifest=str(write_manifest(tmp_path / "q.toml")),
        aiter_root=str(tree),
        output_dir=str(tmp_path / "out"),
        publish_to=str(tmp_path / "out" / "store"),
    )
    with pytest.raises(QolaError, match="prebuilt store"):
        pipeline.build(spec)
    assert not (tmp_path / "out").exists()


def test_plan_key_cli_prints_the_key_and_its_inputs(tmp_path: Path, tree: Path) -> None:
    if not shutil.which("nvcc"):
        pytest.skip("needs nvcc")
    m = write_manifest(tmp_path / "q.toml")
    key = run_qola("plan", "-m", str(m), "--aiter-root", str(tree), "--key", check=True).stdout.strip()
    explained = json.loads(
        run_qola("plan", "-m", str(m), "--aiter-root", str(tree), "--key", "--json", check=True).stdout
    )
    assert len(key) == 64 and explained["build_key"] == key
    assert set(explained["parts"]) == {"build", "env", "manifest", "plan", "python", "qola", "toolchain", "tree"}


def test_a_huge_sparse_file_under_a_source_dir_is_keyed_by_its_size_not_hashed(tmp_path: Path, tree: Path) -> None:
    """A 2 TB sparse file under a source dir: the old key hashed all of it (past 300 s); its size
    is checked before hashing now, and the file still keys the build (its stat does)."""
    if not shutil.which("nvcc"):
        pytest.skip("needs nvcc")

    huge = tree / "csrc" / "kernels" / "huge.bin"
    with open(huge, "wb") as f:
        f.truncate(2 << 40)
    m = write_manifest(tmp_path / "q.toml")
    # no memory cap here (support.limited's would change nvcc's probes, which are cached); a hang here
    # is the sparse file hashed
    proc = run_qola("plan", "-m", str(m), "--aiter-root", str(tree), "--key", timeout=300)
    assert proc.returncode == 0 and len(proc.stdout.strip()) == 64, proc.stderr
    from qola.store.key import MAX_TREE_FILE, hash_files

    first = hash_files([(str(tree / "csrc" / "kernels"), True)], [str(tree)])
    label = next(k for k in first if k.endswith("huge.bin"))
    assert (first[label] or "").startswith("unhashed:2199023255552:") and MAX_TREE_FILE < 2 << 40
    with open(huge, "r+b") as f:
        f.truncate((2 << 40) + 1)
    assert hash_files([(str(tree / "csrc" / "kernels"), True)], [str(tree)])[label] != first[label]


def test_sha256_lines_and_member_names_are_checked() -> None:
    good = "a" * 64
    assert download.expected_sha256(f"{good}  x.tar.gz\n".encode(), "x.tar.gz", "w") == good
    assert download.expected_sha256(f"{good.upper()}\n".encode(), "x.tar.gz", "w") == good
    for bad in (b"", b"nothex  x.tar.gz", f"{good}  y.tar.gz".encode(), b"\xff" * 70):
        with pytest.raises(QolaError):
            download.expected_sha256(bad, "x.tar.gz", "w")


def test_missing_archive_and_unsupported_source(tmp_path: Path) -> None:
    (tmp_path / "store").mkdir()
    with pytest.raises(prebuilt.Missing):
        prebuilt.install(str(tmp_path / "store"), "qk", "0" * 64, tmp_path / "out", tmp_path / "work")
    with pytest.raises(prebuilt.Missing):
        prebuilt.install("http://127.0.0.1:9/store", "qk", "0" * 64, tmp_path / "out", tmp_path / "work", timeout=5)
    with pytest.raises(QolaError, match="only a directory or an http"):
        prebuilt.install("ftp://example.invalid/store", "qk", "0" * 64, tmp_path / "out", tmp_path / "work")
    assert not (tmp_path / "out").exists()
