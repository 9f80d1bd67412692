// SPDX-License-Identifier: MIT
// Block-wide reductions through shared memory (no warp-size assumptions, so the
// same code is right for 32-wide warps and 64-wide wavefronts).
#pragma once
#include "qk_compat.h"

#if defined(__CUDACC__) || defined(__HIPCC__)
struct qk_sum_op { QK_DEVICE float operator()(float a, float b) const { return a + b; } };
struct qk_max_op { QK_DEVICE float operator()(float a, float b) const { return fmaxf(a, b); } };

// `smem` holds blockDim.x floats; blockDim.x must be a power of two.
// Every thread of the block must call it; every thread gets the result.
template <typename Op>
QK_DEVICE float qk_block_reduce(float v, float* smem, Op op)
{
    const int tid = threadIdx.x;
    smem[tid] = v;
    __syncthreads();
    for(int s = blockDim.x / 2; s > 0; s >>= 1)
    {
        if(tid < s)
            smem[tid] = op(smem[tid], smem[tid + s]);
        __syncthreads();
    }
    const float r = smem[0];
    __syncthreads(); // smem may be reused right after
    return r;
}
#endif
