// SPDX-License-Identifier: MIT
// out = alpha * in (fp32), built into a standalone code object by scripts/build_hsa.py.
//
// Build-time defines (set per variant by build_hsa.py):
//   QK_KERNEL_NAME  the unmangled kernel symbol, e.g. vec_scale_fp32x4
//   QK_VEC          1 or 4: elements per thread per step (4 uses float4 loads;
//                   then `in` and `out` must be 16-byte aligned)
//
// Launch: 1-D grid, any block size.
#include "qk_compat.h"

#ifndef QK_KERNEL_NAME
#define QK_KERNEL_NAME vec_scale_fp32
#endif
#ifndef QK_VEC
#define QK_VEC 1
#endif

extern "C" QK_GLOBAL void QK_KERNEL_NAME(float* __restrict__ out,
                                         const float* __restrict__ in,
                                         float alpha,
                                         int64_t n)
{
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    const int64_t first  = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
#if QK_VEC == 4
    const int64_t n4 = n / 4;
    for(int64_t i = first; i < n4; i += stride)
    {
        float4 v = reinterpret_cast<const float4*>(in)[i];
        v.x *= alpha;
        v.y *= alpha;
        v.z *= alpha;
        v.w *= alpha;
        reinterpret_cast<float4*>(out)[i] = v;
    }
    for(int64_t i = n4 * 4 + first; i < n; i += stride) // tail
        out[i] = alpha * in[i];
#else
    for(int64_t i = first; i < n; i += stride)
        out[i] = alpha * in[i];
#endif
}
