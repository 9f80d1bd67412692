#!/usr/bin/env bash
# Install what the test suite needs (hipcc, bubblewrap for sccache-dist's build servers and redis-server
# from Debian, qola with its test extras, ruff and mypy among them), lint (scripts/lint.sh), then run every test
# that does not need a GPU: the host suite and, beside it, the `rocm` tests (real AITER compiled for
# gfx942 and gfx950) inside the project's ROCm 7 environment (scripts/rocm7.sh: created once, cached), then
# the CLI's fast tests (marker `cli`) under every other Python pyproject.toml claims (scripts/pythons.sh).
# Extra arguments go to every pytest run.
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
# each set's wall and CPU (its processes' user + system: the children's times of the subshell that ran
# it), printed at the end: the budget is kept by a check, not by hope (docs/benchmarks.md has the current
# table). measured NAME CMD...: runs CMD in this subshell, writes NAME's line into $SUMS.
SUMS=$(mktemp -d)
trap 'rm -rf "$SUMS"' EXIT
measured() {
  local name=$1 t0=$SECONDS rc=0 me=$BASHPID
  shift
  "$@" || rc=$?
  printf '%-34s %6d s wall %7d s CPU   exit %d\n' "$name" $((SECONDS - t0)) \
    "$(awk -v hz="$(getconf CLK_TCK)" '{printf "%d", ($16 + $17) / hz}' "/proc/$me/stat")" "$rc" >"$SUMS/$name"
  return "$rc"
}
printf '%-34s %6d s wall\n' "install, ROCm 7 chroot, lint" $((SECONDS - START)) >"$SUMS/0"
# the `rocm` tests, `ck` ones included (real CK fMHA kernels compiled for gfx942 and gfx950), beside the
# host set: neither keeps both cores busy alone (their time: docs/benchmarks.md, "How long the test
# command takes"); its output is kept in a file and shown when the host set and the others are done
echo "scripts/test.sh: the ROCm set runs beside the host set; its output follows theirs"
(measured "ROCm set" bash scripts/rocm7.sh run python -m pytest -m rocm --durations=20 "$@" >"$SUMS/rocm.log" 2>&1) &
rocm_pid=$!
# every set runs whatever another gives (a failure of the host set must not hide the ROCm set's outcome);
# the script fails at the end when any did. The host set: side by side, a test file's tests on one worker
# (pytest-xdist; module fixtures are made once); the workers default to one per core
# (QOLA_TEST_WORKERS=N to choose; 0: one process)
host=0
(measured "host set" python3 -m pytest -m "not gpu and not rocm" -n "${QOLA_TEST_WORKERS:-auto}" --dist loadfile \
  --durations=20 "$@") || host=$?
# the CLI's fast tests under 3.10, 3.12, 3.13 (the main run is 3.11); venvs cached in ~/.cache/qola-test
pythons=0
(measured "other Pythons' CLI tests" bash scripts/pythons.sh "$@") || pythons=$?
rocm=0
wait "$rocm_pid" || rocm=$?
echo "scripts/test.sh: the ROCm set's output"
cat "$SUMS/rocm.log"
echo "scripts/test.sh: what each set took (this box: $(nproc) CPUs; the ROCm set beside the others)"
for f in 0 "host set" "other Pythons' CLI tests" "ROCm set"; do  # a set that wrote no line ended before it could
  sed 's/^/  /' "$SUMS/$f" 2>/dev/null || printf '  %-34s (no figures: it ended before it could write them)\n' "$f"
done
printf '  %-34s %6d s wall\n' "the whole command" $((SECONDS - START))
if [ "$host" -ne 0 ] || [ "$rocm" -ne 0 ] || [ "$pythons" -ne 0 ]; then
  echo "scripts/test.sh: host tests exit $host, ROCm tests exit $rocm, other Pythons' CLI tests exit $pythons" >&2
  exit 1
fi
