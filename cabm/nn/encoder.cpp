#include "cabm/nn/encoder.h"

#include <algorithm>

namespace cabm {

Encoder make_encoder(const EncoderLayerConfig& layer_config, int64_t num_layers, bool final_norm) {
  if (num_layers <= 0) throw Error(fmt::format("TransformerEncoder: num_layers must be positive, got {}", num_layers));
  Encoder encoder;
  for (int64_t l = 0; l < num_layers; ++l) encoder.layers.push_back(make_encoder_layer(layer_config));
  if (final_norm) encoder.norm = make_layer_norm(layer_config.d_model, layer_config.layer_norm_eps);
  return encoder;
}

const Tensor& encoder_forward(const Encoder& encoder, const Tensor& x, const Mask& mask, EncoderCache& cache,
                              const ForwardMode& mode) {
  CABM_CHECK(!encoder.layers.empty(), "encoder has no layers");
  cache.layers.resize(encoder.layers.size());
  const Tensor* h = &x;
  ForwardMode layer_mode = mode;
  for (size_t l = 0; l < encoder.layers.size(); ++l) {
    layer_mode.layer = l;
    h = &encoder_layer_forward(encoder.layers[l], *h, mask, cache.layers[l], layer_mode);
  }
  if (!encoder.norm) return *h;
  ensure_shape(cache.output, h->shape());
  layer_norm_forward(*encoder.norm, as_rows(*h), as_rows(cache.output), cache.norm);
  return cache.output;
}

namespace {
// Backward scratch (gradient buffers) moves from layer to layer, so an L-layer stack holds
// one set of it rather than L: the buffers are reused, never reallocated, once shapes settle.
void move_scratch(EncoderLayerCache& from, EncoderLayerCache& to) {
  if (&from == &to) return;
  for (auto [src, dst] : {std::pair{&from.d_a, &to.d_a}, std::pair{&from.d_b, &to.d_b},
                          std::pair{&from.attn.d_attn, &to.attn.d_attn}, std::pair{&from.attn.d_qkv, &to.attn.d_qkv},
                          std::pair{&from.attn.d_q, &to.attn.d_q}, std::pair{&from.attn.d_k, &to.attn.d_k},
                          std::pair{&from.attn.d_v, &to.attn.d_v}, std::pair{&from.ffn.d_hidden, &to.ffn.d_hidden}}) {
    if (src->defined()) *dst = std::move(*src);
    *src = Tensor();
  }
}
}  // namespace

void encoder_backward(const Encoder& encoder, const Tensor& x, const Tensor& dy, const Tensor& dx,
                      EncoderCache& cache, Encoder& grads) {
  const size_t L = encoder.layers.size();
  CABM_CHECK(L > 0 && cache.layers.size() == L && grads.layers.size() == L &&
                 grads.norm.has_value() == encoder.norm.has_value(),
             "TransformerEncoder backward: gradients or cache do not match the encoder");
  CABM_CHECK(dy.shape() == x.shape() && dx.shape() == x.shape(), "TransformerEncoder: dy {} and dx {} must be {}",
             shape_str(dy.shape()), shape_str(dx.shape()), shape_str(x.shape()));
  ensure_shape(cache.d_a, x.shape());
  ensure_shape(cache.d_b, x.shape());
  // The gradient flows top-down through two ping-pong buffers; the first layer writes dx.
  Tensor g = dy;
  if (encoder.norm) {
    const Tensor& top = cache.layers[L - 1].output;
    layer_norm_backward(*encoder.norm, as_rows(top), as_rows(dy), as_rows(cache.d_a), cache.norm, *grads.norm);
    g = cache.d_a;
  }
  move_scratch(cache.layers[0], cache.layers[L - 1]);  // where the previous backward left it
  for (size_t l = L; l-- > 0;) {
    const Tensor& input = l == 0 ? x : cache.layers[l - 1].output;
    const Tensor& out = l == 0 ? dx : (g.raw_data() == cache.d_a.raw_data() ? cache.d_b : cache.d_a);
    encoder_layer_backward(encoder.layers[l], input, g, out, cache.layers[l], grads.layers[l]);
    if (l > 0) move_scratch(cache.layers[l], cache.layers[l - 1]);
    g = out;
  }
}

const Tensor& encoder_decode(const Encoder& encoder, const Tensor& x, std::vector<KVCache>& kv, EncoderCache& cache) {
  CABM_CHECK(kv.size() == encoder.layers.size(), "decoding needs one KV cache per layer ({} for {} layers)", kv.size(),
             encoder.layers.size());
  cache.layers.resize(encoder.layers.size());
  const Tensor* h = &x;
  for (size_t l = 0; l < encoder.layers.size(); ++l)
    h = &encoder_layer_decode(encoder.layers[l], *h, kv[l], cache.layers[l]);
  if (!encoder.norm) return *h;
  ensure_shape(cache.output, h->shape());
  layer_norm_forward(*encoder.norm, as_rows(*h), as_rows(cache.output), cache.norm);
  return cache.output;
}

}  // namespace cabm
