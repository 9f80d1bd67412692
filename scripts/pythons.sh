#!/usr/bin/env bash
# The CLI's fast tests (marker `cli`: plan, dry run, refusals and exit codes, manifest and usage-fragment
# parsing) under every Python version qola claims besides the one running the main suite.
# The claimed versions have one home, pyproject.toml: requires-python's floor and the
# `Programming Language :: Python :: 3.X` classifiers (the floor must be the lowest classifier).
# Each version's interpreter is pyenv's (`pyenv root`/versions/3.X.*) or `python3.X` on PATH; its venv,
# qola's dependencies and the `cli-tests` extra, is cached in ~/.cache/qola-test/py<version>-<hash of
# pyproject.toml> (a second run reuses it). The tests import this checkout (PYTHONPATH), not the copy
# installed in the venv.
# A claimed version this machine lacks fails the run, unless it is listed in QOLA_PYTHONS_SKIP
# (space-separated, e.g. QOLA_PYTHONS_SKIP="3.13"): an explicit opt-out, printed.
# Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
floor=$(sed -n 's/^requires-python = ">=\(3\.[0-9]*\)"$/\1/p' pyproject.toml)
claimed=$(grep -o 'Programming Language :: Python :: 3\.[0-9]*' pyproject.toml | sed 's/.*:: //' | sort -t. -k2 -n -u)
if [ -z "$floor" ] || [ "$(head -n1 <<<"$claimed")" != "$floor" ]; then
  echo "scripts/pythons.sh: requires-python's floor ($floor) is not the lowest classifier ($(head -n1 <<<"$claimed"))" >&2
  exit 1
fi
main=$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
key=$(sha256sum pyproject.toml | cut -c1-16)
cache="${XDG_CACHE_HOME:-$HOME/.cache}/qola-test"
root=$(pyenv root 2>/dev/null || true)
# only the files that hold `cli` tests are collected (collecting the whole suite takes longer than some runs)
mapfile -t files < <(grep -rl --include='test_*.py' '^@pytest.mark.cli$' tests | sort)
failed=""
for v in $claimed; do
  [ "$v" = "$main" ] && continue  # the main suite runs under it
  if [[ " ${QOLA_PYTHONS_SKIP:-} " == *" $v "* ]]; then
    echo "scripts/pythons.sh: Python $v skipped (QOLA_PYTHONS_SKIP)" >&2
    continue
  fi
  py=""
  if [ -n "$root" ]; then
    py=$(ls -d "$root"/versions/"$v".[0-9]*/bin/python 2>/dev/null | sort -t. -k3 -n | tail -n1 || true)
  fi
  [ -n "$py" ] || py=$(command -v "python$v" || true)
  if [ -z "$py" ]; then
    echo "scripts/pythons.sh: Python $v is claimed (pyproject.toml) but not installed here (pyenv install $v," \
      "or QOLA_PYTHONS_SKIP=\"$v\" to skip it)" >&2
    failed="$failed $v"
    continue
  fi
  venv="$cache/py$("$py" -c 'import platform; print(platform.python_version())')-$key"
  if [ ! -x "$venv/bin/python" ] || [ ! -e "$venv/.ready" ]; then
    rm -rf "$venv"
    "$py" -m venv "$venv"
    "$venv/bin/python" -m pip install -q --disable-pip-version-check '.[cli-tests]'
    touch "$venv/.ready"
  fi
  echo "scripts/pythons.sh: Python $v ($venv)" >&2
  "$venv/bin/python" -m compileall -q -j 0 qola  # its bytecode once (scripts/test.sh says why)
  # the venv's bin first: the tests run ninja and `python -m qola` as a user would
  PATH="$venv/bin:$PATH" PYTHONPATH="$PWD" "$venv/bin/python" -m pytest -q -m cli -p no:cacheprovider --durations=5 \
    "${files[@]}" "$@" \
    || failed="$failed $v"
done
if [ -n "$failed" ]; then
  echo "scripts/pythons.sh: failed under Python$failed" >&2
  exit 1
fi
