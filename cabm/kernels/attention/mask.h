// Attention masks: one explicit type, never a bare bool tensor whose polarity must be guessed.
//
// A Mask is a conjunction of parts; position (b, h, i, j) — batch b, head h, query i, key j —
// may be attended iff every part allows it, and its score gets the sum of all additive biases.
// Build masks with the named constructors and combine them with `&`:
//
//   Mask::causal() & Mask::key_padding({5, 3})
//
// Conversions from PyTorch's conventions (bool True = blocked; key_padding_mask True =
// padding) happen only at the I/O boundary (io/, cli/), never here.
//
// Alignment: with N queries and M keys, causal and sliding-window masks align bottom-right,
// as decoding with a KV cache needs: query i sits at key position i + M − N. The top-left
// causal variant (query i sits at key position i, PyTorch's triu(diagonal=1)) is available for
// parity with PyTorch.
#pragma once

#include "cabm/core/tensor.h"

#include <cstdint>
#include <limits>
#include <vector>

namespace cabm {

enum class CausalAlign { kNone, kBottomRight, kTopLeft };

// Block-sparse layout: query block qb may attend key block kb iff blocks[h, qb, kb] is true.
// blocks: BOOL [H or 1, ceil(N / block_q), ceil(M / block_k)].
struct BlockSparseLayout {
  int64_t block_q = 0;
  int64_t block_k = 0;
  Tensor blocks;
};

class Mask {
 public:
  static constexpr int64_t kUnbounded = std::numeric_limits<int64_t>::max() / 4;

  Mask() = default;  // attends everywhere
  static Mask causal(CausalAlign align = CausalAlign::kBottomRight);
  // lengths[b] valid keys in batch item b; keys j >= lengths[b] are padding.
  static Mask key_padding(std::vector<int64_t> lengths);
  // Query i (at key position p = i + M − N) sees keys j with p − left <= j <= p + right.
  // Either side may be kUnbounded. causal() is sliding_window(kUnbounded, 0).
  static Mask sliding_window(int64_t left, int64_t right);
  static Mask block_sparse(BlockSparseLayout layout);
  // allowed: BOOL broadcastable to [B, H, N, M] (right-aligned, size 1 broadcasts);
  // true = may attend (the seed's `mask != 0`).
  static Mask allow(Tensor allowed);
  // bias: F32 broadcastable to [B, H, N, M], added to the scaled scores; −inf blocks.
  static Mask additive(Tensor bias);

  Mask operator&(const Mask& other) const;

  bool empty() const;  // no part at all: attends everywhere
  CausalAlign causal_align() const { return causal_; }
  bool has_window() const { return window_left_ != kUnbounded || window_right_ != kUnbounded; }
  int64_t window_left() const { return window_left_; }
  int64_t window_right() const { return window_right_; }
  const std::vector<int64_t>& key_lengths() const { return key_lengths_; }
  const std::vector<BlockSparseLayout>& block_layouts() const { return layouts_; }
  const std::vector<Tensor>& allowed() const { return allowed_; }
  const std::vector<Tensor>& biases() const { return biases_; }

  // Checks every part against the attention's sizes; throws cabm::Error naming the part.
  void validate(int64_t B, int64_t H, int64_t N, int64_t M) const;

  // Structural parts only (causal, window, lengths, blocks): no tensor lookups.
  bool structurally_allows(int64_t b, int64_t h, int64_t i, int64_t j, int64_t N, int64_t M) const;

 private:
  CausalAlign causal_ = CausalAlign::kNone;
  int64_t window_left_ = kUnbounded;
  int64_t window_right_ = kUnbounded;
  std::vector<int64_t> key_lengths_;
  std::vector<BlockSparseLayout> layouts_;
  std::vector<Tensor> allowed_;
  std::vector<Tensor> biases_;
};

namespace detail {
// The elements of a 4-d [B, H, N, M] view by index arithmetic alone, for the masks' per-element
// lookups (Tensor's checked accessors are calls: too slow once per element). Points into the
// view's storage, which its owner keeps alive.
template <typename T>
struct MaskElements {
  const T* data;
  int64_t sb, sh, si, sj;
  static MaskElements of(const Tensor& t) { return {t.data<T>(), t.stride(0), t.stride(1), t.stride(2), t.stride(3)}; }
  T at(int64_t b, int64_t h, int64_t i, int64_t j) const { return data[b * sb + h * sh + i * si + j * sj]; }
};
}  // namespace detail

// A Mask resolved against concrete sizes: tensor parts become 4-d views with zero strides
// on broadcast axes. Used by kernels to evaluate one row at a time.
class ResolvedMask {
 public:
  ResolvedMask(const Mask& mask, int64_t B, int64_t H, int64_t N, int64_t M);

  // Writes the additive term of row (b, h, i) into row[0..M): bias sum, or −inf where blocked.
  void fill_row(int64_t b, int64_t h, int64_t i, float* row) const;
  // The additive term of one element (as fill_row writes it).
  float term(int64_t b, int64_t h, int64_t i, int64_t j) const;
  bool allows(int64_t b, int64_t h, int64_t i, int64_t j) const;
  bool has_bias() const { return !biases_.empty(); }

  const Mask& mask() const { return mask_; }
  bool has_tensor_parts() const { return !allowed_at_.empty() || !biases_at_.empty(); }
  // The allow and additive tensors alone (not the structural parts) at keys [j0, j0 + n) of row
  // (b, h, i): −inf where an allow tensor blocks, else the biases' sum, into terms[0, n). One
  // tensor at a time along the row (vectorised where its keys are contiguous or broadcast).
  void tensor_terms(int64_t b, int64_t h, int64_t i, int64_t j0, int64_t n, float* terms) const;
  // Whether tensor_terms is the same for every query row i: every tensor part is broadcast over
  // the queries (a key-padding tensor [B, 1, 1, M], as PyTorch's float key_padding_mask becomes).
  bool tensor_terms_query_invariant() const;

 private:
  Mask mask_;  // a copy (tensors are shared): a ResolvedMask may outlive the Mask it came from
  int64_t N_, M_;
  std::vector<Tensor> allowed_;  // BOOL [B, H, N, M] views
  std::vector<Tensor> biases_;   // F32 [B, H, N, M] views
  std::vector<detail::MaskElements<uint8_t>> allowed_at_;
  std::vector<detail::MaskElements<float>> biases_at_;
};

// flags[b·N + i] = 1 where query row i of batch item b has no attendable key in at least one
// head (its attention output is 0 in cabm; PyTorch returns NaN there).
std::vector<uint8_t> fully_masked_query_rows(const Mask& mask, int64_t B, int64_t H, int64_t N, int64_t M);

// Broadcasts a tensor of rank <= 4 to [B, H, N, M] as a zero-stride view; throws cabm::Error
// naming `what` when it does not broadcast.
Tensor broadcast_to_bhnm(const Tensor& t, int64_t B, int64_t H, int64_t N, int64_t M, const char* what);

}  // namespace cabm
