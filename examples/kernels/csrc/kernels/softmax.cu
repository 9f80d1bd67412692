// SPDX-License-Identifier: MIT
#include <cstring>
#include "softmax.h"
#include "qk_reduce.h"

#ifndef QK_SOFTMAX_FAST_EXP
#define QK_SOFTMAX_FAST_EXP 0
#endif

namespace {

constexpr int kBlock = 256;

QK_DEVICE float qk_exp(float x)
{
#if QK_SOFTMAX_FAST_EXP
    return __expf(x);
#else
    return expf(x);
#endif
}

template <typename T>
QK_GLOBAL void softmax_kernel(T* __restrict__ out, const T* __restrict__ in, int64_t cols, float scale)
{
    __shared__ float smem[kBlock];
    const int64_t row = blockIdx.x;
    const T* x = in + row * cols;
    T* y       = out + row * cols;

    float m = -INFINITY;
    for(int64_t c = threadIdx.x; c < cols; c += blockDim.x)
        m = fmaxf(m, qk_to_float(x[c]) * scale);
    m = qk_block_reduce(m, smem, qk_max_op{});

    float s = 0.f;
    for(int64_t c = threadIdx.x; c < cols; c += blockDim.x)
        s += qk_exp(qk_to_float(x[c]) * scale - m);
    s = qk_block_reduce(s, smem, qk_sum_op{});

    const float inv = 1.f / s;
    for(int64_t c = threadIdx.x; c < cols; c += blockDim.x)
        y[c] = qk_from_float<T>(qk_exp(qk_to_float(x[c]) * scale - m) * inv);
}

template <typename T>
qkError_t launch(void* out, const void* in, int64_t rows, int64_t cols, float scale, qkStream_t stream)
{
    softmax_kernel<T><<<dim3(static_cast<unsigned>(rows)), dim3(kBlock), 0, stream>>>(
        static_cast<T*>(out), static_cast<const T*>(in), cols, scale);
    return qkGetLastError();
}

} // namespace

qkError_t softmax_fwd(void* out, const void* in, int64_t rows, int64_t cols, float scale,
                      const char* dtype, qkStream_t stream)
{
    if(rows < 0 || cols <= 0 || rows > 0x7fffffff || dtype == nullptr)
        return qkErrorInvalidValue;
    if(rows == 0)
        return qkSuccess;
    if(std::strcmp(dtype, "fp32") == 0)
        return launch<float>(out, in, rows, cols, scale, stream);
    if(std::strcmp(dtype, "fp16") == 0)
        return launch<qk_fp16_t>(out, in, rows, cols, scale, stream);
    if(std::strcmp(dtype, "bf16") == 0)
        return launch<qk_bf16_t>(out, in, rows, cols, scale, stream);
    return qkErrorInvalidValue;
}
