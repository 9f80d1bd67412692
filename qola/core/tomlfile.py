"""The one TOML reader: the standard library's ``tomllib`` (Python 3.11+) or its backport ``tomli``
(Python 3.10, a dependency there: pyproject.toml), the same parser under both names. Every TOML qola
reads (manifests, usage fragments, the registry) is parsed here; callers give the text, read with
the checks of :mod:`qola.core.inputs` or :mod:`qola.plan.tree.files`."""

from __future__ import annotations

import sys
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib as _toml
else:  # Python 3.10: the backport (the same code, published as tomli)
    import tomli as _toml

TOMLDecodeError = _toml.TOMLDecodeError  # what a malformed text raises (a ValueError)


def loads(text: str) -> dict[str, Any]:
    """The tables of ``text`` (:class:`TOMLDecodeError` when it is not TOML)."""
    tables: dict[str, Any] = _toml.loads(text)  # typed here: mypy checks the 3.10 branch too
    return tables
