// A stack of L encoder layers with an optional final LayerNorm: PyTorch's nn.TransformerEncoder.
#pragma once

#include "cabm/nn/encoder_layer.h"

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
  Tensor d_a, d_b;  // [B, N, E] backward scratch (the layers' own scratch is passed down the
                    // stack during backward: one set for the whole encoder, not one per layer)
};

// x: [B, N, E] contiguous. Returns the output of the last layer (or of the final norm).
// In training mode layer l draws its dropout masks with mode.layer = l.
const Tensor& encoder_forward(const Encoder& encoder, const Tensor& x, const Mask& mask, EncoderCache& cache,
                              const ForwardMode& mode = {});

// x: [B, N, E] the forward input (unchanged since); dy: [B, N, E] gradient of the returned
// output; dx: [B, N, E] written (may alias dy). Parameter gradients accumulate into grads.
void encoder_backward(const Encoder& encoder, const Tensor& x, const Tensor& dy, const Tensor& dx,
                      EncoderCache& cache, Encoder& grads);

// Incremental decoding (eval): one KVCache per layer (kv.size() == layers). x: [B, n, E].
const Tensor& encoder_decode(const Encoder& encoder, const Tensor& x, std::vector<KVCache>& kv, EncoderCache& cache);

}  // namespace cabm
