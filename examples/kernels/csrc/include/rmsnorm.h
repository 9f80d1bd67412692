// SPDX-License-Identifier: MIT
// RMSNorm over the last dimension: out = x / sqrt(mean(x^2) + eps) * weight.
#pragma once
#include <cstdint>
#include "qk_types.h"

// in, out: [rows, cols] contiguous, element type `dtype`; weight: [cols], same type.
// dtype: "fp32", "fp16" or "bf16". block_size: 0 (default 256) or a power of two
// in [32, 1024] (see aiter/configs/rmsnorm_tuned.csv).
// Returns qkSuccess, qkErrorInvalidValue for bad arguments, or the launch error.
qkError_t rmsnorm_fwd(void* out,
                      const void* in,
                      const void* weight,
                      int64_t rows,
                      int64_t cols,
                      float eps,
                      const char* dtype,
                      int block_size,
                      qkStream_t stream);

// Path of the tuned-config CSV this module was built against ("" if none).
const char* rmsnorm_tuned_config();
