#include "nn/encoder_layer.h"

namespace cabm {

EncoderLayer make_encoder_layer(const EncoderLayerConfig& config) {
  if (config.d_model <= 0 || config.nhead <= 0 || config.dim_feedforward <= 0)
    throw Error(fmt::format("TransformerEncoderLayer: sizes must be positive (d_model={}, nhead={}, dim_feedforward={})",
                            config.d_model, config.nhead, config.dim_feedforward));
  if (!(config.dropout >= 0.0f && config.dropout < 1.0f))
    throw Error(fmt::format("TransformerEncoderLayer: dropout {} outside [0, 1)", config.dropout));
  EncoderLayer layer;
  layer.config = config;
  layer.self_attn = make_multi_head_attention({config.d_model, config.nhead, 0, 0, config.bias});
  layer.ffn = make_feed_forward(config.d_model, config.dim_feedforward, config.activation, config.bias);
  layer.norm1 = make_layer_norm(config.d_model, config.layer_norm_eps);
  layer.norm2 = make_layer_norm(config.d_model, config.layer_norm_eps);
  return layer;
}

namespace {
// out = a + b, element-wise over n floats.
void add(const float* a, const float* b, float* out, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}
}  // namespace

const Tensor& encoder_layer_forward(const EncoderLayer& layer, const Tensor& x, const Mask& mask,
                                    EncoderLayerCache& cache) {
  const int64_t E = layer.config.d_model;
  if (x.dim() != 3 || x.size(2) != E || !x.is_contiguous())
    throw Error(fmt::format("TransformerEncoderLayer: input must be contiguous [B, N, {}], got {}", E,
                            shape_str(x.shape())));
  const Shape shape = x.shape();
  const int64_t n = x.numel();
  for (Tensor* t : {&cache.norm1_out, &cache.mid, &cache.ffn_out, &cache.output}) ensure_shape(*t, shape);

  auto self_attention = [&](const Tensor& input) -> const Tensor& {
    AttentionInputs in{input, input, input, mask};
    return multi_head_attention_forward(layer.self_attn, in, cache.attn);
  };

  if (layer.config.norm_first) {
    layer_norm_forward(layer.norm1, as_rows(x), as_rows(cache.norm1_out), cache.norm1);
    const Tensor& attn = self_attention(cache.norm1_out);
    add(x.data<float>(), attn.data<float>(), cache.mid.data<float>(), n);
    ensure_shape(cache.norm2_out, shape);
    layer_norm_forward(layer.norm2, as_rows(cache.mid), as_rows(cache.norm2_out), cache.norm2);
    feed_forward_forward(layer.ffn, as_rows(cache.norm2_out), as_rows(cache.ffn_out), cache.ffn);
    add(cache.mid.data<float>(), cache.ffn_out.data<float>(), cache.output.data<float>(), n);
  } else {
    const Tensor& attn = self_attention(x);
    add(x.data<float>(), attn.data<float>(), cache.mid.data<float>(), n);
    layer_norm_forward(layer.norm1, as_rows(cache.mid), as_rows(cache.norm1_out), cache.norm1);
    feed_forward_forward(layer.ffn, as_rows(cache.norm1_out), as_rows(cache.ffn_out), cache.ffn);
    add(cache.norm1_out.data<float>(), cache.ffn_out.data<float>(), cache.output.data<float>(), n);
    layer_norm_forward(layer.norm2, as_rows(cache.output), as_rows(cache.output), cache.norm2);
  }
  return cache.output;
}

}  // namespace cabm
