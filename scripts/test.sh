#!/usr/bin/env bash
# Install what the test suite needs (hipcc, bubblewrap for sccache-dist's build servers and redis-server
# from Debian, qola with its test extras, ruff and mypy among them), lint (scripts/lint.sh), then run every test
# that does not need a GPU: the host suite, then the `rocm` tests (real AITER compiled for gfx942 and
# gfx950) inside the project's ROCm 7 environment (scripts/rocm7.sh: created once, cached), and the CLI's
# fast tests (marker `cli`) under every other Python pyproject.toml claims (scripts/pythons.sh).
# Extra arguments go to both pytest runs.
set -euo pipefail
cd "$(dirname "$0")/.."
START=$SECONDS
if ! command -v hipcc >/dev/null || ! command -v bwrap >/dev/null || ! command -v redis-server >/dev/null; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq hipcc bubblewrap redis-server >/dev/null
fi
python3 -m pip install -q -e '.[test]'
# the ROCm 7 chroot first: the host's CUDA remote-execution test runs buildbox and BuildGrid from it
bash scripts/rocm7.sh setup
# lint (ruff check, ruff format --check, mypy): seconds, and a failure says where
bash scripts/lint.sh
# qola's bytecode, compiled once: these boxes set PYTHONDONTWRITEBYTECODE=1, and each of the hundreds of
# `python -m qola` the tests start would compile what it imports again (an example plan: 1.2 s wall
# without, 0.7 s with); a .pyc whose source changed is ignored by Python itself. (The ROCm 7 chroot's
# Python runs without that variable and writes its own.)
python3 -m compileall -q -j 0 qola
# each set's wall and CPU (its processes' user + system, from this shell's children's times), printed
# at the end: the budget is kept by a check, not by hope (docs/benchmarks.md has the current table)
cpu_s() { awk -v hz="$(getconf CLK_TCK)" '{printf "%d", ($16 + $17) / hz}' "/proc/$$/stat"; }
timed() {
  local name=$1 t0=$SECONDS c0 rc=0
  shift
  c0=$(cpu_s)
  "$@" || rc=$?
  SUMMARY+=("$(printf '%-34s %6d s wall %7d s CPU   exit %d' "$name" $((SECONDS - t0)) $(($(cpu_s) - c0)) "$rc")")
  return "$rc"
}
SUMMARY=("$(printf '%-34s %6d s wall %7s         exit 0' "install, ROCm 7 chroot, lint" $((SECONDS - START)) -)")
# both sets run whatever the first one gives (a failure of the host set must not hide the ROCm set's
# outcome); the script fails at the end when either did
host=0
# side by side, a test file's tests on one worker (pytest-xdist; module fixtures are made once); the
# workers default to one per core (QOLA_TEST_WORKERS=N to choose; 0: one process, as before)
timed "host set" python3 -m pytest -m "not gpu and not rocm" -n "${QOLA_TEST_WORKERS:-auto}" --dist loadfile --durations=20 "$@" || host=$?
# the CLI's fast tests under 3.10, 3.12, 3.13 (the main run is 3.11); venvs cached in ~/.cache/qola-test
pythons=0
timed "other Pythons' CLI tests" bash scripts/pythons.sh "$@" || pythons=$?
# the `rocm` tests, `ck` ones included (real CK fMHA kernels compiled for gfx942 and gfx950; their time:
# docs/benchmarks.md, "How long the test command takes")
rocm=0
timed "ROCm set" bash scripts/rocm7.sh run python -m pytest -m rocm --durations=20 "$@" || rocm=$?
echo "scripts/test.sh: what each set took (this box: $(nproc) CPUs)"
printf '  %s\n' "${SUMMARY[@]}" "$(printf '%-34s %6d s wall' "the whole command" $((SECONDS - START)))"
if [ "$host" -ne 0 ] || [ "$rocm" -ne 0 ] || [ "$pythons" -ne 0 ]; then
  echo "scripts/test.sh: host tests exit $host, ROCm tests exit $rocm, other Pythons' CLI tests exit $pythons" >&2
  exit 1
fi
