// A stack of L encoder layers with an optional final LayerNorm: PyTorch's nn.TransformerEncoder.
#pragma once

#include "nn/encoder_layer.h"

#include <optional>
#include <vector>

namespace cabm {

struct Encoder {
  std::vector<EncoderLayer> layers;
  std::optional<LayerNorm> norm;  // PyTorch's `norm` argument (pre-norm stacks usually have one)
};

// num_layers copies of the layer configuration; final_norm adds the final LayerNorm.
Encoder make_encoder(const EncoderLayerConfig& layer_config, int64_t num_layers, bool final_norm);

struct EncoderCache {
  std::vector<EncoderLayerCache> layers;
  LayerNormCache norm;
  Tensor output;  // [B, N, E], the final norm's output (when there is one)
};

// x: [B, N, E] contiguous. Returns the output of the last layer (or of the final norm).
const Tensor& encoder_forward(const Encoder& encoder, const Tensor& x, const Mask& mask, EncoderCache& cache);

}  // namespace cabm
