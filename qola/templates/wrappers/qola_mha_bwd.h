/* qola cpp_itfs API of AITER's libmha_bwd: qola::<ns>::mha_bwd forwards to aiter::mha_bwd. */
#ifndef QOLA_MHA_BWD_H
#define QOLA_MHA_BWD_H
#include <string>
#include "qola_common.h"
#include "mha_bwd.h"

QOLA_NS_BEGIN
using mha_bwd_args = ::aiter::mha_bwd_args;
QOLA_VISIBLE float mha_bwd(mha_bwd_args args, const ck_tile::stream_config& stream_config,
                           std::string q_dtype_str, bool is_group_mode, mask_enum mask_type,
                           bias_enum bias_type, bool has_dbias, bool is_store_randval, bool deterministic,
                           bool use_ext_asm, bool is_v3_atomic_fp32, int how_v3_bf16_cvt,
                           const void* seqlen_q_padded = nullptr, const void* seqlen_k_padded = nullptr,
                           bool is_v3_api_check = false);
QOLA_NS_END

QOLA_C_API const char* QOLA_C_NAME(qola_version)(void);
#endif
