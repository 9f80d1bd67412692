// qola cpp_itfs wrapper for the example attention library: the C++ API in qola::<ns>::
// and a C entry point taking a plain struct. Everything else in the library stays local.
#include "qola_attn_fwd.h"

QOLA_DEFINE_VERSION()

QOLA_NS_BEGIN
float attn_fwd(const attn_fwd_traits& traits, const attn_fwd_args& args, qkStream_t stream)
{
    return ::attn_fwd(traits, args, stream);
}
QOLA_NS_END

QOLA_C_API int QOLA_C_NAME(libattn_fwd_attn_fwd)(const qola_attn_fwd_params* p)
{
    if(p == nullptr || p->dtype == nullptr)
        return -2;
    attn_fwd_traits t{};
    t.hdim = p->hdim;
    t.dtype = p->dtype;
    t.is_group_mode = p->cu_seqlens_q != nullptr && p->cu_seqlens_k != nullptr;
    t.has_mask = p->causal != 0;
    t.has_lse = p->lse != nullptr;
    attn_fwd_args a{};
    a.q_ptr = p->q; a.k_ptr = p->k; a.v_ptr = p->v; a.o_ptr = p->out; a.lse_ptr = p->lse;
    a.seqstart_q_ptr = p->cu_seqlens_q; a.seqstart_k_ptr = p->cu_seqlens_k;
    a.batch = p->batch; a.seqlen_q = p->seqlen_q; a.seqlen_k = p->seqlen_k;
    a.nhead_q = p->nhead_q; a.nhead_k = p->nhead_k; a.hdim = p->hdim; a.scale = p->scale;
    const float r = QOLA_NS(attn_fwd)(t, a, reinterpret_cast<qkStream_t>(p->stream));
    return r < 0 ? static_cast<int>(r) : 0;
}
