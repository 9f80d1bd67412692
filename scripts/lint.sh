#!/usr/bin/env bash
# The lint step of CI (scripts/test.sh runs it before the tests): ruff (lint rules and format),
# mypy, each with its config in pyproject.toml, and the size bounds (scripts/sizes.py).
# Self-sufficient: it installs what its checks need, pyproject.toml's `lint` extra (ruff, mypy and every
# module mypy imports: qola's dependencies, pytest, hypothesis, tomli for the 3.10 floor), into the
# Python it runs with, once per pyproject.toml (a stamp file in that environment remembers it).
# Fix what it reports with `ruff check --fix` and `ruff format`.
set -euo pipefail
cd "$(dirname "$0")/.."
stamp="$(python3 -c 'import sys; print(sys.prefix)')/.qola-lint-$(sha256sum pyproject.toml | cut -c1-16)"
if [ ! -e "$stamp" ]; then
  python3 -m pip install -q -e '.[lint]'
  touch "$stamp"
fi
python3 -m ruff check .
python3 -m ruff format --check .
python3 -m mypy
python3 scripts/sizes.py  # no module over 500 lines, no function over 60, none with more than 6 parameters
