// SPDX-License-Identifier: MIT
// Element-wise add, built into a standalone code object by scripts/build_hsa.py
// (nvcc -cubin / hipcc --genco) and loaded by name at run time
// (cuModuleLoadData + cuModuleGetFunction / hipModuleLoadData + hipModuleGetFunction).
//
// Build-time defines (set per variant by build_hsa.py):
//   QK_KERNEL_NAME  the unmangled kernel symbol, e.g. vec_add_fp16
//   QK_DTYPE        element type: float, qk_fp16_t or qk_bf16_t
//
// Launch: 1-D grid, any block size; out[i] = a[i] + b[i] for i < n.
#include "qk_compat.h"

#ifndef QK_KERNEL_NAME
#define QK_KERNEL_NAME vec_add_fp32
#endif
#ifndef QK_DTYPE
#define QK_DTYPE float
#endif

extern "C" QK_GLOBAL void QK_KERNEL_NAME(QK_DTYPE* __restrict__ out,
                                         const QK_DTYPE* __restrict__ a,
                                         const QK_DTYPE* __restrict__ b,
                                         int64_t n)
{
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for(int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
        out[i] = qk_from_float<QK_DTYPE>(qk_to_float(a[i]) + qk_to_float(b[i]));
}
