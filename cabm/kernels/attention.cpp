#include "cabm/kernels/attention.h"

namespace cabm {

AttentionKernel attention_forward_kernel(const AttentionOptions&) { return AttentionKernel::kFlash; }

AttentionKernel attention_backward_kernel(const AttentionSaved& saved, const AttentionOptions&) {
  return saved.lse.defined() ? AttentionKernel::kFlash : AttentionKernel::kReference;
}

void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& options,
                       const Tensor& out, const Tensor* lse) {
  if (attention_forward_kernel(options) == AttentionKernel::kFlash) attention_flash_forward(q, k, v, options, out, lse);
  else attention_reference_forward(q, k, v, options, out, nullptr, lse);
}

void attention_backward(const AttentionSaved& saved, const Tensor& dout, const AttentionOptions& options,
                        const AttentionGrads& grads) {
  if (attention_backward_kernel(saved, options) == AttentionKernel::kFlash)
    attention_flash_backward(saved, dout, options, grads);
  else attention_reference_backward(saved, dout, options, grads);
}

}  // namespace cabm
