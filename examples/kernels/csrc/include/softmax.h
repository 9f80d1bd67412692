// SPDX-License-Identifier: MIT
// Numerically stable softmax over the last dimension.
#pragma once
#include <cstdint>
#include "qk_types.h"

// in, out: [rows, cols] contiguous, element type `dtype` ("fp32", "fp16", "bf16");
// `scale` multiplies the logits first. Returns qkSuccess, qkErrorInvalidValue for
// bad arguments, or the launch error.
qkError_t softmax_fwd(void* out,
                      const void* in,
                      int64_t rows,
                      int64_t cols,
                      float scale,
                      const char* dtype,
                      qkStream_t stream);
