"""One entry of AITER's module table (``aiter/jit/optCompilerConfig.json``) for the small trees tests
write: AITER's keys with empty defaults, ``fields`` over them."""

from __future__ import annotations

from typing import Any


def entry(**fields: Any) -> dict[str, Any]:
    """A module's entry: no sources, flags or includes, not verbose, torch left out, then ``fields``."""
    base: dict[str, Any] = {
        "srcs": [],
        "flags_extra_cc": [],
        "flags_extra_hip": [],
        "extra_ldflags": "None",
        "extra_include": [],
        "verbose": "False",
        "torch_exclude": "True",
    }
    return {**base, **fields}
