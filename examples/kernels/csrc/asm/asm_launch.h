// SPDX-License-Identifier: MIT
// module_asm: run kernels from prebuilt code objects (hsa/<arch>/<type>/<file>.co) by name.
//
// Code objects come from the module's embedded set (qola embed; the module is compiled with
// -DAITER_EMBEDDED_HSA_HEADER="qola_embedded_module_asm.h" and linked with the assembled
// qola_embedded_module_asm.S) and are loaded with the driver's module API
// (cuModuleLoadData / hipModuleLoadData). A directory is read only when the caller passes
// one (`asm_dir`, laid out like AITER_ASM_DIR: <asm_dir>/<arch>/<type>/<file>.co) and then
// only for code objects that are not embedded.
//
// <arch> is the device's: gfx942 (gcnArchName up to ':') on HIP, sm_90 (compute capability)
// on CUDA. Loaded modules are cached per device context and code object.
#pragma once
#include <cstddef>
#include <cstdint>
#include "qk_types.h"

enum asm_status
{
    ASM_OK          = 0,
    ASM_NOT_FOUND   = 1, // neither embedded nor (if asked) in asm_dir
    ASM_LOAD_FAILED = 2, // the driver refused the code object or has no such kernel
    ASM_LAUNCH_FAILED = 3,
    ASM_BAD_ARGUMENT  = 4,
};

// Launch `kernel` (unmangled name) from code object `co` ("<type>/<file>.co", relative to
// hsa/<arch>/) with `params` as cuLaunchKernel's kernelParams. `asm_dir` may be NULL.
// On failure, asm_last_error() says why (per thread).
asm_status asm_launch(const char* co,
                      const char* kernel,
                      void** params,
                      const unsigned grid[3],
                      const unsigned block[3],
                      unsigned shared_bytes,
                      qkStream_t stream,
                      const char* asm_dir);

const char* asm_last_error();

// The current device's architecture directory name ("gfx942", "sm_90"); "" on failure.
const char* asm_device_arch();

// Embedded code objects: their number and the i-th key ("hsa/<arch>/<type>/<file>.co"),
// in sorted order; 0 / NULL when the module was built without an embedded set.
size_t asm_embedded_count();
const char* asm_embedded_key(size_t i);

// Typed entry points for the example tree's code objects (csrc/hsa_src, built by
// scripts/build_hsa.py): vec_add/vec_add_<dtype>.co with kernel vec_add_<dtype>
// (dtype fp32, fp16 or bf16), vec_scale/vec_scale_fp32[x4].co with kernel of the same name
// (x4 when `in`, `out` are 16-byte aligned).
asm_status asm_vec_add(void* out, const void* a, const void* b, int64_t n, const char* dtype,
                       qkStream_t stream, const char* asm_dir);
asm_status asm_vec_scale(float* out, const float* in, float alpha, int64_t n,
                         qkStream_t stream, const char* asm_dir);
