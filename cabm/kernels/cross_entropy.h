// Mean cross-entropy over rows of logits, PyTorch's F.cross_entropy(logits, targets,
// ignore_index=..., label_smoothing=ε, reduction="mean") without class weights:
//   loss_r = (1 − ε) · (−log p_r[t_r]) + (ε / V) · Σ_c (−log p_r[c]),   p_r = softmax(z_r)
//   loss   = Σ_{r : t_r ≠ ignore_index} loss_r / count,   count = #{r : t_r ≠ ignore_index}
// When every target is ignored PyTorch returns NaN (0/0); cabm returns loss 0 and gradient 0,
// so an all-padding micro-batch does not poison an accumulated step.
#pragma once

#include <cstdint>

namespace cabm {

struct CrossEntropyArgs {
  int64_t rows;
  int64_t V;                     // classes
  int64_t ignore_index = -100;   // PyTorch's default
  float label_smoothing = 0.0f;  // ε in [0, 1]
};

struct CrossEntropyResult {
  float loss;     // the mean above (accumulated in double)
  int64_t count;  // rows that count (target ≠ ignore_index)
};

// logits: [rows, V] row stride ld; targets: [rows] in [0, V) or ignore_index (else throws
// cabm::Error naming the row); lse: [rows], written with each row's log-sum-exp (saved for
// the backward pass).
CrossEntropyResult cross_entropy_forward(const CrossEntropyArgs& args, const float* logits, int64_t ld,
                                         const int64_t* targets, float* lse);

// dlogits = scale · ∂loss/∂logits, written (not accumulated; may alias logits):
//   ∂loss/∂z_r[c] = (p_r[c] − (1 − ε)·[c = t_r] − ε/V) / count   for counted rows, 0 otherwise.
// count comes from the forward result. dlogits: [rows, V] row stride d_ld.
void cross_entropy_backward(const CrossEntropyArgs& args, const float* logits, int64_t ld, const int64_t* targets,
                            const float* lse, int64_t count, float scale, float* dlogits, int64_t d_ld);

}  // namespace cabm
