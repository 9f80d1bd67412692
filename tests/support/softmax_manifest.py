"""The example tree's one-module manifest (module_softmax, sm_90) of the prebuilt and build-key tests."""

from __future__ import annotations

from pathlib import Path

MANIFEST = """# the example tree, one module
[qola]
namespace = "qk"   # library prefix

[build]
architectures = ["sm_90"]
{build_extra}
[[modules]]
name = "module_softmax"
{module_extra}"""


def write_manifest(path: Path, build_extra: str = "", module_extra: str = "") -> Path:
    path.write_text(MANIFEST.format(build_extra=build_extra, module_extra=module_extra))
    return path
