// SPDX-License-Identifier: MIT
#include <cstring>
#include "rmsnorm.h"
#include "qk_reduce.h"

#ifndef QK_RMSNORM_USE_RSQRT
#define QK_RMSNORM_USE_RSQRT 1
#endif

namespace {

template <typename T>
QK_GLOBAL void rmsnorm_kernel(T* __restrict__ out,
                              const T* __restrict__ in,
                              const T* __restrict__ weight,
                              int64_t cols,
                              float eps)
{
    __shared__ float smem[1024];
    const int64_t row = blockIdx.x;
    const T* x = in + row * cols;
    T* y       = out + row * cols;

    float ss = 0.f;
    for(int64_t c = threadIdx.x; c < cols; c += blockDim.x)
    {
        const float v = qk_to_float(x[c]);
        ss += v * v;
    }
    ss = qk_block_reduce(ss, smem, qk_sum_op{});
#if QK_RMSNORM_USE_RSQRT
    const float inv = rsqrtf(ss / static_cast<float>(cols) + eps);
#else
    const float inv = 1.f / sqrtf(ss / static_cast<float>(cols) + eps);
#endif
    for(int64_t c = threadIdx.x; c < cols; c += blockDim.x)
        y[c] = qk_from_float<T>(qk_to_float(x[c]) * inv * qk_to_float(weight[c]));
}

template <typename T>
qkError_t launch(void* out, const void* in, const void* weight, int64_t rows, int64_t cols,
                 float eps, int block, qkStream_t stream)
{
    rmsnorm_kernel<T><<<dim3(static_cast<unsigned>(rows)), dim3(block), 0, stream>>>(
        static_cast<T*>(out), static_cast<const T*>(in), static_cast<const T*>(weight), cols, eps);
    return qkGetLastError();
}

} // namespace

qkError_t rmsnorm_fwd(void* out, const void* in, const void* weight, int64_t rows, int64_t cols,
                      float eps, const char* dtype, int block_size, qkStream_t stream)
{
    const int block = block_size == 0 ? 256 : block_size;
    if(block < 32 || block > 1024 || (block & (block - 1)) != 0 || rows < 0 || cols <= 0 ||
       rows > 0x7fffffff || dtype == nullptr)
        return qkErrorInvalidValue;
    if(rows == 0)
        return qkSuccess;
    if(std::strcmp(dtype, "fp32") == 0)
        return launch<float>(out, in, weight, rows, cols, eps, block, stream);
    if(std::strcmp(dtype, "fp16") == 0)
        return launch<qk_fp16_t>(out, in, weight, rows, cols, eps, block, stream);
    if(std::strcmp(dtype, "bf16") == 0)
        return launch<qk_bf16_t>(out, in, weight, rows, cols, eps, block, stream);
    return qkErrorInvalidValue;
}

const char* rmsnorm_tuned_config()
{
#ifdef QK_RMSNORM_TUNED_CSV
    return QK_RMSNORM_TUNED_CSV;
#else
    return "";
#endif
}
