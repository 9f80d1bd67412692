// SPDX-License-Identifier: MIT
// qk_compat.h: the one place where CUDA and HIP differ for the example tree's kernels.
// Single-source kernels include this and use the qk*/QK_* names below;
// `kernel<<<grid, block, smem, stream>>>(...)` works unchanged on both. The runtime's types
// come from qk_types.h (what host-only code includes).
#pragma once

#include "qk_types.h"

#define QK_DEVICE __device__ __forceinline__
#define QK_GLOBAL __global__

#if defined(__CUDACC__) || defined(__HIPCC__)
// Element conversions: every kernel computes in fp32.
QK_DEVICE float qk_to_float(float x) { return x; }
QK_DEVICE float qk_to_float(qk_fp16_t x) { return __half2float(x); }
#if QK_HIP
QK_DEVICE float qk_to_float(qk_bf16_t x) { return static_cast<float>(x); }
#else
QK_DEVICE float qk_to_float(qk_bf16_t x) { return __bfloat162float(x); }
#endif

template <typename T> QK_DEVICE T qk_from_float(float x);
template <> QK_DEVICE float qk_from_float<float>(float x) { return x; }
template <> QK_DEVICE qk_fp16_t qk_from_float<qk_fp16_t>(float x) { return __float2half(x); }
#if QK_HIP
template <> QK_DEVICE qk_bf16_t qk_from_float<qk_bf16_t>(float x) { return qk_bf16_t(x); }
#else
template <> QK_DEVICE qk_bf16_t qk_from_float<qk_bf16_t>(float x) { return __float2bfloat16(x); }
#endif

// Butterfly exchange between lanes of one warp/wavefront (all lanes must call).
#if QK_HIP
QK_DEVICE float qk_shfl_xor(float v, int lane_mask) { return __shfl_xor(v, lane_mask); }
#else
QK_DEVICE float qk_shfl_xor(float v, int lane_mask) { return __shfl_xor_sync(0xffffffffu, v, lane_mask); }
#endif
#endif // device compiler
