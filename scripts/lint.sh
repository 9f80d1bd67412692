#!/usr/bin/env bash
# The lint step of CI (scripts/test.sh runs it before the tests): ruff (lint rules and format),
# mypy, each with its config in pyproject.toml, and the size bounds (scripts/sizes.py). Installs ruff and mypy when they are missing (they
# are also in the `test` extras). Fix what it reports with `ruff check --fix` and `ruff format`.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! python3 -m ruff --version >/dev/null 2>&1 || ! python3 -m mypy --version >/dev/null 2>&1; then
  python3 -m pip install -q 'ruff==0.17.6' 'mypy==2.4.1'  # as pyproject.toml's test extras
fi
python3 -m ruff check .
python3 -m ruff format --check .
python3 -m mypy
python3 scripts/sizes.py  # no module over 500 lines, no function over 60, none with more than 6 parameters
