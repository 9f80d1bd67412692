#!/usr/bin/env bash
# A ROCm 7 build environment for qola's `rocm` tests: Debian unstable's hipcc 7.0.2
# (HIP 6.4, clang 21; targets gfx942 and gfx950) in a chroot, created once and cached.
#
#   scripts/rocm7.sh setup            create the chroot if it is missing or stale (~2-3 min, ~2 GB); the
#                                     tools' output goes to setup.log beside it, shown only on a failure
#   scripts/rocm7.sh run CMD [ARG..]  run CMD inside it, in the current directory
#   scripts/rocm7.sh path             print where the chroot lives
#
# The chroot lives in $QOLA_ROCM7_ROOT (default ~/.cache/qola-rocm7/sid). `run` works in a
# private mount namespace (unshare -m): the project, qola's test cache and shared/ beside the
# project are bind-mounted at the same absolute paths (and $QOLA_CACHE_DIR, qola's compile cache,
# when set: named inside too), with /proc and /dev; the mounts vanish
# with the command, even when it is killed. More directories: QOLA_ROCM7_BIND="/dir1:/dir2". Inside, a venv (/opt/qola-venv) holds qola's
# dependencies, the test tools and AITER's generator requirements; qola itself is the
# bind-mounted project, importable through PYTHONPATH (the checkout's root holds the package). Needs root (debootstrap, chroot, mount).
set -euo pipefail

RECIPE=3   # bump when the package lists below change: a stale chroot is rebuilt
APT_PKGS=(hipcc python3 python3-venv python3-dev ninja-build g++ git ca-certificates cmake make)
# qola's own dependencies + test tools + what AITER's generators import (setuptools,
# packaging, jinja2, pandas for its tuned-config merge)
PIP_PKGS=("ninja>=1.11" "pyelftools>=0.30" "rich>=13" "pydantic>=2.5" "pybind11>=2.11"
          pytest hypothesis setuptools packaging jinja2 pandas)

# issue 26's loopback REAPI service (tests/support/remote_stack.py): buildbox (trexe, casd, worker, runners),
# PostgreSQL for BuildGrid's scheduler, and BuildGrid itself in its own venv (its pins are not
# qola's). Added to an existing chroot by `setup` (and `run`) without rebuilding it; own marker.
# Also `patch`: ROCm/ck-jit's `full` build runs it to put its codegen hints on CK's generator.
REMOTE_RECIPE=2
REMOTE_APT=(buildbox postgresql patch)
REMOTE_PIP=("buildgrid==0.9.1")

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE=${XDG_CACHE_HOME:-$HOME/.cache}
ROOT=${QOLA_ROCM7_ROOT:-$CACHE/qola-rocm7/sid}
TEST_CACHE=${QOLA_TEST_CACHE:-$CACHE/qola-test}
APT=(-o Acquire::Check-Valid-Until=false -o APT::Install-Recommends=false -qq)

SETUP_LOG=${QOLA_ROCM7_LOG:-$(dirname "$ROOT")/setup.log}

die() { echo "rocm7.sh: $*" >&2; exit 2; }
log() { echo "rocm7.sh: $*" >&2; }

# Run "$@" with its output (debootstrap, apt, debconf and pip chatter that reads like errors) appended
# to $SETUP_LOG; only when it fails are the log's last 40 lines shown.
quietly() {
  mkdir -p "$(dirname "$SETUP_LOG")"
  "$@" >>"$SETUP_LOG" 2>&1 && return 0
  local rc=$?
  echo "rocm7.sh: '$1' failed (exit $rc); the last lines of $SETUP_LOG:" >&2
  tail -n 40 "$SETUP_LOG" >&2
  return $rc
}

need_root() {
  [ "$(id -u)" -eq 0 ] || die "needs root (debootstrap, chroot and bind mounts); run it with sudo"
}

is_ready() { [ -f "$ROOT/.qola-recipe" ] && [ "$(cat "$ROOT/.qola-recipe")" = "$RECIPE" ]; }

# Mount what a command inside needs, in the current (private) mount namespace.
mount_into() {
  local root=$1
  mount -t proc proc "$root/proc"
  mount --rbind /dev "$root/dev"
  local p
  for p in "$@"; do
    [ "$p" = "$root" ] && continue
    [ -e "$p" ] || continue
    mkdir -p "$root$p"
    mount --bind "$p" "$root$p"
  done
}

remote_ready() { [ -f "$ROOT/.qola-remote-recipe" ] && [ "$(cat "$ROOT/.qola-remote-recipe")" = "$REMOTE_RECIPE" ]; }

# apt-get install the packages named by the variable $2 (APT_LIST, REMOTE_APT_LIST) into the chroot at $1
chroot_apt() {
  unshare -m --propagation private bash -euo pipefail -c '
    root=$1; list=$2
    mount -t proc proc "$root/proc"
    chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive \
      bash -euo pipefail -c "apt-get $APT_OPTS update && apt-get $APT_OPTS install -y ${!list} >/dev/null"
  ' _ "$1" "$2"
}

# pip install $3... into the venv $2 (made if missing) inside the chroot at $1, from the host's index
chroot_pip() {
  local root=$1 venv=$2 index
  shift 2
  index=$(python3 -m pip config get global.index-url 2>/dev/null || true)
  chroot "$root" /usr/bin/env -i PATH=/usr/bin:/bin PIP_CERT=/etc/qola-host-ca.crt \
    ${index:+PIP_INDEX_URL=$index} PIP_DISABLE_PIP_VERSION_CHECK=1 \
    bash -euo pipefail -c 'venv=$1; shift; [ -x "$venv/bin/pip" ] || python3 -m venv "$venv"
      "$venv/bin/pip" install -q "$@"' _ "$venv" "$@"
}

# the remote-execution packages, into the ready chroot (seconds when apt's lists are fresh)
remote_extras() {
  remote_ready && return 0
  local start=$SECONDS
  log "adding buildbox, postgresql and BuildGrid (issue 26's loopback REAPI service) and patch (ck-jit)"
  quietly chroot_apt "$ROOT" REMOTE_APT_LIST || die "apt-get of the remote-execution packages failed"
  quietly chroot_pip "$ROOT" /opt/qola-bgd-venv "${REMOTE_PIP[@]}" || die "pip install buildgrid failed"
  echo "$REMOTE_RECIPE" >"$ROOT/.qola-remote-recipe"
  log "remote-execution packages ready in $((SECONDS - start)) s"
}

setup() {
  need_root
  is_ready && { remote_extras; view_ready || rocm_view; return 0; }
  command -v debootstrap >/dev/null || quietly bash -c 'apt-get update -qq && apt-get install -y -qq debootstrap' \
    || die "apt-get install debootstrap failed"
  local parent tmp start=$SECONDS
  parent=$(dirname "$ROOT")
  mkdir -p "$parent"
  tmp=$(mktemp -d "$parent/.building-XXXXXX")
  chmod 755 "$tmp"
  trap 'rm -rf --one-file-system "$tmp"' EXIT
  : >"$SETUP_LOG"
  log "creating the ROCm 7 chroot in $ROOT (debootstrap sid, minbase; its output: $SETUP_LOG)"
  quietly debootstrap --variant=minbase sid "$tmp" || die "debootstrap failed"
  # the host's CA bundle: pip inside talks to the registries the host is configured for
  cp /etc/ssl/certs/ca-certificates.crt "$tmp/etc/qola-host-ca.crt"
  quietly chroot_apt "$tmp" APT_LIST || die "apt-get inside the chroot failed"
  log "installing Python packages into /opt/qola-venv"
  quietly chroot_pip "$tmp" /opt/qola-venv "${PIP_PKGS[@]}" || die "pip inside the chroot failed"
  echo "$RECIPE" >"$tmp/.qola-recipe"
  rm -rf --one-file-system "$ROOT"
  mv "$tmp" "$ROOT"
  trap - EXIT
  log "ready in $((SECONDS - start)) s: $(du -sh "$ROOT" | cut -f1)"
  remote_extras
  rocm_view
}
# A ROCm-layout view of Debian's ROCm at /opt/rocm inside the chroot (links only): bin/ (hipcc and
# ROCm's tools), include/ with ROCm's headers alone, lib/ with the HIP runtime and LLVM, amdgcn/ (the
# device libraries), share/hip (the version clang reads). Tools that take a ROCm root and derive
# paths from it work on it as on AMD's packages: ck-jit (ROCM_PATH unset -> /opt/rocm) builds its fake
# ROCm from it and passes `-isystem <root>/include`, which with Debian's root /usr would put
# /usr/include before libstdc++'s headers (`#include_next <math.h>` then fails).
VIEW_RECIPE=1
view_ready() { [ -f "$ROOT/opt/rocm/.qola-view" ] && [ "$(cat "$ROOT/opt/rocm/.qola-view")" = "$VIEW_RECIPE" ]; }
rocm_view() {
  local v=$ROOT/opt/rocm f
  rm -rf --one-file-system "$v"
  mkdir -p "$v/bin" "$v/include" "$v/lib" "$v/share"
  for f in "$ROOT"/usr/bin/hip* "$ROOT"/usr/bin/amdclang* "$ROOT"/usr/bin/roc*; do
    [ -e "$f" ] && ln -s "/usr/bin/${f##*/}" "$v/bin/"
  done
  for f in hip hsa amd_comgr; do [ -e "$ROOT/usr/include/$f" ] && ln -s "/usr/include/$f" "$v/include/"; done
  for f in "$ROOT"/usr/lib/x86_64-linux-gnu/lib{amdhip64,hsa-runtime64,amd_comgr}.so*; do
    [ -e "$f" ] && ln -s "/usr/lib/x86_64-linux-gnu/${f##*/}" "$v/lib/"
  done
  for f in "$ROOT"/usr/lib/llvm-*; do ln -s "/usr/lib/${f##*/}" "$v/lib/"; done
  f=$(cd "$ROOT" && ls -d usr/lib/llvm-*/lib/clang/*/amdgcn 2>/dev/null | sort -V | tail -n 1)
  [ -n "$f" ] && ln -s "/$f" "$v/amdgcn"
  [ -e "$ROOT/usr/share/hip" ] && ln -s /usr/share/hip "$v/share/hip"
  echo "$VIEW_RECIPE" >"$v/.qola-view"
}
export APT_OPTS="${APT[*]}" APT_LIST="${APT_PKGS[*]}" REMOTE_APT_LIST="${REMOTE_APT[*]}"

run() {
  need_root
  is_ready || setup
  remote_ready || remote_extras
  view_ready || rocm_view
  [ $# -gt 0 ] || die "run: give a command"
  local shared cc=""
  shared=$(cd "$REPO/.." && pwd)/shared
  mkdir -p "$TEST_CACHE"
  # qola's compile cache, when the caller names one (QOLA_CACHE_DIR: the test command's kept between
  # runs): bound at its own path and named inside, as the host's tests use it
  if [ -n "${QOLA_CACHE_DIR:-}" ]; then
    mkdir -p -m 700 "$QOLA_CACHE_DIR"
    cc=$(cd "$QOLA_CACHE_DIR" && pwd)
  fi
  # shellcheck disable=SC2016
  exec unshare -m --propagation private bash -euo pipefail -c '
    root=$1 repo=$2 cache=$3 shared=$4 cwd=$5 cc=$6; shift 6
    '"$(declare -f mount_into)"'
    IFS=: read -r -a more <<<"${QOLA_ROCM7_BIND:-}"
    mount_into "$root" "$repo" "$cache" "$shared" ${cc:+"$cc"} "${more[@]}"
    # Debian keeps the AMDGPU device libraries in clang'"'"'s resource dir, not under $ROCM_PATH: a ROCM_PATH
    # that points elsewhere (ck-jit'"'"'s fake ROCm home) would hide them from hipcc. Name them once here.
    devlib=$(cd "$root" && ls -d usr/lib/llvm-*/lib/clang/*/amdgcn/bitcode 2>/dev/null | sort -V | tail -n 1)
    exec chroot "$root" /usr/bin/env -i HOME=/root LANG=C.UTF-8 TERM="${TERM:-dumb}" \
      ${devlib:+HIP_DEVICE_LIB_PATH=/$devlib} \
      PATH=/opt/qola-venv/bin:/usr/local/bin:/usr/bin:/bin QOLA_TEST_CACHE="$cache" PYTHONPATH="$repo" \
      QOLA_ROCM7_ENV=1 ${MAX_JOBS:+MAX_JOBS=$MAX_JOBS} ${cc:+QOLA_CACHE_DIR=$cc} \
      bash -c "cd \"\$0\" && exec \"\$@\"" "$cwd" "$@"
  ' _ "$ROOT" "$REPO" "$TEST_CACHE" "$shared" "$PWD" "$cc" "$@"
}

case "${1:-}" in
  setup) setup ;;
  run) shift; run "$@" ;;
  path) echo "$ROOT" ;;
  *) die "usage: scripts/rocm7.sh setup | run CMD [ARG...] | path" ;;
esac
