// qola cpp_itfs wrapper: qola::<ns>::mha_fwd -> aiter::mha_fwd (everything aiter:: stays local).
#include "qola_mha_fwd.h"

QOLA_DEFINE_VERSION()

QOLA_NS_BEGIN
float mha_fwd(mha_fwd_args args, const ck_tile::stream_config& stream_config, std::string q_dtype_str,
              bool is_group_mode, mask_enum mask_type, bias_enum bias_type, bool has_lse, bool use_ext_asm,
              int how_v3_bf16_cvt, const void* seqstart_q_padding_ptr, const void* seqstart_k_padding_ptr,
              bool is_v3_api_check)
{
    return ::aiter::mha_fwd(args, stream_config, std::move(q_dtype_str), is_group_mode, mask_type, bias_type,
                            has_lse, use_ext_asm, how_v3_bf16_cvt, seqstart_q_padding_ptr,
                            seqstart_k_padding_ptr, is_v3_api_check);
}
QOLA_NS_END
