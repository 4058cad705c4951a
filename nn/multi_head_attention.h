// Multi-head attention (Vaswani et al. 2017, §3.2.2), PyTorch's nn.MultiheadAttention with
// batch_first=True:
//   Q = query W_Qᵀ + b_Q,  K = key W_Kᵀ + b_K,  V = value W_Vᵀ + b_V      (each [B, *, E])
//   heads: [B, *, E] viewed as [B, *, H, d], d = E / H (a strided view, never a copy)
//   O_h = attention(Q_h, K_h, V_h),  output = concat_h(O_h) W_Oᵀ + b_O
// When kdim == vdim == E the three input projections are rows of one packed
// in_proj_weight [3E, E], as PyTorch stores them, and self-attention runs them as one GEMM.
#pragma once

#include "core/tensor.h"
#include "kernels/mask.h"
#include "nn/linear.h"

namespace cabm {

struct MultiHeadAttentionConfig {
  int64_t embed_dim = 0;  // E
  int64_t num_heads = 0;  // H; must divide E
  int64_t kdim = 0;       // key input width; 0 means E
  int64_t vdim = 0;       // value input width; 0 means E
  bool bias = true;
};

struct MultiHeadAttention {
  MultiHeadAttentionConfig config;  // kdim and vdim resolved (never 0)
  Tensor in_proj_weight;            // [3E, E] when packed (kdim == vdim == E); else undefined
  Tensor in_proj_bias;              // [3E] when bias (packed or not); q/k/v biases are its slices
  Linear q_proj, k_proj, v_proj;    // views into the packed tensors, or separate [E, kdim/vdim]
  Linear out_proj;

  int64_t embed_dim() const { return config.embed_dim; }
  int64_t num_heads() const { return config.num_heads; }
  int64_t head_dim() const { return config.embed_dim / config.num_heads; }
  bool packed() const { return in_proj_weight.defined(); }
};

// Validates the configuration (E divisible by H, positive sizes) with a clear error.
MultiHeadAttention make_multi_head_attention(MultiHeadAttentionConfig config);

struct AttentionInputs {
  Tensor query;  // [B, N, E]
  Tensor key;    // [B, M, kdim]
  Tensor value;  // [B, M, vdim]
  Mask mask;
  bool need_weights = false;    // also compute attention weights (reference path)
  bool average_weights = true;  // weights averaged over heads [B, N, M], else [B, H, N, M]
};

// Activations of one call, kept for the backward pass and reused across calls of one shape.
struct MultiHeadAttentionCache {
  Tensor qkv;      // [B, N, 3E] packed self-attention projections, or undefined
  Tensor q, k, v;  // [B, N, H, d], [B, M, H, d], [B, M, H, d] (views into qkv or own buffers)
  Tensor attn;     // [B, N, E]: heads merged, input of out_proj
  Tensor weights;  // [B, H, N, M] when need_weights
  Tensor output;   // [B, N, E]
  Tensor averaged_weights;  // [B, N, M] when need_weights and average_weights
};

// Returns cache.output; the requested weights are in cache.averaged_weights or cache.weights.
const Tensor& multi_head_attention_forward(const MultiHeadAttention& mha, const AttentionInputs& inputs,
                                           MultiHeadAttentionCache& cache);

}  // namespace cabm
