/* qola cpp_itfs API of AITER's libmha_fwd: qola::<ns>::mha_fwd forwards to aiter::mha_fwd.
 * Include after AITER's mha_fwd.h is on the include path (csrc/include, CK's 01_fmha). */
#ifndef QOLA_MHA_FWD_H
#define QOLA_MHA_FWD_H
#include <string>
#include "qola_common.h"
#include "mha_fwd.h"

QOLA_NS_BEGIN
using mha_fwd_args = ::aiter::mha_fwd_args;
QOLA_VISIBLE float mha_fwd(mha_fwd_args args, const ck_tile::stream_config& stream_config,
                           std::string q_dtype_str, bool is_group_mode, mask_enum mask_type,
                           bias_enum bias_type, bool has_lse, bool use_ext_asm, int how_v3_bf16_cvt = 1,
                           const void* seqstart_q_padding_ptr = nullptr,
                           const void* seqstart_k_padding_ptr = nullptr, bool is_v3_api_check = false);
QOLA_NS_END

QOLA_C_API const char* QOLA_C_NAME(qola_version)(void);
#endif
