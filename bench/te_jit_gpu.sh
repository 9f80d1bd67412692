#!/bin/bash
# TE's CK_JIT mode from qola alone, on a GPU (issue 35): the CUDA twin of the example's kernels.
#
#   bash bench/te_jit_gpu.sh build DIR   (any machine with nvcc: qola build --jit on + the caller)
#   bash bench/te_jit_gpu.sh run DIR     (the GPU machine: nvcc on PATH; nothing of Python runs)
#
# build: the example tree's libattn_fwd (cpp_itfs, bf16, sm_90) with `--jit on`: every generated
# instance deferred, the library a slim one (dispatch + stubs + qola's C++ JIT runtime); a C++ caller
# linked to it as TE links te_libmha_fwd.so (-l:<file>, include/, rpath). run: the caller, each a new
# process: first call with a cold cache (the runtime compiles the unit with nvcc), a second call in
# that process, a new process on the warm cache, and two processes at once on another cold cache.
# QOLA_JIT_COMPILER is a wrapper that counts compiles and names the process that started each.
set -euo pipefail
what=${1:?build|run}; W=$(realpath -m "${2:?DIR}")
REPO=$(cd "$(dirname "$0")/.." && pwd)
if [ "$what" = build ]; then
  rm -rf "$W"; mkdir -p "$W"
  cat > "$W/te.toml" <<'T'
[qola]
namespace = "qg"
[build]
architectures = ["sm_90"]
[[modules]]
name = "libattn_fwd"
mode = "cpp_itfs"
[[variants]]
module = "libattn_fwd"
pattern = "attn_fwd_d*_{dtype}_*"
options = {dtype = "bf16"}
T
  s=$(date +%s.%N)
  PYTHONPATH=$REPO python3 -m qola.cli build --manifest "$W/te.toml" --aiter-root "$REPO/examples/kernels" \
    -o "$W/out" --jit on -j 2 > "$W/build.log" 2>&1
  echo "build_s $(echo "$(date +%s.%N) - $s" | bc)" > "$W/build.txt"
  du -sb "$W/out/lib" "$W/out/jit" >> "$W/build.txt"
  cat > "$W/app.cu" <<'C'
#include <cuda_runtime.h>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <vector>
#include "qola_attn_fwd.h"
QOLA_C_API const char* QOLA_C_NAME(qola_jit_last_error)(void);
static double ms() { timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e3 + t.tv_nsec / 1e6; }
static uint16_t bf(float f) { uint32_t u; memcpy(&u, &f, 4); return (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16); }
static float fl(uint16_t h) { uint32_t u = (uint32_t)h << 16; float f; memcpy(&f, &u, 4); return f; }
int main(int argc, char** argv) {
  const int causal = argc > 1 ? atoi(argv[1]) : 1, b = 2, sq = 64, sk = 80, h = 4, d = 128;
  std::vector<uint16_t> q(b * sq * h * d), k(b * sk * h * d), v(b * sk * h * d), o(q.size());
  uint32_t s = 12345;
  for (auto* a : {&q, &k, &v}) for (auto& x : *a) { s = s * 1664525u + 1013904223u; x = bf((s >> 8) / 16777216.0f - 0.5f); }
  void *dq, *dk, *dv, *dout, *dlse;
  cudaFree(0);  // the CUDA context first: the timings below are the library's
  cudaMalloc(&dq, q.size() * 2); cudaMalloc(&dk, k.size() * 2); cudaMalloc(&dv, v.size() * 2);
  cudaMalloc(&dout, o.size() * 2); cudaMalloc(&dlse, b * h * sq * 4);
  cudaMemcpy(dq, q.data(), q.size() * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(dk, k.data(), k.size() * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(dv, v.data(), v.size() * 2, cudaMemcpyHostToDevice);
  const float scale = 1.0f / sqrtf((float)d);
  qola_attn_fwd_params p = {dq, dk, dv, dout, dlse, nullptr, nullptr, b, sq, sk, h, h, d, scale, "bf16", causal, nullptr};
  double t0 = ms(); int r1 = QOLA_C_NAME(libattn_fwd_attn_fwd)(&p); cudaDeviceSynchronize(); double t1 = ms();
  int r2 = QOLA_C_NAME(libattn_fwd_attn_fwd)(&p); cudaDeviceSynchronize(); double t2 = ms();
  cudaMemcpy(o.data(), dout, o.size() * 2, cudaMemcpyDeviceToHost);
  double err = 0;  // against a float reference on the host
  for (int bi = 0; bi < b; ++bi) for (int hi = 0; hi < h; ++hi) for (int i = 0; i < sq; ++i) {
    std::vector<double> sc(sk); double mx = -1e30;
    for (int j = 0; j < sk; ++j) {
      double a = 0; for (int c = 0; c < d; ++c) a += fl(q[((bi * sq + i) * h + hi) * d + c]) * fl(k[((bi * sk + j) * h + hi) * d + c]);
      sc[j] = (causal && j > i + (sk - sq)) ? -1e30 : a * scale; if (sc[j] > mx) mx = sc[j]; }
    double z = 0; for (int j = 0; j < sk; ++j) { sc[j] = sc[j] <= -1e29 ? 0 : exp(sc[j] - mx); z += sc[j]; }
    for (int c = 0; c < d; ++c) { double a = 0; for (int j = 0; j < sk; ++j) a += sc[j] * fl(v[((bi * sk + j) * h + hi) * d + c]);
      err = fmax(err, fabs(a / z - fl(o[((bi * sq + i) * h + hi) * d + c]))); } }
  printf("rc %d %d first_ms %.3f second_ms %.4f maxerr %.5f %s\n", r1, r2, t1 - t0, t2 - t1, err, QOLA_C_NAME(qola_jit_last_error)());
  return r1 || r2 || err > 5e-2;
}
C
  nvcc -O2 -arch=sm_90 -I"$W/out/include" "$W/app.cu" -L"$W/out/lib" -l:qg_libattn_fwd.so \
    -Xlinker -rpath -Xlinker '$ORIGIN/out/lib' -o "$W/app"
  cat "$W/build.txt"; exit 0
fi
# run: on the GPU machine
cat > "$W/cc.sh" <<'S'
#!/bin/sh
if [ "$1" = "--version" ]; then exec nvcc --version; fi
echo "$$ parent=$(cat /proc/$PPID/comm)" >> "$QOLA_BENCH_COUNT"
exec nvcc "$@"
S
chmod +x "$W/cc.sh"
export QOLA_JIT_COMPILER=$W/cc.sh QOLA_BENCH_COUNT=$W/compiles.txt
rm -rf "$W/cache" "$W/cache2" "$W/compiles.txt"; : > "$W/compiles.txt"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nvcc --version | tail -1
run() { /usr/bin/env QOLA_JIT_CACHE_DIR="$1" "$W/app" 1; }
echo "process 1 (cold cache):  $(run "$W/cache")  compiles=$(wc -l < "$W/compiles.txt")"
echo "process 2 (warm cache):  $(run "$W/cache")  compiles=$(wc -l < "$W/compiles.txt")"
echo "process 3 (warm cache):  $(run "$W/cache")  compiles=$(wc -l < "$W/compiles.txt")"
: > "$W/compiles.txt"
run "$W/cache2" > "$W/a.txt" & A=$!; run "$W/cache2" > "$W/b.txt" & B=$!
wait $A; wait $B
echo "at once A: $(cat "$W/a.txt")"; echo "at once B: $(cat "$W/b.txt")  compiles=$(wc -l < "$W/compiles.txt")"
echo "compiler started by: $(cut -d' ' -f2 "$W/compiles.txt" | sort | uniq -c | tr '\n' ' ')"
ls "$W/cache" "$W/cache/locks" | head -20
