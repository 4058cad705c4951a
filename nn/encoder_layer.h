// Transformer encoder layer (Vaswani et al. 2017, §3.1), PyTorch's nn.TransformerEncoderLayer
// with batch_first=True. Post-norm (the seed, PyTorch's default):
//   x = norm1(x + dropout(self_attn(x)));   x = norm2(x + dropout(ffn(x)))
// Pre-norm (norm_first, Xiong et al. 2020):
//   x = x + dropout(self_attn(norm1(x)));   x = x + dropout(ffn(norm2(x)))
#pragma once

#include "kernels/activations.h"
#include "kernels/mask.h"
#include "nn/feed_forward.h"
#include "nn/layer_norm.h"
#include "nn/multi_head_attention.h"

namespace cabm {

struct EncoderLayerConfig {
  int64_t d_model = 0;          // E
  int64_t nhead = 0;            // H
  int64_t dim_feedforward = 0;  // F
  float dropout = 0.1f;
  Activation activation = Activation::kRelu;
  float layer_norm_eps = 1e-5f;
  bool norm_first = false;
  bool bias = true;
};

struct EncoderLayer {
  EncoderLayerConfig config;
  MultiHeadAttention self_attn;
  FeedForward ffn;  // PyTorch's linear1 / linear2
  LayerNorm norm1, norm2;
};

EncoderLayer make_encoder_layer(const EncoderLayerConfig& config);

struct EncoderLayerCache {
  MultiHeadAttentionCache attn;
  FeedForwardCache ffn;
  LayerNormCache norm1, norm2;
  Tensor norm1_out;  // [B, N, E]: norm1's output (post-norm: the sublayer-1 result; pre-norm: attention input)
  Tensor mid;        // [B, N, E]: the residual stream between the two sublayers
  Tensor norm2_out;  // [B, N, E]: pre-norm only: the ffn input
  Tensor ffn_out;    // [B, N, E]
  Tensor output;     // [B, N, E]
};

// x: [B, N, E] contiguous. Returns cache.output.
const Tensor& encoder_layer_forward(const EncoderLayer& layer, const Tensor& x, const Mask& mask,
                                    EncoderLayerCache& cache);

}  // namespace cabm
