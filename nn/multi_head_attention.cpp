#include "nn/multi_head_attention.h"

#include "kernels/attention_reference.h"

namespace cabm {

MultiHeadAttention make_multi_head_attention(MultiHeadAttentionConfig config) {
  const int64_t E = config.embed_dim, H = config.num_heads;
  if (config.kdim == 0) config.kdim = E;
  if (config.vdim == 0) config.vdim = E;
  if (E <= 0 || H <= 0 || config.kdim <= 0 || config.vdim <= 0)
    throw Error(fmt::format("MultiheadAttention: sizes must be positive (embed_dim={}, num_heads={}, kdim={}, vdim={})",
                            E, H, config.kdim, config.vdim));
  if (E % H != 0)
    throw Error(fmt::format("MultiheadAttention: embed_dim {} is not divisible by num_heads {}", E, H));
  MultiHeadAttention mha;
  mha.config = config;
  // PyTorch keeps one in_proj_bias [3E] even when the weights are separate.
  if (config.bias) mha.in_proj_bias = Tensor::zeros({3 * E});
  const bool packed = config.kdim == E && config.vdim == E;
  if (packed) mha.in_proj_weight = Tensor::zeros({3 * E, E});
  Linear* projections[3] = {&mha.q_proj, &mha.k_proj, &mha.v_proj};
  const int64_t widths[3] = {E, config.kdim, config.vdim};
  for (int64_t p = 0; p < 3; ++p) {
    projections[p]->weight = packed ? mha.in_proj_weight.narrow(0, p * E, E) : Tensor::zeros({E, widths[p]});
    if (config.bias) projections[p]->bias = mha.in_proj_bias.narrow(0, p * E, E);
  }
  mha.out_proj = make_linear(E, E, config.bias);
  return mha;
}

namespace {

void check_inputs(const MultiHeadAttention& mha, const AttentionInputs& in) {
  const int64_t E = mha.embed_dim();
  auto check = [](const Tensor& t, const char* name, int64_t width) {
    if (!t.defined() || t.dim() != 3 || t.dtype() != DType::F32 || t.size(2) != width || t.size(1) == 0 ||
        t.size(0) == 0)
      throw Error(fmt::format("MultiheadAttention: {} must be F32 [B, L, {}] with B, L > 0, got {}", name, width,
                              t.defined() ? shape_str(t.shape()) : "undefined"));
  };
  check(in.query, "query", E);
  check(in.key, "key", mha.config.kdim);
  check(in.value, "value", mha.config.vdim);
  if (in.key.size(0) != in.query.size(0) || in.value.size(0) != in.query.size(0))
    throw Error("MultiheadAttention: query, key and value differ in batch size");
  if (in.key.size(1) != in.value.size(1))
    throw Error(fmt::format("MultiheadAttention: key length {} differs from value length {}", in.key.size(1),
                            in.value.size(1)));
}

bool is_self_attention(const AttentionInputs& in) {
  return in.query.raw_data() == in.key.raw_data() && in.key.raw_data() == in.value.raw_data() &&
         in.query.shape() == in.key.shape() && in.query.strides() == in.key.strides() &&
         in.key.strides() == in.value.strides();
}

// [B, L, E] buffer (row stride `row`) seen as heads [B, L, H, d].
Tensor split_heads(const Tensor& buffer, int64_t offset, int64_t B, int64_t L, int64_t H, int64_t d, int64_t row) {
  return buffer.as_strided({B, L, H, d}, {L * row, row, d, 1}, offset);
}

}  // namespace

const Tensor& multi_head_attention_forward(const MultiHeadAttention& mha, const AttentionInputs& in,
                                           MultiHeadAttentionCache& cache) {
  check_inputs(mha, in);
  const int64_t B = in.query.size(0), N = in.query.size(1), M = in.key.size(1);
  const int64_t E = mha.embed_dim(), H = mha.num_heads(), d = mha.head_dim();

  if (mha.packed() && is_self_attention(in)) {
    // One GEMM for Q, K and V: [B·N, E] × [E, 3E].
    ensure_shape(cache.qkv, {B, N, 3 * E});
    const Linear fused{mha.in_proj_weight, mha.in_proj_bias};
    linear_forward(fused, as_rows(in.query.contiguous()), as_rows(cache.qkv));
    cache.q = split_heads(cache.qkv, 0, B, N, H, d, 3 * E);
    cache.k = split_heads(cache.qkv, E, B, N, H, d, 3 * E);
    cache.v = split_heads(cache.qkv, 2 * E, B, N, H, d, 3 * E);
  } else {
    const Linear* projections[3] = {&mha.q_proj, &mha.k_proj, &mha.v_proj};
    const Tensor* inputs[3] = {&in.query, &in.key, &in.value};
    Tensor* heads[3] = {&cache.q, &cache.k, &cache.v};
    for (int p = 0; p < 3; ++p) {
      const int64_t L = inputs[p]->size(1);
      // Own contiguous [B, L, E] buffers; reallocated only when the shape changes.
      if (!heads[p]->defined() || heads[p]->shape() != Shape{B, L, H, d} || !heads[p]->is_contiguous())
        *heads[p] = Tensor::empty({B, L, H, d});
      linear_forward(*projections[p], as_rows(inputs[p]->contiguous()), heads[p]->view({B * L, E}));
    }
  }

  ensure_shape(cache.attn, {B, N, E});
  AttentionOptions options;
  options.mask = in.mask;
  const Tensor attn_heads = cache.attn.view({B, N, H, d});
  if (in.need_weights) {
    ensure_shape(cache.weights, {B, H, N, M});
    attention_reference_forward(cache.q, cache.k, cache.v, options, attn_heads, &cache.weights);
    if (in.average_weights) {
      // PyTorch's attn_output_weights.mean(dim=1).
      ensure_shape(cache.averaged_weights, {B, N, M});
      const float* w = cache.weights.data<float>();
      float* avg = cache.averaged_weights.data<float>();
      for (int64_t b = 0; b < B; ++b)
        for (int64_t e = 0; e < N * M; ++e) {
          float sum = 0.0f;
          for (int64_t h = 0; h < H; ++h) sum += w[(b * H + h) * N * M + e];
          avg[b * N * M + e] = sum / static_cast<float>(H);
        }
    }
  } else {
    attention_reference_forward(cache.q, cache.k, cache.v, options, attn_heads);
  }

  ensure_shape(cache.output, {B, N, E});
  linear_forward(mha.out_proj, as_rows(cache.attn), as_rows(cache.output));
  return cache.output;
}

}  // namespace cabm
