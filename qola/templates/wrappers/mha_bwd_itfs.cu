// qola cpp_itfs wrapper: qola::<ns>::mha_bwd -> aiter::mha_bwd (everything aiter:: stays local).
#include "qola_mha_bwd.h"

QOLA_DEFINE_VERSION()

QOLA_NS_BEGIN
float mha_bwd(mha_bwd_args args, const ck_tile::stream_config& stream_config, std::string q_dtype_str,
              bool is_group_mode, mask_enum mask_type, bias_enum bias_type, bool has_dbias, bool is_store_randval,
              bool deterministic, bool use_ext_asm, bool is_v3_atomic_fp32, int how_v3_bf16_cvt,
              const void* seqlen_q_padded, const void* seqlen_k_padded, bool is_v3_api_check)
{
    return ::aiter::mha_bwd(args, stream_config, std::move(q_dtype_str), is_group_mode, mask_type, bias_type,
                            has_dbias, is_store_randval, deterministic, use_ext_asm, is_v3_atomic_fp32,
                            how_v3_bf16_cvt, seqlen_q_padded, seqlen_k_padded, is_v3_api_check);
}
QOLA_NS_END
