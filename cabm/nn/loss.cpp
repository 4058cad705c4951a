#include "cabm/nn/loss.h"

namespace cabm {

CrossEntropyResult cross_entropy_loss(const Tensor& logits, const Tensor& targets, const LossOptions& options,
                                      Tensor& lse, Tensor& dlogits) {
  CABM_CHECK(logits.dim() == 2 && logits.stride(1) == 1, "cross-entropy logits {} must be a [rows, V] view",
             shape_str(logits.shape()));
  const int64_t rows = logits.size(0), V = logits.size(1);
  if (!targets.defined() || targets.dtype() != DType::I64 || targets.numel() != rows || !targets.is_contiguous())
    throw Error(fmt::format("cross-entropy: targets must be a contiguous I64 tensor of {} elements, got {}", rows,
                            targets.defined() ? shape_str(targets.shape()) : "undefined"));
  const CrossEntropyArgs args{rows, V, options.ignore_index, options.label_smoothing};
  ensure_shape(lse, {rows});
  const CrossEntropyResult result =
      cross_entropy_forward(args, logits.data<float>(), logits.stride(0), targets.data<int64_t>(), lse.data<float>());
  if (options.compute_grad) {
    ensure_shape(dlogits, {rows, V});
    cross_entropy_backward(args, logits.data<float>(), logits.stride(0), targets.data<int64_t>(), lse.data<float>(),
                           result.count, options.grad_scale, dlogits.data<float>(), V);
  }
  return result;
}

}  // namespace cabm
