// Attention entry points: the one place that selects which kernel runs.
//
//   attention_forward   → attention_flash_forward for every mask kind (causal either way, key
//                         padding, sliding window, block-sparse, allow and additive tensors, and
//                         their combinations), dropout, any d, dv, N, M >= 1 and any strides with
//                         a unit last stride.
//   attention_backward  → attention_flash_backward when saved.lse is defined, else
//                         attention_reference_backward (which recomputes the softmax rows).
//
// Callers that need the attention weights (need_weights) call attention_reference_forward
// directly: the weights are the N×M matrix the fast path exists to avoid.
#pragma once

#include "cabm/kernels/attention_flash.h"
#include "cabm/kernels/attention_reference.h"

namespace cabm {

enum class AttentionKernel { kFlash, kReference };

// Which kernel attention_forward / attention_backward would run.
AttentionKernel attention_forward_kernel(const AttentionOptions& options);
AttentionKernel attention_backward_kernel(const AttentionSaved& saved, const AttentionOptions& options);

// q [B, N, H, d], k [B, M, H, d], v [B, M, H, dv] → out [B, N, H, dv]; lse F32 [B, H, N]
// contiguous if non-null (save it for attention_backward).
void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& options,
                       const Tensor& out, const Tensor* lse = nullptr);

// dout [B, N, H, dv] → grads (overwritten).
void attention_backward(const AttentionSaved& saved, const Tensor& dout, const AttentionOptions& options,
                        const AttentionGrads& grads);

}  // namespace cabm
