#include "cabm/nn/init.h"

#include <cmath>

namespace cabm {

namespace {
// U(−bound, bound) over every element (the tensor may be a strided view).
void fill_uniform(const Tensor& t, float bound, Rng& rng) {
  CABM_CHECK(t.dim() >= 1 && t.dim() <= 2 && t.stride(-1) == 1, "fill_uniform needs a 1-d or 2-d row-major tensor");
  const int64_t rows = t.dim() == 2 ? t.size(0) : 1, cols = t.size(-1), ld = t.dim() == 2 ? t.stride(0) : cols;
  float* p = t.data<float>();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) p[r * ld + c] = bound * (2.0f * rng.next_uniform() - 1.0f);
}
}  // namespace

void init_parameters(Linear& linear, Rng& rng) {
  // nn.Linear: kaiming_uniform_(a=√5) → bound = √(6 / ((1 + a²) fan_in)) = 1/√fan_in; bias the same bound.
  const float bound = 1.0f / std::sqrt(static_cast<float>(linear.in_features()));
  fill_uniform(linear.weight, bound, rng);
  if (linear.bias.defined()) fill_uniform(linear.bias, bound, rng);
}

void init_parameters(LayerNorm& norm, Rng&) {
  norm.weight.fill(1.0f);
  if (norm.bias.defined()) norm.bias.fill(0.0f);
}

void init_parameters(MultiHeadAttention& mha, Rng& rng) {
  const int64_t E = mha.embed_dim();
  if (mha.packed()) {
    // xavier_uniform_ on [3E, E] (with GQA [E + 2Ekv, E]): fan_in = E, fan_out = the rows.
    fill_uniform(mha.in_proj_weight, std::sqrt(6.0f / static_cast<float>(E + mha.qkv_dim())), rng);
  } else {
    for (Linear* p : {&mha.q_proj, &mha.k_proj, &mha.v_proj})
      fill_uniform(p->weight, std::sqrt(6.0f / static_cast<float>(p->out_features() + p->in_features())), rng);
  }
  if (mha.in_proj_bias.defined()) mha.in_proj_bias.fill(0.0f);
  init_parameters(mha.out_proj, rng);
  if (mha.out_proj.bias.defined()) mha.out_proj.bias.fill(0.0f);
}

void init_parameters(EncoderLayer& layer, Rng& rng) {
  init_parameters(layer.self_attn, rng);
  init_parameters(layer.ffn.linear1, rng);
  init_parameters(layer.ffn.linear2, rng);
  init_parameters(layer.norm1, rng);
  init_parameters(layer.norm2, rng);
}

void init_parameters(Encoder& encoder, Rng& rng) {
  for (EncoderLayer& layer : encoder.layers) init_parameters(layer, rng);
  if (encoder.norm) init_parameters(*encoder.norm, rng);
}

void init_parameters(Embedding& embed, float std, Rng& rng) {
  float* p = embed.weight.data<float>();
  for (int64_t i = 0; i < embed.weight.numel(); ++i) p[i] = std * rng.next_normal();
}

void init_parameters(CausalLM& model, Rng& rng) {
  init_parameters(model.embed, kEmbeddingStd, rng);
  if (model.pos_embed.weight.defined()) init_parameters(model.pos_embed, kEmbeddingStd, rng);
  init_parameters(model.encoder, rng);
  if (model.head.weight.defined()) init_parameters(model.head, rng);
}

void init_parameters(Classifier& model, Rng& rng) {
  init_parameters(model.embed, kEmbeddingStd, rng);
  if (model.pos_embed.weight.defined()) init_parameters(model.pos_embed, kEmbeddingStd, rng);
  init_parameters(model.encoder, rng);
  init_parameters(model.classifier, rng);
}

}  // namespace cabm
