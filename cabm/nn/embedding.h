// Token embedding, PyTorch's nn.Embedding: a lookup table weight [V, E]; row ids[i] is the
// embedding of token ids[i].
#pragma once

#include "cabm/core/tensor.h"

namespace cabm {

struct Embedding {
  Tensor weight;  // [V, E]

  int64_t num_embeddings() const { return weight.size(0); }
  int64_t dim() const { return weight.size(1); }
};

Embedding make_embedding(int64_t num_embeddings, int64_t dim);  // zero parameters

// ids: I64 [B, T] (any shape; contiguous) with values in [0, V) (else cabm::Error naming the
// position); y: [ids.numel(), E] row view. y[i] = weight[ids[i]]  (gather).
void embedding_forward(const Embedding& embed, const Tensor& ids, const Tensor& y);

// Scatter-add: grad.weight[ids[i]] += dy[i] (accumulates). dy: [ids.numel(), E].
// Split across threads by columns, each summing tokens in order: bitwise the same for every
// thread count.
void embedding_backward(const Tensor& ids, const Tensor& dy, Embedding& grad);

}  // namespace cabm
