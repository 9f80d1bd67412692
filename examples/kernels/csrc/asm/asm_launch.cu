// SPDX-License-Identifier: MIT
// module_asm host code: embedded (or, when asked, on-disk) code objects through the driver's
// module API. Host-only; single source for CUDA and HIP.
#include "asm_launch.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#ifdef AITER_EMBEDDED_HSA_HEADER
#include AITER_EMBEDDED_HSA_HEADER // defines AITER_EMBEDDED_HSA_MAP, as for aiter_hip_common.h
#endif

#if QK_HIP
typedef hipModule_t asm_module_t;
typedef hipFunction_t asm_function_t;
#else
#include <cuda.h> // types only: the entry points come through the runtime, no -lcuda needed
typedef CUmodule asm_module_t;
typedef CUfunction asm_function_t;
#endif

namespace {

thread_local std::string g_error;

asm_status fail(asm_status status, std::string message)
{
    g_error = std::move(message);
    return status;
}

#if QK_HIP
std::string drv_error(hipError_t e) { return hipGetErrorString(e); }
#else
struct Driver
{
    CUresult (*ctx_get_current)(CUcontext*)                    = nullptr;
    CUresult (*module_load_data)(CUmodule*, const void*)       = nullptr;
    CUresult (*module_get_function)(CUfunction*, CUmodule, const char*) = nullptr;
    CUresult (*launch_kernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                              unsigned, CUstream, void**, void**) = nullptr;
    CUresult (*get_error_string)(CUresult, const char**) = nullptr;
    bool ok = false;
};

template <typename F>
bool entry(const char* name, F& fn)
{
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
#if CUDART_VERSION >= 12050
    cudaError_t e = cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &q);
#else
    cudaError_t e = cudaGetDriverEntryPoint(name, &p, cudaEnableDefault, &q);
#endif
    fn = reinterpret_cast<F>(p);
    return e == cudaSuccess && q == cudaDriverEntryPointSuccess && p != nullptr;
}

const Driver& driver()
{
    static const Driver d = [] {
        Driver r;
        r.ok = entry("cuCtxGetCurrent", r.ctx_get_current) && entry("cuModuleLoadData", r.module_load_data) &&
               entry("cuModuleGetFunction", r.module_get_function) &&
               entry("cuLaunchKernel", r.launch_kernel) && entry("cuGetErrorString", r.get_error_string);
        return r;
    }();
    return d;
}

std::string drv_error(CUresult e)
{
    const char* s = nullptr;
    if(driver().get_error_string)
        driver().get_error_string(e, &s);
    return s ? s : "CUDA driver error " + std::to_string(static_cast<int>(e));
}
#endif

// Identifies the current device context: modules belong to one.
bool current_context(void** ctx, std::string& why)
{
#if QK_HIP
    int dev = 0;
    hipError_t e = hipGetDevice(&dev);
    *ctx = reinterpret_cast<void*>(static_cast<intptr_t>(dev) + 1);
    if(e != hipSuccess) why = drv_error(e);
    return e == hipSuccess;
#else
    if(!driver().ok)
    {
        why = "CUDA driver entry points not available";
        return false;
    }
    cudaError_t re = cudaFree(nullptr); // makes the device's primary context current
    CUcontext c = nullptr;
    CUresult e = driver().ctx_get_current(&c);
    *ctx = c;
    if(re != cudaSuccess) why = cudaGetErrorString(re);
    else if(e != CUDA_SUCCESS || c == nullptr) why = "no current CUDA context";
    return re == cudaSuccess && e == CUDA_SUCCESS && c != nullptr;
#endif
}

std::string device_arch()
{
#if QK_HIP
    int dev = 0;
    hipDeviceProp_t prop;
    if(hipGetDevice(&dev) != hipSuccess || hipGetDeviceProperties(&prop, dev) != hipSuccess)
        return "";
    std::string arch = prop.gcnArchName;
    return arch.substr(0, arch.find(':'));
#else
    int dev = 0, major = 0, minor = 0;
    if(cudaGetDevice(&dev) != cudaSuccess ||
       cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
       cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess)
        return "";
    return "sm_" + std::to_string(major) + std::to_string(minor);
#endif
}

// The bytes of hsa/<arch>/<co>: embedded first, then <asm_dir>/<arch>/<co> if asm_dir.
// `storage` keeps file contents alive for as long as the module (cached forever).
const void* find_code_object(const std::string& arch, const char* co, const char* asm_dir,
                             std::vector<std::string>& storage, std::string& where)
{
    const std::string key = "hsa/" + arch + "/" + co;
#ifdef AITER_EMBEDDED_HSA_MAP
    auto it = AITER_EMBEDDED_HSA_MAP.find(key);
    if(it != AITER_EMBEDDED_HSA_MAP.end() && !it->second.empty())
    {
        where = "embedded " + key;
        return it->second.data();
    }
#endif
    if(asm_dir == nullptr || *asm_dir == '\0')
        return nullptr;
    where = std::string(asm_dir) + "/" + arch + "/" + co;
    std::ifstream f(where, std::ios::binary);
    if(!f.is_open())
        return nullptr;
    std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    if(bytes.empty())
        return nullptr;
    storage.push_back(std::move(bytes));
    return storage.back().data();
}

struct Cache
{
    std::mutex mutex;
    std::map<std::pair<void*, std::string>, asm_module_t> modules;                 // (ctx, co)
    std::map<std::tuple<void*, std::string, std::string>, asm_function_t> functions; // (+kernel)
    std::vector<std::string> storage;
};

Cache& cache()
{
    static Cache* c = new Cache(); // never destroyed: modules may outlive static destructors
    return *c;
}

asm_status get_function(const char* co, const char* kernel, const char* asm_dir, asm_function_t* fn)
{
    void* ctx = nullptr;
    std::string why;
    if(!current_context(&ctx, why))
        return fail(ASM_LOAD_FAILED, "no device: " + why);
    Cache& c = cache();
    std::lock_guard<std::mutex> lock(c.mutex);
    auto fkey = std::make_tuple(ctx, std::string(co), std::string(kernel));
    auto fit  = c.functions.find(fkey);
    if(fit != c.functions.end())
    {
        *fn = fit->second;
        return ASM_OK;
    }
    auto mkey = std::make_pair(ctx, std::string(co));
    auto mit  = c.modules.find(mkey);
    if(mit == c.modules.end())
    {
        const std::string arch = device_arch();
        std::string where;
        const void* image = find_code_object(arch, co, asm_dir, c.storage, where);
        if(image == nullptr)
            return fail(ASM_NOT_FOUND, "code object hsa/" + arch + "/" + co + " is not embedded" +
                                           (asm_dir ? " and not in " + std::string(asm_dir) + "/" + arch
                                                    : std::string(" (no asm_dir given)")));
        asm_module_t module{};
#if QK_HIP
        hipError_t e = hipModuleLoadData(&module, image);
        const bool ok = e == hipSuccess;
#else
        CUresult e    = driver().module_load_data(&module, image);
        const bool ok = e == CUDA_SUCCESS;
#endif
        if(!ok)
            return fail(ASM_LOAD_FAILED, "loading " + where + ": " + drv_error(e));
        mit = c.modules.emplace(mkey, module).first;
    }
#if QK_HIP
    hipError_t e = hipModuleGetFunction(fn, mit->second, kernel);
    const bool ok = e == hipSuccess;
#else
    CUresult e    = driver().module_get_function(fn, mit->second, kernel);
    const bool ok = e == CUDA_SUCCESS;
#endif
    if(!ok)
        return fail(ASM_LOAD_FAILED, std::string("kernel ") + kernel + " in " + co + ": " + drv_error(e));
    c.functions.emplace(fkey, *fn);
    return ASM_OK;
}

} // namespace

asm_status asm_launch(const char* co, const char* kernel, void** params, const unsigned grid[3],
                      const unsigned block[3], unsigned shared_bytes, qkStream_t stream, const char* asm_dir)
{
    if(co == nullptr || kernel == nullptr || grid == nullptr || block == nullptr)
        return fail(ASM_BAD_ARGUMENT, "asm_launch: null argument");
    asm_function_t fn{};
    asm_status st = get_function(co, kernel, asm_dir, &fn);
    if(st != ASM_OK)
        return st;
#if QK_HIP
    hipError_t e = hipModuleLaunchKernel(fn, grid[0], grid[1], grid[2], block[0], block[1], block[2],
                                         shared_bytes, stream, params, nullptr);
    const bool ok = e == hipSuccess;
#else
    CUresult e    = driver().launch_kernel(fn, grid[0], grid[1], grid[2], block[0], block[1], block[2],
                                        shared_bytes, reinterpret_cast<CUstream>(stream), params, nullptr);
    const bool ok = e == CUDA_SUCCESS;
#endif
    return ok ? ASM_OK : fail(ASM_LAUNCH_FAILED, std::string("launching ") + kernel + ": " + drv_error(e));
}

const char* asm_last_error() { return g_error.c_str(); }

const char* asm_device_arch()
{
    thread_local std::string arch;
    arch = device_arch();
    return arch.c_str();
}

#ifdef AITER_EMBEDDED_HSA_MAP
namespace {
const std::vector<std::string>& embedded_keys()
{
    static const std::vector<std::string> keys = [] {
        std::vector<std::string> k;
        for(const auto& kv : AITER_EMBEDDED_HSA_MAP)
            k.push_back(kv.first);
        std::sort(k.begin(), k.end());
        return k;
    }();
    return keys;
}
} // namespace
size_t asm_embedded_count() { return embedded_keys().size(); }
const char* asm_embedded_key(size_t i) { return i < embedded_keys().size() ? embedded_keys()[i].c_str() : nullptr; }
#else
size_t asm_embedded_count() { return 0; }
const char* asm_embedded_key(size_t) { return nullptr; }
#endif

namespace {
unsigned blocks_for(int64_t n, unsigned threads)
{
    int64_t b = (n + threads - 1) / threads;
    return static_cast<unsigned>(b < 1 ? 1 : (b > 65535 ? 65535 : b)); // grid-stride kernels
}
} // namespace

asm_status asm_vec_add(void* out, const void* a, const void* b, int64_t n, const char* dtype,
                       qkStream_t stream, const char* asm_dir)
{
    if(n < 0 || dtype == nullptr ||
       (std::strcmp(dtype, "fp32") && std::strcmp(dtype, "fp16") && std::strcmp(dtype, "bf16")))
        return fail(ASM_BAD_ARGUMENT, "asm_vec_add: n >= 0 and dtype fp32, fp16 or bf16");
    if(n == 0)
        return ASM_OK;
    const std::string name = std::string("vec_add_") + dtype;
    const std::string co   = "vec_add/" + name + ".co";
    void* params[]         = {&out, &a, &b, &n};
    const unsigned grid[3] = {blocks_for(n, 256), 1, 1}, block[3] = {256, 1, 1};
    return asm_launch(co.c_str(), name.c_str(), params, grid, block, 0, stream, asm_dir);
}

asm_status asm_vec_scale(float* out, const float* in, float alpha, int64_t n, qkStream_t stream,
                         const char* asm_dir)
{
    if(n < 0)
        return fail(ASM_BAD_ARGUMENT, "asm_vec_scale: n >= 0");
    if(n == 0)
        return ASM_OK;
    const bool x4 = (reinterpret_cast<uintptr_t>(out) | reinterpret_cast<uintptr_t>(in)) % 16 == 0;
    const std::string name = x4 ? "vec_scale_fp32x4" : "vec_scale_fp32";
    const std::string co   = "vec_scale/" + name + ".co";
    void* params[]         = {&out, &in, &alpha, &n};
    const unsigned grid[3] = {blocks_for(x4 ? (n + 3) / 4 : n, 256), 1, 1}, block[3] = {256, 1, 1};
    return asm_launch(co.c_str(), name.c_str(), params, grid, block, 0, stream, asm_dir);
}
