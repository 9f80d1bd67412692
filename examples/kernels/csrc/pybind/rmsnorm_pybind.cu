// SPDX-License-Identifier: MIT
// Python bindings for rmsnorm. No torch needed: tensors are passed as device
// pointers (`t.data_ptr()`) and the stream as an int (`torch.cuda.current_stream().cuda_stream`).
#include <cstdint>
#include <stdexcept>
#include <string>
#include <pybind11/pybind11.h>
#include "rmsnorm.h"

#ifndef TORCH_EXTENSION_NAME
#define TORCH_EXTENSION_NAME module_rmsnorm
#endif

namespace py = pybind11;

static void rmsnorm_py(std::uintptr_t out, std::uintptr_t input, std::uintptr_t weight,
                       int64_t rows, int64_t cols, float eps, const std::string& dtype,
                       int block_size, std::uintptr_t stream)
{
    const qkError_t err = rmsnorm_fwd(reinterpret_cast<void*>(out),
                                      reinterpret_cast<const void*>(input),
                                      reinterpret_cast<const void*>(weight),
                                      rows, cols, eps, dtype.c_str(), block_size,
                                      qk_stream_from_int(stream));
    if(err != qkSuccess)
        throw std::runtime_error(std::string("rmsnorm: ") + qkGetErrorString(err) +
                                 " (dtype=" + dtype + ")");
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m)
{
    m.doc() = "RMSNorm over the last dim (fp32/fp16/bf16), raw device pointers";
    m.def("rmsnorm", &rmsnorm_py,
          "out = input * rsqrt(mean(input^2, -1) + eps) * weight; all [rows, cols] contiguous",
          py::arg("out"), py::arg("input"), py::arg("weight"), py::arg("rows"), py::arg("cols"),
          py::arg("eps") = 1e-6f, py::arg("dtype") = "fp32", py::arg("block_size") = 0,
          py::arg("stream") = 0);
    m.def("tuned_config", &rmsnorm_tuned_config,
          "path of the tuned-config CSV baked in at build time ('' if none)");
}
