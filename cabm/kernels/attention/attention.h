// Attention entry points: the one place that selects which kernel runs. Everything above the
// kernels (cabm/nn/) calls only these two functions and attention_reference_forward (for the
// attention weights).
//
//   attention_forward   F32 q, k, v → attention_flash_forward (tiled, fp32) for every mask kind
//                       (causal either way, key padding, sliding window, block-sparse, allow and
//                       additive tensors, and their combinations), dropout, any d, dv, N, M >= 1
//                       and any strides with a unit last stride;
//                       BF16 q, k, v → attention_flash_bf16_forward (mixed precision: bf16
//                       products, fp32 accumulation and output), whose ISA path is chosen at run
//                       time (attention_flash_bf16_path()).
//                       A few query rows per head (N <= kDecodeMaxQueryRows: decoding) with
//                       causal/window/padding masks and no dropout → attention_decode_forward
//                       (split keys, each K/V row read once per GQA group; attention/decode.h).
//   attention_backward  F32 saved tensors: attention_flash_backward when saved.lse is defined,
//                       else attention_reference_backward (which recomputes the softmax rows);
//                       BF16 saved q, k, v: attention_flash_bf16_backward (lse required).
//
// The variants of current models (GQA/MQA, soft-capping, ALiBi, sinks; attention/reference.h):
// a kernel runs them when flash_supports_variants says it does, else the reference runs (on F32
// copies of BF16 operands). Sinks are applied here around every tiled kernel: the forward folds
// σ_h into the saved log-sum-exp (lse' = log(e^lse + e^σ), out · e^(lse − lse')), which the
// tiled backward then recomputes P from, and dL/dσ_h = −Σ_i e^(σ_h − lse'_i) (dO_i · O_i).
//
// Callers that need the attention weights (need_weights) call attention_reference_forward
// directly: the weights are the N×M matrix the fast path exists to avoid.
#pragma once

#include "cabm/kernels/attention/decode.h"
#include "cabm/kernels/attention/flash.h"
#include "cabm/kernels/attention/reference.h"

namespace cabm {

enum class AttentionKernel { kFlash, kFlashBf16, kDecode, kReference };

// Which kernel attention_forward / attention_backward would run for these operands.
AttentionKernel attention_forward_kernel(const Tensor& q, const Tensor& k, const AttentionOptions& options);
AttentionKernel attention_backward_kernel(const AttentionSaved& saved, const AttentionOptions& options);

// q [B, N, H, d], k [B, M, Hkv, d], v [B, M, Hkv, dv], all F32 or all BF16 → out F32 [B, N, H, dv];
// lse F32 [B, H, N] contiguous if non-null (save it for attention_backward).
void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& options,
                       const Tensor& out, const Tensor* lse = nullptr);

// dout F32 [B, N, H, dv] → grads F32 (overwritten), for saved q, k, v of the forward's dtype.
void attention_backward(const AttentionSaved& saved, const Tensor& dout, const AttentionOptions& options,
                        const AttentionGrads& grads);

}  // namespace cabm
