#include "nn/encoder.h"

namespace cabm {

Encoder make_encoder(const EncoderLayerConfig& layer_config, int64_t num_layers, bool final_norm) {
  if (num_layers <= 0) throw Error(fmt::format("TransformerEncoder: num_layers must be positive, got {}", num_layers));
  Encoder encoder;
  for (int64_t l = 0; l < num_layers; ++l) encoder.layers.push_back(make_encoder_layer(layer_config));
  if (final_norm) encoder.norm = make_layer_norm(layer_config.d_model, layer_config.layer_norm_eps);
  return encoder;
}

const Tensor& encoder_forward(const Encoder& encoder, const Tensor& x, const Mask& mask, EncoderCache& cache) {
  CABM_CHECK(!encoder.layers.empty(), "encoder has no layers");
  cache.layers.resize(encoder.layers.size());
  const Tensor* h = &x;
  for (size_t l = 0; l < encoder.layers.size(); ++l) h = &encoder_layer_forward(encoder.layers[l], *h, mask, cache.layers[l]);
  if (!encoder.norm) return *h;
  ensure_shape(cache.output, h->shape());
  layer_norm_forward(*encoder.norm, as_rows(*h), as_rows(cache.output), cache.norm);
  return cache.output;
}

}  // namespace cabm
