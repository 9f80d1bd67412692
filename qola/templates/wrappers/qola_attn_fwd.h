/* qola cpp_itfs API of the example attention library (libattn_fwd).
 * C++: qola::<ns>::attn_fwd(traits, args, stream). C: <ns>_libattn_fwd_attn_fwd(&params). */
#ifndef QOLA_ATTN_FWD_H
#define QOLA_ATTN_FWD_H
#include <stdint.h>
#include "qola_common.h"

typedef struct qola_attn_fwd_params {
    const void* q; const void* k; const void* v; void* out;
    void* lse;                         /* fp32, NULL = no LSE */
    const int32_t* cu_seqlens_q;       /* group mode when both are given */
    const int32_t* cu_seqlens_k;
    int batch, seqlen_q, seqlen_k, nhead_q, nhead_k, hdim;
    float scale;
    const char* dtype;                 /* "fp16" | "bf16" | "fp32" */
    int causal;
    void* stream;                      /* cudaStream_t / hipStream_t, NULL = default */
} qola_attn_fwd_params;

/* 0: launched; -1: no instance built for these traits; -2: bad arguments; -3: launch error */
QOLA_C_API int QOLA_C_NAME(libattn_fwd_attn_fwd)(const qola_attn_fwd_params* params);
QOLA_C_API const char* QOLA_C_NAME(qola_version)(void);

#ifdef __cplusplus
#include "attn_fwd.h"
QOLA_NS_BEGIN
QOLA_VISIBLE float attn_fwd(const attn_fwd_traits& traits, const attn_fwd_args& args, qkStream_t stream);
QOLA_NS_END
#endif
#endif
