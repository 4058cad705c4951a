// Internal to kernels/: the paths of attention_flash_bf16_backward that attention/flash_bf16.cpp
// dispatches to (other than the fp32 SIMD tiles'). The packed ones
// (attention/flash_bf16_backward.cpp): avx512_bf16 where bf16_vdpbf16ps_active() without AMX,
// amx_bf16 where AMX tiles are usable as well, amx_bf16_emulated (the AMX body on the scalar tile
// model, a test hook); for calls without score variants (soft-cap, ALiBi). GQA is run here.
#pragma once

#include "cabm/kernels/attention/bf16_packing.h"
#include "cabm/kernels/attention/flash.h"

namespace cabm::detail {

// As attention_flash_bf16_backward, with the tiles resolved by the caller; shapes, the lse and
// the options are checked by the caller.
void attention_flash_bf16_backward_packed(const AttentionSaved& saved, const Tensor& dout,
                                          const AttentionOptions& options, const AttentionGrads& grads,
                                          const FlashConfig& tiles, Bf16Products products);

// The portable path (attention/flash_bf16_portable_backward.cpp): scalar fp32, every variant;
// config as the caller received it (the tiles are resolved here).
void attention_flash_bf16_backward_portable(const AttentionSaved& saved, const Tensor& dout,
                                            const AttentionOptions& options, const AttentionGrads& grads,
                                            const FlashConfig& config);

// The per-row terms of the backward for query rows [i0, i1) of head (b, h), shared by the bf16
// backward paths (one definition, in attention/flash_bf16_portable_backward.cpp, so that every
// path gets the same bits): D_i = dO_i · O_i in fp32 (on dO before it is rounded) into
// delta[i − i0], and lse2_i = lse_i · log2(e) into lse2[i − i0], +inf on fully masked rows (lse
// −inf) so that P = exp2(S·qscale − lse2) is 0 there.
void backward_row_terms(const AttentionSaved& saved, const Tensor& dout, int64_t b, int64_t h, int64_t i0, int64_t i1,
                        float* delta, float* lse2);

}  // namespace cabm::detail
