// SPDX-License-Identifier: MIT
// Python bindings for module_asm (raw device pointers, stream as int).
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include "asm_launch.h"

#ifndef TORCH_EXTENSION_NAME
#define TORCH_EXTENSION_NAME module_asm
#endif

namespace py = pybind11;

static const char* dir_arg(const py::object& asm_dir, std::string& keep)
{
    if(asm_dir.is_none())
        return nullptr;
    keep = py::str(asm_dir);
    return keep.c_str();
}

static void check(asm_status st)
{
    if(st == ASM_NOT_FOUND)
        throw py::key_error(asm_last_error());
    if(st == ASM_BAD_ARGUMENT)
        throw py::value_error(asm_last_error());
    if(st != ASM_OK)
        throw std::runtime_error(asm_last_error());
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m)
{
    m.doc() = "Kernels from prebuilt code objects (embedded; a directory only when asked)";
    m.def("vec_add",
          [](std::uintptr_t out, std::uintptr_t a, std::uintptr_t b, int64_t n, const std::string& dtype,
             std::uintptr_t stream, const py::object& asm_dir) {
              std::string keep;
              check(asm_vec_add(reinterpret_cast<void*>(out), reinterpret_cast<const void*>(a),
                                reinterpret_cast<const void*>(b), n, dtype.c_str(), qk_stream_from_int(stream),
                                dir_arg(asm_dir, keep)));
          },
          "out = a + b (n elements of dtype fp32/fp16/bf16)", py::arg("out"), py::arg("a"), py::arg("b"),
          py::arg("n"), py::arg("dtype") = "fp32", py::arg("stream") = 0, py::arg("asm_dir") = py::none());
    m.def("vec_scale",
          [](std::uintptr_t out, std::uintptr_t in, float alpha, int64_t n, std::uintptr_t stream,
             const py::object& asm_dir) {
              std::string keep;
              check(asm_vec_scale(reinterpret_cast<float*>(out), reinterpret_cast<const float*>(in), alpha, n,
                                  qk_stream_from_int(stream), dir_arg(asm_dir, keep)));
          },
          "out = alpha * in (fp32)", py::arg("out"), py::arg("input"), py::arg("alpha"), py::arg("n"),
          py::arg("stream") = 0, py::arg("asm_dir") = py::none());
    m.def("device_arch", [] { return std::string(asm_device_arch()); });
    m.def("embedded_keys", [] {
        std::vector<std::string> keys;
        for(size_t i = 0; i < asm_embedded_count(); ++i)
            keys.emplace_back(asm_embedded_key(i));
        return keys;
    });
}
