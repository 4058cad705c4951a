// Internal to kernels/: the avx512_bf16 path of attention_flash_bf16_backward
// (attention/flash_bf16_backward.cpp), run where bf16_active_isa() is kAvx512Bf16 (AMX CPUs
// included: it has no AMX variant) for calls without score variants (soft-cap, ALiBi); GQA is
// run here.
#pragma once

#include "cabm/kernels/attention/flash.h"

namespace cabm::detail {

// As attention_flash_bf16_backward, with the tiles resolved by the caller; shapes, the lse and
// the options are checked by the caller.
void attention_flash_bf16_backward_avx512(const AttentionSaved& saved, const Tensor& dout,
                                          const AttentionOptions& options, const AttentionGrads& grads,
                                          const FlashConfig& tiles);

}  // namespace cabm::detail
