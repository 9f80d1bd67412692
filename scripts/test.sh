#!/usr/bin/env bash
# Install what the test suite needs (hipcc from Debian, qola with its test extras), then run every test
# that does not need a GPU. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v hipcc >/dev/null 2>&1; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq hipcc >/dev/null
fi
python3 -m pip install -q -e '.[test]'
python3 -m pytest -m "not gpu" "$@"
