// SPDX-License-Identifier: MIT
// Python bindings for the row softmax (raw device pointers, stream as int).
#include <cstdint>
#include <stdexcept>
#include <string>
#include <pybind11/pybind11.h>
#include "softmax.h"

#ifndef TORCH_EXTENSION_NAME
#define TORCH_EXTENSION_NAME module_softmax
#endif

namespace py = pybind11;

static void softmax_py(std::uintptr_t out, std::uintptr_t input, int64_t rows, int64_t cols,
                       float scale, const std::string& dtype, std::uintptr_t stream)
{
    const qkError_t err = softmax_fwd(reinterpret_cast<void*>(out),
                                      reinterpret_cast<const void*>(input),
                                      rows, cols, scale, dtype.c_str(),
                                      qk_stream_from_int(stream));
    if(err != qkSuccess)
        throw std::runtime_error(std::string("softmax: ") + qkGetErrorString(err) +
                                 " (dtype=" + dtype + ")");
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m)
{
    m.doc() = "Row softmax over the last dim (fp32/fp16/bf16), raw device pointers";
    m.def("softmax", &softmax_py, "out = softmax(input * scale, -1); [rows, cols] contiguous",
          py::arg("out"), py::arg("input"), py::arg("rows"), py::arg("cols"),
          py::arg("scale") = 1.0f, py::arg("dtype") = "fp32", py::arg("stream") = 0);
}
