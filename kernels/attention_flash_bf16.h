// Tiled attention with bf16 operands and fp32 accumulation (mixed precision), forward pass.
// FlashAttention-2 (Dao 2023) like attention_flash.h, with the same conventions (layout, scale,
// masks, fully masked rows → 0 and lse = −inf, counter-based dropout identical to the reference).
//
// Numerics: Q, K, V are bf16. S = Q·Kᵀ is accumulated in fp32 (each bf16·bf16 product is exact in
// fp32); the running maximum, the running sum l, the accumulator O and the log-sum-exp are fp32.
// P = exp(S − m) is computed in fp32, summed into l in fp32, and rounded to bf16 only as the input
// of the second product O += P·V (as FlashAttention does on GPUs). The output is fp32; callers that
// store bf16 activations round it with float_to_bf16.
//
// Paths (kernels/bf16.h selects at run time): avx512_bf16 does both products with vdpbf16ps on
// pair-interleaved packed tiles (K: 16 keys × 2 head-dim elements per zmm; V: 2 keys × 16 columns
// per zmm; Q and P rows read as 32-bit pairs and broadcast); portable does the same arithmetic on
// the same packed tiles with scalar fp32 math. Both round P identically; they differ only in the
// order of fp32 sums.
#pragma once

#include "kernels/attention_flash.h"

namespace cabm {

// q [B, N, H, d], k [B, M, H, d], v [B, M, H, dv]: BF16 strided views with unit last stride.
// out [B, N, H, dv]: F32 (any strided view with unit last stride), overwritten.
// lse: null or F32 [B, H, N] contiguous (natural log; −inf for fully masked rows).
// config: tile sizes as FlashConfig (0 = default); block_k is rounded up to a multiple of 16.
void attention_flash_bf16_forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& options,
                                  const Tensor& out, const Tensor* lse = nullptr, const FlashConfig& config = {});

// The path attention_flash_bf16_forward takes now: "avx512_bf16" or "portable".
const char* attention_flash_bf16_path();

}  // namespace cabm
