#include "cabm/nn/embedding.h"

#include "cabm/core/threads.h"

#include <algorithm>

namespace cabm {

Embedding make_embedding(int64_t num_embeddings, int64_t dim) {
  CABM_CHECK(num_embeddings > 0 && dim > 0, "Embedding sizes must be positive, got [{}, {}]", num_embeddings, dim);
  return Embedding{Tensor::zeros({num_embeddings, dim})};
}

namespace {
void check_ids(const Tensor& ids, int64_t V) {
  if (!ids.defined() || ids.dtype() != DType::I64 || !ids.is_contiguous())
    throw Error("Embedding: token ids must be a contiguous I64 tensor");
  const int64_t* p = ids.data<int64_t>();
  for (int64_t i = 0; i < ids.numel(); ++i)
    if (p[i] < 0 || p[i] >= V)
      throw Error(fmt::format("Embedding: token id {} at position {} is outside [0, {})", p[i], i, V));
}
}  // namespace

void embedding_forward(const Embedding& embed, const Tensor& ids, const Tensor& y) {
  const int64_t V = embed.num_embeddings(), E = embed.dim(), n = ids.numel();
  check_ids(ids, V);
  CABM_CHECK(y.dim() == 2 && y.size(0) == n && y.size(1) == E && y.stride(1) == 1,
             "Embedding output {} must be [{}, {}]", shape_str(y.shape()), n, E);
  const int64_t* p = ids.data<int64_t>();
  const float* w = embed.weight.data<float>();
  float* out = y.data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) std::copy_n(w + p[i] * E, E, out + i * y.stride(0));
}

void embedding_backward(const Tensor& ids, const Tensor& dy, Embedding& grad) {
  const int64_t V = grad.num_embeddings(), E = grad.dim(), n = ids.numel();
  check_ids(ids, V);
  CABM_CHECK(dy.dim() == 2 && dy.size(0) == n && dy.size(1) == E && dy.stride(1) == 1,
             "Embedding output gradient {} must be [{}, {}]", shape_str(dy.shape()), n, E);
  CABM_CHECK(grad.weight.is_contiguous(), "Embedding gradient must be contiguous");
  const int64_t* p = ids.data<int64_t>();
  const float* g = dy.data<float>();
  float* w = grad.weight.data<float>();
  // Scatter-add without races: each thread owns a band of columns and walks every token in
  // order, so each element's sum order is the token order whatever the thread count.
  constexpr int64_t kBand = 16;
  const int64_t bands = (E + kBand - 1) / kBand;
#pragma omp parallel for schedule(static)
  for (int64_t band = 0; band < bands; ++band) {
    const int64_t c0 = band * kBand, c1 = std::min(E, c0 + kBand);
    for (int64_t i = 0; i < n; ++i) {
      float* row = w + p[i] * E;
      const float* gi = g + i * dy.stride(0);
      for (int64_t c = c0; c < c1; ++c) row[c] += gi[c];
    }
  }
}

}  // namespace cabm
