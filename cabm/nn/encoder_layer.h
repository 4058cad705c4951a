// Transformer encoder layer (Vaswani et al. 2017, §3.1), PyTorch's nn.TransformerEncoderLayer
// with batch_first=True. Post-norm (the seed, PyTorch's default):
//   x = norm1(x + dropout1(self_attn(x)));   x = norm2(x + dropout2(ffn(x)))
// Pre-norm (norm_first, Xiong et al. 2020):
//   x = x + dropout1(self_attn(norm1(x)));   x = x + dropout2(ffn(norm2(x)))
// ffn(x) = linear2(dropout(act(linear1(x)))); the attention weights get the same dropout p.
#pragma once

#include "cabm/kernels/activations.h"
#include "cabm/kernels/attention/mask.h"
#include "cabm/nn/feed_forward.h"
#include "cabm/nn/forward_mode.h"
#include "cabm/nn/layer_norm.h"
#include "cabm/nn/multi_head_attention.h"

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
  int64_t num_kv_heads = 0;     // Hkv (grouped-query attention, multi_head_attention.h); 0 = H
  RopeOptions rope{};           // rotary positions in self-attention (style kNone: none)
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
  Tensor mid;        // [B, N, E]: the residual stream between the two sublayers (post-norm: norm1's input)
  Tensor norm2_out;  // [B, N, E]: pre-norm only: the ffn input
  Tensor ffn_out;    // [B, N, E]: the ffn branch after dropout2
  Tensor sum2;       // [B, N, E]: post-norm only: norm2's input
  Tensor output;     // [B, N, E]
  Mask mask;         // of the last forward
  DropoutArgs dropout1, dropout2;  // residual dropouts of the last forward
  // Backward scratch.
  Tensor d_a, d_b;   // [B, N, E]
};

// x: [B, N, E] contiguous. Returns cache.output. mode: eval (default) or training (dropout).
const Tensor& encoder_layer_forward(const EncoderLayer& layer, const Tensor& x, const Mask& mask,
                                    EncoderLayerCache& cache, const ForwardMode& mode = {});

// x: [B, N, E] the forward input (unchanged since); dy: [B, N, E]; dx: [B, N, E] written
// (may alias dy). Parameter gradients accumulate into grads. Derivation (post-norm):
//   y = LN2(s2), s2 = h + D2(ffn(h)), h = LN1(s1), s1 = x + D1(attn(x))
//   ds2 = LN2ᵀ dy;  dh = ds2 + ffnᵀ D2 ds2;  ds1 = LN1ᵀ dh;  dx = ds1 + attnᵀ D1 ds1
// pre-norm:
//   y = m + D2(ffn(LN2(m))), m = x + D1(attn(LN1(x)))
//   dm = dy + LN2ᵀ ffnᵀ D2 dy;  dx = dm + LN1ᵀ attnᵀ D1 dm
void encoder_layer_backward(const EncoderLayer& layer, const Tensor& x, const Tensor& dy, const Tensor& dx,
                            EncoderLayerCache& cache, EncoderLayer& grads);

// Incremental decoding (eval): x [B, n, E] the new positions; kv the layer's cache. Returns
// cache.output [B, n, E]. Causal by construction (bottom-right).
const Tensor& encoder_layer_decode(const EncoderLayer& layer, const Tensor& x, KVCache& kv, EncoderLayerCache& cache);

}  // namespace cabm
