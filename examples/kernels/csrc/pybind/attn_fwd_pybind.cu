// SPDX-License-Identifier: MIT
// Python bindings for attn_fwd (raw device pointers as ints, stream as int).
#include <cstdint>
#include <stdexcept>
#include <string>
#include <pybind11/pybind11.h>
#include "attn_fwd.h"

#ifndef TORCH_EXTENSION_NAME
#define TORCH_EXTENSION_NAME module_attn_fwd
#endif

namespace py = pybind11;

static void attn_fwd_py(std::uintptr_t q, std::uintptr_t k, std::uintptr_t v, std::uintptr_t out,
                        int batch, int seqlen_q, int seqlen_k, int nhead_q, int nhead_k, int hdim,
                        float scale, const std::string& dtype, bool causal, std::uintptr_t lse,
                        std::uintptr_t cu_seqlens_q, std::uintptr_t cu_seqlens_k,
                        std::uintptr_t stream)
{
    const bool group = cu_seqlens_q != 0 || cu_seqlens_k != 0;
    if(group && (cu_seqlens_q == 0 || cu_seqlens_k == 0))
        throw std::invalid_argument("attn_fwd: give both cu_seqlens_q and cu_seqlens_k, or neither");

    attn_fwd_traits t{};
    t.hdim          = hdim;
    t.dtype         = dtype.c_str();
    t.is_group_mode = group;
    t.has_mask      = causal;
    t.has_lse       = lse != 0;

    attn_fwd_args a{};
    a.q_ptr          = reinterpret_cast<const void*>(q);
    a.k_ptr          = reinterpret_cast<const void*>(k);
    a.v_ptr          = reinterpret_cast<const void*>(v);
    a.o_ptr          = reinterpret_cast<void*>(out);
    a.lse_ptr        = reinterpret_cast<void*>(lse);
    a.seqstart_q_ptr = reinterpret_cast<const int32_t*>(cu_seqlens_q);
    a.seqstart_k_ptr = reinterpret_cast<const int32_t*>(cu_seqlens_k);
    a.batch          = batch;
    a.seqlen_q       = seqlen_q;
    a.seqlen_k       = seqlen_k;
    a.nhead_q        = nhead_q;
    a.nhead_k        = nhead_k;
    a.hdim           = hdim;
    a.scale          = scale;

    const float r = attn_fwd(t, a, qk_stream_from_int(stream));
    if(r == ATTN_FWD_NO_INSTANCE)
        throw std::runtime_error("attn_fwd: no instance built for dtype=" + dtype +
                                 " hdim=" + std::to_string(hdim) + (group ? " group" : " batch") +
                                 (causal ? " causal" : "") + (lse ? " lse" : ""));
    if(r == ATTN_FWD_BAD_ARGS)
        throw std::invalid_argument("attn_fwd: invalid arguments");
    if(r < 0)
        throw std::runtime_error(std::string("attn_fwd: launch failed: ") +
                                 qkGetErrorString(qkGetLastError()));
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m)
{
    m.doc() = "Attention forward (softmax(QK^T*scale)V), raw device pointers";
    m.def("attn_fwd", &attn_fwd_py,
          "Batch mode: q/out [batch, seqlen_q, nhead_q, hdim], k/v [batch, seqlen_k, nhead_k, hdim],\n"
          "lse (optional, fp32) [batch, nhead_q, seqlen_q]. Group mode (cu_seqlens_q/k given,\n"
          "int32 [batch+1] on device): q/out [total_q, nhead_q, hdim], k/v [total_k, nhead_k, hdim],\n"
          "lse [nhead_q, total_q], seqlen_q = max seqlen_q. Pointers are ints (tensor.data_ptr()),\n"
          "0 means absent.",
          py::arg("q"), py::arg("k"), py::arg("v"), py::arg("out"), py::arg("batch"),
          py::arg("seqlen_q"), py::arg("seqlen_k"), py::arg("nhead_q"), py::arg("nhead_k"),
          py::arg("hdim"), py::arg("scale"), py::arg("dtype") = "fp16", py::arg("causal") = false,
          py::arg("lse") = 0, py::arg("cu_seqlens_q") = 0, py::arg("cu_seqlens_k") = 0,
          py::arg("stream") = 0);
}
