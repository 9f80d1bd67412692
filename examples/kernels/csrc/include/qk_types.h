// SPDX-License-Identifier: MIT
// qk_types.h: the host side of where CUDA and HIP differ for the example tree: the runtime's
// types and error names. A header a host-only unit reads (a pybind11 entry, a public API header)
// includes this one alone: it tests no macro only the device compiler defines, so such a unit
// compiles the same for the host compiler as for nvcc's host pass (qola compiles it host-only).
// Kernels include qk_compat.h.
#pragma once

#include <cstdint>

#if defined(__HIP_PLATFORM_AMD__) || defined(__HIP__)
#define QK_HIP 1
#include <hip/hip_runtime.h>
#include <hip/hip_fp16.h>
#include <hip/hip_bfloat16.h>
typedef hipStream_t qkStream_t;
typedef hipError_t qkError_t;
#define qkSuccess hipSuccess
#define qkErrorInvalidValue hipErrorInvalidValue
#define qkGetLastError hipGetLastError
#define qkGetErrorString hipGetErrorString
typedef __half qk_fp16_t;
typedef hip_bfloat16 qk_bf16_t;
#else
#define QK_CUDA 1
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
typedef cudaStream_t qkStream_t;
typedef cudaError_t qkError_t;
#define qkSuccess cudaSuccess
#define qkErrorInvalidValue cudaErrorInvalidValue
#define qkGetLastError cudaGetLastError
#define qkGetErrorString cudaGetErrorString
typedef __half qk_fp16_t;
typedef __nv_bfloat16 qk_bf16_t;
#endif

// Converts the stream handle Python passes as an int (torch's `.cuda_stream`).
inline qkStream_t qk_stream_from_int(unsigned long long s)
{
    return reinterpret_cast<qkStream_t>(static_cast<uintptr_t>(s));
}
