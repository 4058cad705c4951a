// Loss options shared by the models' loss functions (mean cross-entropy, PyTorch semantics;
// see cabm/kernels/cross_entropy.h).
#pragma once

#include "cabm/core/tensor.h"
#include "cabm/kernels/cross_entropy.h"

namespace cabm {

struct LossOptions {
  int64_t ignore_index = -100;   // targets equal to this do not count (PyTorch's default)
  float label_smoothing = 0.0f;  // ε in [0, 1]
  bool compute_grad = true;      // also write the logits' gradient (for backward)
  float grad_scale = 1.0f;       // dlogits = grad_scale · ∂loss/∂logits, e.g. 1/micro-batches
};

// logits: [rows, V] (row view); targets: I64 with rows elements; lse: [rows] saved;
// dlogits: [rows, V] written when options.compute_grad (both allocated via ensure_shape).
CrossEntropyResult cross_entropy_loss(const Tensor& logits, const Tensor& targets, const LossOptions& options,
                                      Tensor& lse, Tensor& dlogits);

}  // namespace cabm
