#include "cabm/kernels/attention/mask.h"

#include <algorithm>
#include <cmath>
#include <utility>

namespace cabm {

Mask Mask::causal(CausalAlign align) {
  CABM_CHECK(align != CausalAlign::kNone, "Mask::causal needs an alignment");
  Mask m;
  m.causal_ = align;
  return m;
}

Mask Mask::key_padding(std::vector<int64_t> lengths) {
  for (int64_t len : lengths) CABM_CHECK(len >= 0, "key_padding length {} is negative", len);
  Mask m;
  m.key_lengths_ = std::move(lengths);
  return m;
}

Mask Mask::sliding_window(int64_t left, int64_t right) {
  CABM_CHECK(left >= 0 && right >= 0, "sliding_window sizes must be >= 0, got ({}, {})", left, right);
  Mask m;
  m.window_left_ = std::min(left, kUnbounded);
  m.window_right_ = std::min(right, kUnbounded);
  return m;
}

Mask Mask::block_sparse(BlockSparseLayout layout) {
  CABM_CHECK(layout.block_q > 0 && layout.block_k > 0, "block_sparse block sizes must be positive");
  CABM_CHECK(layout.blocks.defined() && layout.blocks.dtype() == DType::BOOL && layout.blocks.dim() == 3,
             "block_sparse layout must be a BOOL [H, query blocks, key blocks] tensor");
  Mask m;
  m.layouts_.push_back(std::move(layout));
  return m;
}

Mask Mask::allow(Tensor allowed) {
  CABM_CHECK(allowed.defined() && allowed.dtype() == DType::BOOL && allowed.dim() >= 1 && allowed.dim() <= 4,
             "allow mask must be a BOOL tensor of rank 1..4");
  Mask m;
  m.allowed_.push_back(std::move(allowed));
  return m;
}

Mask Mask::additive(Tensor bias) {
  CABM_CHECK(bias.defined() && bias.dtype() == DType::F32 && bias.dim() >= 1 && bias.dim() <= 4,
             "additive mask must be an F32 tensor of rank 1..4");
  Mask m;
  m.biases_.push_back(std::move(bias));
  return m;
}

Mask Mask::operator&(const Mask& other) const {
  Mask m = *this;
  if (other.causal_ != CausalAlign::kNone) {
    CABM_CHECK(m.causal_ == CausalAlign::kNone || m.causal_ == other.causal_,
               "cannot combine bottom-right and top-left causal masks");
    m.causal_ = other.causal_;
  }
  m.window_left_ = std::min(m.window_left_, other.window_left_);
  m.window_right_ = std::min(m.window_right_, other.window_right_);
  if (!other.key_lengths_.empty()) {
    if (m.key_lengths_.empty()) {
      m.key_lengths_ = other.key_lengths_;
    } else {
      CABM_CHECK(m.key_lengths_.size() == other.key_lengths_.size(), "key_padding masks differ in batch size");
      for (size_t b = 0; b < m.key_lengths_.size(); ++b)
        m.key_lengths_[b] = std::min(m.key_lengths_[b], other.key_lengths_[b]);
    }
  }
  m.layouts_.insert(m.layouts_.end(), other.layouts_.begin(), other.layouts_.end());
  m.allowed_.insert(m.allowed_.end(), other.allowed_.begin(), other.allowed_.end());
  m.biases_.insert(m.biases_.end(), other.biases_.begin(), other.biases_.end());
  return m;
}

bool Mask::empty() const {
  return causal_ == CausalAlign::kNone && !has_window() && key_lengths_.empty() && layouts_.empty() &&
         allowed_.empty() && biases_.empty();
}

Tensor broadcast_to_bhnm(const Tensor& t, int64_t B, int64_t H, int64_t N, int64_t M, const char* what) {
  const Shape target = {B, H, N, M};
  if (t.dim() > 4)
    throw Error(
        fmt::format("{} has shape {}, which does not broadcast to {}", what, shape_str(t.shape()), shape_str(target)));
  Shape strides(4, 0);
  const int64_t pad = 4 - t.dim();
  for (int64_t axis = 0; axis < t.dim(); ++axis) {
    const int64_t size = t.size(axis);
    if (size == target[pad + axis]) {
      strides[pad + axis] = size == 1 ? 0 : t.stride(axis);
    } else if (size != 1) {
      throw Error(fmt::format("{} has shape {}, which does not broadcast to {}", what, shape_str(t.shape()),
                              shape_str(target)));
    }
  }
  return t.as_strided(target, strides);
}

void Mask::validate(int64_t B, int64_t H, int64_t N, int64_t M) const {
  if (!key_lengths_.empty()) {
    if (static_cast<int64_t>(key_lengths_.size()) != B)
      throw Error(fmt::format("key_padding mask has {} lengths for batch size {}", key_lengths_.size(), B));
    for (int64_t len : key_lengths_)
      if (len > M) throw Error(fmt::format("key_padding length {} exceeds the key length {}", len, M));
  }
  for (const BlockSparseLayout& layout : layouts_) {
    const int64_t qb = (N + layout.block_q - 1) / layout.block_q, kb = (M + layout.block_k - 1) / layout.block_k;
    const Tensor& blocks = layout.blocks;
    if ((blocks.size(0) != 1 && blocks.size(0) != H) || blocks.size(1) != qb || blocks.size(2) != kb)
      throw Error(fmt::format("block_sparse layout has shape {}, expected [1 or {}, {}, {}] for blocks of {}x{}",
                              shape_str(blocks.shape()), H, qb, kb, layout.block_q, layout.block_k));
  }
  for (const Tensor& t : allowed_) broadcast_to_bhnm(t, B, H, N, M, "allow mask");
  for (const Tensor& t : biases_) broadcast_to_bhnm(t, B, H, N, M, "additive mask");
}

bool Mask::structurally_allows(int64_t b, int64_t h, int64_t i, int64_t j, int64_t N, int64_t M) const {
  if (causal_ == CausalAlign::kTopLeft && j > i) return false;
  const int64_t p = i + M - N;  // bottom-right position of query i among the keys
  if (causal_ == CausalAlign::kBottomRight && j > p) return false;
  if (window_left_ != kUnbounded && j < p - window_left_) return false;
  if (window_right_ != kUnbounded && j > p + window_right_) return false;
  if (!key_lengths_.empty() && j >= key_lengths_[b]) return false;
  for (const BlockSparseLayout& layout : layouts_) {
    const Tensor& blocks = layout.blocks;
    const int64_t hh = blocks.size(0) == 1 ? 0 : h;
    const uint8_t* p_blocks = blocks.data<uint8_t>();
    if (!p_blocks[hh * blocks.stride(0) + (i / layout.block_q) * blocks.stride(1) +
                  (j / layout.block_k) * blocks.stride(2)])
      return false;
  }
  return true;
}

ResolvedMask::ResolvedMask(const Mask& mask, int64_t B, int64_t H, int64_t N, int64_t M) : mask_(mask), N_(N), M_(M) {
  mask.validate(B, H, N, M);
  for (const Tensor& t : mask.allowed()) allowed_.push_back(broadcast_to_bhnm(t, B, H, N, M, "allow mask"));
  for (const Tensor& t : mask.biases()) biases_.push_back(broadcast_to_bhnm(t, B, H, N, M, "additive mask"));
  for (const Tensor& t : allowed_) allowed_at_.push_back(detail::MaskElements<uint8_t>::of(t));
  for (const Tensor& t : biases_) biases_at_.push_back(detail::MaskElements<float>::of(t));
}

bool ResolvedMask::allows(int64_t b, int64_t h, int64_t i, int64_t j) const {
  if (!mask_.structurally_allows(b, h, i, j, N_, M_)) return false;
  for (const detail::MaskElements<uint8_t>& t : allowed_at_)
    if (!t.at(b, h, i, j)) return false;
  return true;
}

float ResolvedMask::term(int64_t b, int64_t h, int64_t i, int64_t j) const {
  if (!mask_.structurally_allows(b, h, i, j, N_, M_)) return -INFINITY;
  float t;
  tensor_terms(b, h, i, j, 1, &t);
  return t;
}

void ResolvedMask::tensor_terms(int64_t b, int64_t h, int64_t i, int64_t j0, int64_t n, float* terms) const {
  std::fill_n(terms, n, 0.0f);
  for (const detail::MaskElements<float>& t : biases_at_) {
    const float* row = &t.data[b * t.sb + h * t.sh + i * t.si + j0 * t.sj];
    if (t.sj == 1) {
      for (int64_t j = 0; j < n; ++j) terms[j] += row[j];
    } else {
      for (int64_t j = 0; j < n; ++j) terms[j] += row[j * t.sj];
    }
  }
  for (const detail::MaskElements<uint8_t>& t : allowed_at_) {
    const uint8_t* row = &t.data[b * t.sb + h * t.sh + i * t.si + j0 * t.sj];
    if (t.sj == 1) {
      for (int64_t j = 0; j < n; ++j) terms[j] = row[j] ? terms[j] : -INFINITY;
    } else {
      for (int64_t j = 0; j < n; ++j) terms[j] = row[j * t.sj] ? terms[j] : -INFINITY;
    }
  }
}

bool ResolvedMask::tensor_terms_query_invariant() const {
  return std::all_of(allowed_at_.begin(), allowed_at_.end(), [](const auto& t) { return t.si == 0; }) &&
         std::all_of(biases_at_.begin(), biases_at_.end(), [](const auto& t) { return t.si == 0; });
}

void ResolvedMask::fill_row(int64_t b, int64_t h, int64_t i, float* row) const {
  tensor_terms(b, h, i, 0, M_, row);
  for (int64_t j = 0; j < M_; ++j)
    if (!mask_.structurally_allows(b, h, i, j, N_, M_)) row[j] = -INFINITY;
}

std::vector<uint8_t> fully_masked_query_rows(const Mask& mask, int64_t B, int64_t H, int64_t N, int64_t M) {
  const ResolvedMask resolved(mask, B, H, N, M);
  std::vector<uint8_t> flags(static_cast<size_t>(B * N), 0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < N; ++i) {
        bool any = false;  // stops at the row's first attendable key
        for (int64_t j = 0; j < M && !any; ++j) any = resolved.term(b, h, i, j) != -INFINITY;
        if (!any) flags[b * N + i] = 1;
      }
  return flags;
}

}  // namespace cabm
