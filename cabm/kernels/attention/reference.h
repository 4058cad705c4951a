// Reference scaled dot-product attention: the seed's math, written to be read.
//
//   S = Q Kᵀ · scale + mask,   A = softmax(S) (row-wise),   O = A V
//
// It builds each N×M score row explicitly. It is the oracle every fast attention kernel is
// tested against, the path used when attention weights are requested (need_weights), and the
// fallback for whatever the fast path does not take.
//
// Conventions shared with every attention kernel in cabm:
//  - Layout: q [B, N, H, d], k [B, M, Hkv, d], v [B, M, Hkv, dv], out [B, N, H, dv], all strided
//    views (heads are views of [B, N, E] activations, never transposed copies).
//  - Grouped-query attention (GQA/MQA; Ainslie et al. 2023): H is a multiple of Hkv and query
//    head h reads key/value head h / (H / Hkv), PyTorch's `enable_gqa`. Hkv = H is plain
//    multi-head attention. Masks, dropout, biases and sinks are indexed by the query head.
//  - A score is built in this order (see attention_score_order in docs/attention_variants.md):
//    scale · q·k, soft-cap c·tanh(s/c), + ALiBi bias −slope_h·|pos_q − pos_k| + additive mask
//    parts, then the blocking parts (bool, causal, window, padding, blocks) set −∞.
//  - Attention sinks (Xiao et al. 2023; gpt-oss): a logit per head that joins each row's
//    softmax denominator and contributes no value.
//  - scale defaults to 1/√d.
//  - Softmax subtracts the row maximum before exp (stable for any logits).
//  - A fully masked row (every score −inf) gives output 0, weights 0 and log-sum-exp −inf:
//    never NaN.
//  - Dropout on the attention weights (training): weight (b, h, i, j) is kept iff
//    attention_dropout_keep(...) and kept weights are scaled by 1/(1−p). Returned weights are
//    the ones multiplied with V (after dropout), as PyTorch's MultiheadAttention returns them.
#pragma once

#include "cabm/core/rng.h"
#include "cabm/core/tensor.h"
#include "cabm/kernels/attention/mask.h"

#include <cstdint>
#include <optional>
#include <vector>

namespace cabm {

struct AttentionOptions {
  Mask mask;
  std::optional<float> scale;  // default 1/√d
  float dropout = 0.0f;        // probability of dropping an attention weight; 0 in eval
  uint64_t dropout_seed = 0;   // with dropout_offset, selects the random stream
  uint64_t dropout_offset = 0; // advance per call (e.g. per layer and step)
  // Logit soft-capping (Gemma 2): c > 0 maps a scaled score s to c·tanh(s/c); 0 = off.
  float softcap = 0.0f;
  // ALiBi (Press et al. 2022): empty = off, else one slope per query head ([H]); the score of
  // query i and key j gets −slope_h·|q_position(i) − k_position(j)|.
  std::vector<float> alibi_slopes;
  // Positions ALiBi reads: empty = keys 0…M−1 and queries M−N…M−1 (bottom-right aligned, as
  // the causal mask and a KV cache are), else [N] and [M].
  std::vector<int64_t> q_positions, k_positions;
  // Attention sinks: undefined = none, else F32 [H] contiguous, one logit per query head.
  Tensor sinks;
};

float attention_scale(const AttentionOptions& options, int64_t d);

// Checks the variant options against the sizes (slopes [H], positions [N] / [M], sinks [H],
// softcap finite and >= 0); throws cabm::Error naming the option.
void check_attention_variants(const AttentionOptions& options, int64_t H, int64_t N, int64_t M);

// The paper's ALiBi slopes for H heads: 2^(−8(i+1)/H) for H a power of two; otherwise those of
// the largest power of two below H, then every other slope of twice that count (the rule of
// the ALiBi authors' code), as Hugging Face's and PyTorch's models compute them.
std::vector<float> alibi_paper_slopes(int64_t H);

// Whether attention weight (b, h, i, j) survives dropout. Counter-based: the same answer in
// every kernel, forward and backward, for any thread count.
inline bool attention_dropout_keep(const AttentionOptions& options, int64_t b, int64_t h, int64_t H, int64_t i,
                                   int64_t j, int64_t M) {
  const uint64_t stream = options.dropout_offset * 0x100000000ull + static_cast<uint64_t>(b * H + h);
  return uniform(options.dropout_seed, stream, static_cast<uint64_t>(i * M + j)) >= options.dropout;
}

// The dropout decisions of one (b, h) attention matrix, row segment at a time. keep(i, j) is
// attention_dropout_keep(options, b, h, H, i, j, M) exactly; fill_row gives the same decisions for a
// run of keys while drawing each Philox block once (four consecutive elements share one block).
class DropoutMatrix {
 public:
  DropoutMatrix(const AttentionOptions& options, int64_t b, int64_t h, int64_t H, int64_t M);
  bool keep(int64_t i, int64_t j) const {
    return uniform(seed_, stream_, static_cast<uint64_t>(i * M_ + j)) >= p_;
  }
  // out[(j − j0) · stride] = keep(i, j) ? value : 0 for j in [j0, j1).
  void fill_row(int64_t i, int64_t j0, int64_t j1, float value, float* out, int64_t stride) const;

 private:
  uint64_t seed_, stream_;
  int64_t M_;
  float p_;
};

// What attention backward needs from the forward pass (the "cache" of STYLE.md): the inputs, the
// output and, for the flash kernel, the per-row log-sum-exp. q [B, N, H, d], k [B, M, H, d],
// v [B, M, H, dv], out [B, N, H, dv] (strided views); lse F32 [B, H, N] contiguous, may be
// undefined for the reference backward (it recomputes the softmax rows from scratch).
struct AttentionSaved {
  Tensor q, k, v, out, lse;
};

// Gradients with respect to q, k, v: preallocated strided views with the shapes of q, k, v
// (e.g. head views of one [B, N, 3E] buffer). Backward overwrites them. With GQA, dk and dv of a
// key/value head are the sums over the query heads of its group, added in head order.
// dsinks: F32 [H] contiguous, overwritten when options.sinks is defined (may be left undefined
// when that gradient is not wanted).
struct AttentionGrads {
  Tensor dq, dk, dv;
  Tensor dsinks{};
};

// Checks shapes and strides of q, k, v, out for the conventions above; throws cabm::Error naming
// the tensor. operands: the dtype of q, k and v (F32, or BF16 for the bf16 tiled kernels, which
// take the same shapes); out is F32 in both.
void check_attention_shapes(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                            DType operands = DType::F32);

// Writes out [B, N, H, dv]. If weights is non-null it must be F32 [B, H, N, M] contiguous and
// receives A. If lse is non-null it must be F32 [B, H, N] contiguous and receives the
// log-sum-exp of each row of S (−inf for fully masked rows).
void attention_reference_forward(const Tensor& q, const Tensor& k, const Tensor& v,
                                 const AttentionOptions& options, const Tensor& out,
                                 const Tensor* weights = nullptr, const Tensor* lse = nullptr);

// Backward of attention_reference_forward: dout [B, N, H, dv] → grads. Recomputes each softmax row
// (N×M work, O(M) memory per thread). Same mask, scale and dropout semantics as the forward;
// fully masked rows get zero gradients. See the derivation in the .cpp.
void attention_reference_backward(const AttentionSaved& saved, const Tensor& dout, const AttentionOptions& options,
                                  const AttentionGrads& grads);

// Checks the tensors of a backward call (saved, dout, grads) against each other; throws cabm::Error.
// operands as in check_attention_shapes (dout and the gradients are F32 in both); need_lse: the
// kernel needs the forward's lse (an undefined saved.lse is then an error, not a recomputation).
void check_attention_backward_shapes(const AttentionSaved& saved, const Tensor& dout, const AttentionGrads& grads,
                                     DType operands = DType::F32, bool need_lse = false);

struct AttentionResult {
  Tensor output;   // [B, N, H, dv]
  Tensor weights;  // [B, H, N, M], defined only when requested
};

// Allocating convenience form: scaled_dot_product_attention(q, k, v, options) -> (output, weights).
AttentionResult scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                             const AttentionOptions& options, bool need_weights = false);

}  // namespace cabm
