// SPDX-License-Identifier: MIT
// Kernel and per-instance launcher of the attn_fwd family. Generated instance
// files (generate.py) specialise attn_fwd_<Traits> with attn_fwd_launch<Traits>.
//
// Straightforward, correct, not fast: one block computes kBlockM query rows of one
// (batch, head); each row is owned by kThreadsPerRow adjacent lanes, each holding
// kHeadDim / kThreadsPerRow dims of q and of the fp32 accumulator. K and V tiles
// of kBlockN keys are staged in shared memory as fp32; softmax is computed online.
#pragma once
#include <cmath>
#include "attn_fwd.h"
#include "qk_compat.h"

typedef qk_fp16_t fp16_t;
typedef qk_bf16_t bf16_t;
typedef float fp32_t;

template <int kHeadDim_,
          typename DataType_,
          bool kIsGroupMode_,
          int kBlockM_,
          int kBlockN_,
          bool kHasMask_,
          bool kHasLse_>
struct attn_fwd_traits_
{
    static constexpr int kHeadDim       = kHeadDim_;
    using DataType                      = DataType_;
    static constexpr bool kIsGroupMode  = kIsGroupMode_;
    static constexpr int kBlockM        = kBlockM_;
    static constexpr int kBlockN        = kBlockN_;
    static constexpr bool kHasMask      = kHasMask_;
    static constexpr bool kHasLse       = kHasLse_;
    static constexpr int kThreadsPerRow = 4; // power of two, <= 32
    static constexpr int kBlockSize     = kBlockM * kThreadsPerRow;
    static_assert(kHeadDim % kThreadsPerRow == 0, "kHeadDim must split across a row's lanes");
    static_assert(kBlockSize <= 1024, "too many threads per block");
    static_assert(2 * kBlockN * kHeadDim * sizeof(float) <= 48 * 1024, "K/V tiles exceed 48 KiB");
};

// One explicit specialisation per generated instance file.
template <typename Traits>
float attn_fwd_(const attn_fwd_args& args, qkStream_t stream);

#if defined(__CUDACC__) || defined(__HIPCC__)

template <typename Traits>
QK_GLOBAL void __launch_bounds__(Traits::kBlockSize) attn_fwd_kernel(attn_fwd_args a)
{
    using T                 = typename Traits::DataType;
    constexpr int kD        = Traits::kHeadDim;
    constexpr int kBM       = Traits::kBlockM;
    constexpr int kBN       = Traits::kBlockN;
    constexpr int kTPR      = Traits::kThreadsPerRow;
    constexpr int kDPT      = kD / kTPR; // dims per thread
    constexpr int kThreads  = Traits::kBlockSize;

    __shared__ float sK[kBN][kD];
    __shared__ float sV[kBN][kD];

    const int b    = blockIdx.z;
    const int head = blockIdx.y;
    const int m0   = blockIdx.x * kBM;

    int64_t q_start, k_start;
    int sq, sk;
    if(Traits::kIsGroupMode)
    {
        q_start = a.seqstart_q_ptr[b];
        k_start = a.seqstart_k_ptr[b];
        sq      = a.seqstart_q_ptr[b + 1] - static_cast<int>(q_start);
        sk      = a.seqstart_k_ptr[b + 1] - static_cast<int>(k_start);
    }
    else
    {
        q_start = static_cast<int64_t>(b) * a.seqlen_q;
        k_start = static_cast<int64_t>(b) * a.seqlen_k;
        sq      = a.seqlen_q;
        sk      = a.seqlen_k;
    }
    if(m0 >= sq)
        return; // whole block, before any barrier

    const int hdim   = a.hdim;
    const int head_k = head / (a.nhead_q / a.nhead_k);
    const int tid    = threadIdx.x;
    const int row    = tid / kTPR;
    const int sub    = tid % kTPR;
    const int qi     = m0 + row;
    const bool valid = qi < sq;
    const int diag   = sk - sq; // causal: key j visible to query i iff j <= i + diag

    const int64_t q_tok = static_cast<int64_t>(a.nhead_q) * hdim; // stride between tokens
    const int64_t k_tok = static_cast<int64_t>(a.nhead_k) * hdim;
    const T* q = static_cast<const T*>(a.q_ptr) + (q_start + qi) * q_tok + head * hdim;
    const T* k = static_cast<const T*>(a.k_ptr) + k_start * k_tok + head_k * hdim;
    const T* v = static_cast<const T*>(a.v_ptr) + k_start * k_tok + head_k * hdim;

    float qv[kDPT], acc[kDPT];
#pragma unroll
    for(int i = 0; i < kDPT; ++i)
    {
        const int d = sub + i * kTPR;
        qv[i]       = (valid && d < hdim) ? qk_to_float(q[d]) * a.scale : 0.f;
        acc[i]      = 0.f;
    }
    float m = -INFINITY; // running max of the scaled scores
    float l = 0.f;       // running sum of exp(score - m)

    int n_end = sk;
    if(Traits::kHasMask)
    {
        const int last_row = (m0 + kBM < sq ? m0 + kBM : sq) - 1;
        n_end              = min(sk, last_row + diag + 1);
    }

    for(int n0 = 0; n0 < n_end; n0 += kBN)
    {
        __syncthreads(); // previous tile fully consumed
        for(int idx = tid; idx < kBN * kD; idx += kThreads)
        {
            const int j      = idx / kD;
            const int d      = idx % kD;
            const int key    = n0 + j;
            const bool ok    = key < sk && d < hdim;
            const int64_t of = static_cast<int64_t>(key) * k_tok + d;
            sK[j][d]         = ok ? qk_to_float(k[of]) : 0.f;
            sV[j][d]         = ok ? qk_to_float(v[of]) : 0.f;
        }
        __syncthreads();

        const int jn = min(kBN, n_end - n0); // uniform over the block
        for(int j = 0; j < jn; ++j)
        {
            float s = 0.f;
#pragma unroll
            for(int i = 0; i < kDPT; ++i)
                s += qv[i] * sK[j][sub + i * kTPR];
#pragma unroll
            for(int o = 1; o < kTPR; o <<= 1)
                s += qk_shfl_xor(s, o); // every lane calls it, masked or not

            const int key = n0 + j;
            if(valid && (!Traits::kHasMask || key <= qi + diag))
            {
                const float m_new = fmaxf(m, s);
                const float corr  = expf(m - m_new);
                const float p     = expf(s - m_new);
                l                 = l * corr + p;
#pragma unroll
                for(int i = 0; i < kDPT; ++i)
                    acc[i] = acc[i] * corr + p * sV[j][sub + i * kTPR];
                m = m_new;
            }
        }
    }

    if(!valid)
        return;
    const float inv = l > 0.f ? 1.f / l : 0.f;
    T* o = static_cast<T*>(a.o_ptr) + (q_start + qi) * q_tok + head * hdim;
#pragma unroll
    for(int i = 0; i < kDPT; ++i)
    {
        const int d = sub + i * kTPR;
        if(d < hdim)
            o[d] = qk_from_float<T>(acc[i] * inv);
    }
    if(Traits::kHasLse && sub == 0)
    {
        float* lse = static_cast<float*>(a.lse_ptr);
        int64_t at;
        if(Traits::kIsGroupMode)
            at = static_cast<int64_t>(head) * a.seqstart_q_ptr[a.batch] + q_start + qi;
        else
            at = (static_cast<int64_t>(b) * a.nhead_q + head) * sq + qi;
        lse[at] = l > 0.f ? m + logf(l) : -INFINITY;
    }
}

template <typename Traits>
float attn_fwd_launch(const attn_fwd_args& a, qkStream_t stream)
{
    if(a.hdim <= 0 || a.hdim > Traits::kHeadDim || a.batch < 0 || a.seqlen_q < 0 ||
       a.seqlen_k < 0 || a.nhead_q <= 0 || a.nhead_k <= 0 || a.nhead_q % a.nhead_k != 0 ||
       a.batch > 65535 || a.nhead_q > 65535)
        return ATTN_FWD_BAD_ARGS;
    if(a.batch == 0 || a.seqlen_q == 0)
        return ATTN_FWD_OK;
    if(!a.q_ptr || !a.k_ptr || !a.v_ptr || !a.o_ptr || (Traits::kHasLse && !a.lse_ptr) ||
       (Traits::kIsGroupMode && (!a.seqstart_q_ptr || !a.seqstart_k_ptr)))
        return ATTN_FWD_BAD_ARGS;

    const dim3 grid((a.seqlen_q + Traits::kBlockM - 1) / Traits::kBlockM, a.nhead_q, a.batch);
    attn_fwd_kernel<Traits><<<grid, dim3(Traits::kBlockSize), 0, stream>>>(a);
    return qkGetLastError() == qkSuccess ? ATTN_FWD_OK : ATTN_FWD_LAUNCH_ERROR;
}

#endif // device compiler
