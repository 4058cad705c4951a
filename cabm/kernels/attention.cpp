#include "cabm/kernels/attention.h"

#include "cabm/kernels/attention_flash_bf16.h"

namespace cabm {

AttentionKernel attention_forward_kernel(DType dtype, const AttentionOptions&) {
  return dtype == DType::BF16 ? AttentionKernel::kFlashBf16 : AttentionKernel::kFlash;
}

AttentionKernel attention_backward_kernel(const AttentionSaved& saved, const AttentionOptions&) {
  if (saved.q.dtype() == DType::BF16) return AttentionKernel::kFlashBf16;
  return saved.lse.defined() ? AttentionKernel::kFlash : AttentionKernel::kReference;
}

void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& options,
                       const Tensor& out, const Tensor* lse) {
  CABM_CHECK(q.dtype() == k.dtype() && q.dtype() == v.dtype() && (q.dtype() == DType::F32 || q.dtype() == DType::BF16),
             "attention: q, k, v must all be F32 or all BF16, got {}, {}, {}", dtype_name(q.dtype()),
             dtype_name(k.dtype()), dtype_name(v.dtype()));
  switch (attention_forward_kernel(q.dtype(), options)) {
    case AttentionKernel::kFlashBf16: return attention_flash_bf16_forward(q, k, v, options, out, lse);
    case AttentionKernel::kFlash: return attention_flash_forward(q, k, v, options, out, lse);
    case AttentionKernel::kReference: return attention_reference_forward(q, k, v, options, out, nullptr, lse);
  }
}

void attention_backward(const AttentionSaved& saved, const Tensor& dout, const AttentionOptions& options,
                        const AttentionGrads& grads) {
  switch (attention_backward_kernel(saved, options)) {
    case AttentionKernel::kFlashBf16:
      CABM_CHECK(saved.lse.defined(), "attention_backward: bf16 operands need the forward's lse");
      return attention_flash_bf16_backward(saved, dout, options, grads);
    case AttentionKernel::kFlash: return attention_flash_backward(saved, dout, options, grads);
    case AttentionKernel::kReference: return attention_reference_backward(saved, dout, options, grads);
  }
}

}  // namespace cabm
