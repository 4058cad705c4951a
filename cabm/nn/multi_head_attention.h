// Multi-head attention (Vaswani et al. 2017, §3.2.2), PyTorch's nn.MultiheadAttention with
// batch_first=True:
//   Q = query W_Qᵀ + b_Q,  K = key W_Kᵀ + b_K,  V = value W_Vᵀ + b_V      (each [B, *, E])
//   heads: [B, *, E] viewed as [B, *, H, d], d = E / H (a strided view, never a copy)
//   O_h = attention(Q_h, K_h, V_h),  output = concat_h(O_h) W_Oᵀ + b_O
// When kdim == vdim == E the three input projections are rows of one packed
// in_proj_weight [3E, E], as PyTorch stores them, and self-attention runs them as one GEMM.
//
// Grouped-query attention (GQA, Ainslie et al. 2023; MQA, Shazeer 2019) with num_kv_heads
// Hkv < H: K and V have Hkv heads of the same d (Ekv = Hkv·d columns), query head h reads
// key/value head h / (H / Hkv) inside the attention kernel (no repeated copies), and the
// packed in_proj_weight is [E + 2·Ekv, E] (rows: W_Q, W_K, W_V). The KV cache of decoding holds
// Hkv heads: H / Hkv times less memory. Hkv = H (the default) is PyTorch's module exactly.
//
// Rotary positions (config.rope, cabm/kernels/rope.h): Q and K are rotated once per token, in
// place in the projection buffers, before attention (queries at inputs.position + i, keys at
// inputs.position + j; decoding: at the cache length); the backward rotates dQ and dK back before
// the input projections. The KV cache holds rotated keys, as every RoPE implementation does.
//
// Mixed precision (cabm/nn/mixed_precision.h): when the module holds bf16 weight copies (bf16()),
// the four projections run on bf16 operands (cabm/nn/linear.h), Q, K and V are rounded to bf16 and
// attention runs in attention_flash_bf16_forward / _backward (fp32 softmax statistics and
// accumulation, P rounded only as the input of P·V); biases, the output and every gradient are
// fp32. With need_weights the N×M weights come from the fp32 reference kernel on the
// bf16-rounded Q, K, V (the bf16 kernel never forms them). The KV cache of decoding may be BF16
// (half the memory); attention over it then runs in attention_flash_bf16_forward.
#pragma once

#include "cabm/core/tensor.h"
#include "cabm/kernels/attention/attention.h"
#include "cabm/kernels/attention/mask.h"
#include "cabm/kernels/rope.h"
#include "cabm/nn/linear.h"

namespace cabm {

struct MultiHeadAttentionConfig {
  int64_t embed_dim = 0;  // E
  int64_t num_heads = 0;  // H; must divide E
  int64_t kdim = 0;       // key input width; 0 means E
  int64_t vdim = 0;       // value input width; 0 means E
  bool bias = true;
  int64_t num_kv_heads = 0;  // Hkv; must divide H; 0 means H
  RopeOptions rope{};        // rotary positions on Q and K; style kNone (the default) = off
};

struct MultiHeadAttention {
  MultiHeadAttentionConfig config;  // kdim and vdim resolved (never 0)
  Tensor in_proj_weight;            // [E + 2Ekv, E] when packed (kdim == vdim == E); else undefined
  Tensor in_proj_bias;              // [E + 2Ekv] when bias (packed or not); q/k/v biases are its slices
  Linear q_proj, k_proj, v_proj;    // views into the packed tensors, or separate [E or Ekv, kdim/vdim]
  Linear out_proj;
  // Mixed precision: bf16 [3E, E] copy of in_proj_weight (of rounded_dtype()) when packed (q/k/v_proj.weight_bf16
  // are its row slices); undefined otherwise.
  Tensor in_proj_weight_bf16;

  bool bf16() const { return out_proj.weight_bf16.defined(); }
  int64_t embed_dim() const { return config.embed_dim; }
  int64_t num_heads() const { return config.num_heads; }
  int64_t head_dim() const { return config.embed_dim / config.num_heads; }
  int64_t num_kv_heads() const { return config.num_kv_heads; }
  int64_t kv_dim() const { return config.num_kv_heads * head_dim(); }  // Ekv
  int64_t qkv_dim() const { return config.embed_dim + 2 * kv_dim(); }   // rows of in_proj_weight
  bool packed() const { return in_proj_weight.defined(); }
};

// Validates the configuration (E divisible by H, H by Hkv, positive sizes) with a clear error.
MultiHeadAttention make_multi_head_attention(MultiHeadAttentionConfig config);

struct AttentionInputs {
  Tensor query;  // [B, N, E]
  Tensor key;    // [B, M, kdim]
  Tensor value;  // [B, M, vdim]
  Mask mask;
  bool need_weights = false;    // also compute attention weights (reference path)
  bool average_weights = true;  // weights averaged over heads [B, N, M], else [B, H, N, M]
  // Training: dropout on the attention weights (see AttentionOptions; 0 = none).
  float dropout = 0.0f;
  uint64_t dropout_seed = 0;
  uint64_t dropout_offset = 0;
  // Rotary positions only: the position of the first query and of the first key.
  int64_t position = 0;
};

// Activations of one call, kept for the backward pass and reused across calls of one shape.
struct MultiHeadAttentionCache {
  Tensor qkv;      // [B, N, E + 2Ekv] packed self-attention projections, or undefined
  Tensor q, k, v;  // [B, N, H, d], [B, M, Hkv, d], [B, M, Hkv, d] (views into qkv or own buffers)
  Tensor attn;     // [B, N, E]: heads merged, input of out_proj
  Tensor lse;      // [B, H, N]: log-sum-exp of each score row (for the backward pass)
  Tensor weights;  // [B, H, N, M] when need_weights
  Tensor output;   // [B, N, E]
  Tensor averaged_weights;  // [B, N, M] when need_weights and average_weights
  AttentionOptions options; // mask, scale and dropout of the last forward
  bool self_attention = false;  // the last forward ran the packed self-attention GEMM
  // Mixed precision: Q, K, V rounded to bf16 (head views of qkv_bf16, or own buffers), saved for
  // the bf16 backward; bf16_kernel says the last forward ran attention_flash_bf16_forward.
  Tensor qkv_bf16;                // BF16 [B, N, E + 2Ekv] (self-attention)
  Tensor q_bf16, k_bf16, v_bf16;  // BF16 [B, N, H, d], [B, M, Hkv, d], [B, M, Hkv, d]
  // The packed projection's and out_proj's inputs rounded to bf16 by the forward, for the
  // backward (linear_forward's x_bf16: BF16, or F32 holding bf16 values where the products widen
  // their operands); undefined with fp32 layers.
  Tensor query_bf16, attn_bf16;  // [B·N, E] (query_bf16: self-attention)
  bool bf16_kernel = false;
  // Backward scratch.
  Tensor d_attn;              // [B, N, E]
  Tensor d_qkv;               // [B, N, E + 2Ekv] (self-attention) — or d_q, d_k, d_v:
  Tensor d_q, d_k, d_v;       // [B, N, H, d], [B, M, Hkv, d], [B, M, Hkv, d] views
};

// Returns cache.output; the requested weights are in cache.averaged_weights or cache.weights.
const Tensor& multi_head_attention_forward(const MultiHeadAttention& mha, const AttentionInputs& inputs,
                                           MultiHeadAttentionCache& cache);

// The same up to out_proj: returns cache.attn [B, N, E], the heads merged (cache.output is not
// written). For callers that fuse out_proj's bias into what follows it (cabm/nn/encoder_inference.h).
const Tensor& multi_head_attention_heads(const MultiHeadAttention& mha, const AttentionInputs& inputs,
                                         MultiHeadAttentionCache& cache);

// Gradients with respect to the three inputs. Undefined tensors are skipped. Outputs that
// share storage and strides with an earlier one (self-attention passes the same tensor three
// times) receive the SUM of the gradients; otherwise each is overwritten.
struct AttentionInputGrads {
  Tensor query;  // [B, N, E]
  Tensor key;    // [B, M, kdim]
  Tensor value;  // [B, M, vdim]
};

// inputs: exactly as given to the forward (same tensors, unchanged); dout: [B, N, E].
//   d(attn) = dout W_O,  dW_O += doutᵀ attn,  db_O += Σ dout
//   dQ, dK, dV from attention_backward (cabm/kernels/attention/attention.h; softmax backward through S = QKᵀ·scale)
//   dquery = dQ W_Q,  dW_Q += dQᵀ query,  db_Q += Σ dQ  (likewise K, V)
// Parameter gradients accumulate into grads (a module of the same configuration).
void multi_head_attention_backward(const MultiHeadAttention& mha, const AttentionInputs& inputs, const Tensor& dout,
                                   MultiHeadAttentionCache& cache, MultiHeadAttention& grads,
                                   const AttentionInputGrads& dinputs);

// Keys and values of the positions seen so far, for incremental decoding (one per layer).
struct KVCache {
  Tensor k, v;         // F32 or BF16 [B, capacity, Ekv]; heads are [B, capacity, Hkv, d] views
  int64_t length = 0;  // positions filled
  int64_t capacity() const { return k.defined() ? k.size(1) : 0; }
};
// Allocates once per shape and dtype (F32, or BF16: half the memory, attention in bf16).
// kv_dim: the module's kv_dim() (E without GQA).
void kv_cache_reset(KVCache& kv, int64_t B, int64_t capacity, int64_t kv_dim, DType dtype = DType::F32);

// Incremental self-attention: x [B, n, E] holds the inputs of the n new positions
// length .. length+n−1. Appends their K, V to the cache, attends from the n queries to all
// length+n cached keys with a bottom-right causal mask (query i sees keys ≤ length + i), so a
// token costs O(length); advances kv.length by n. Returns cache.output [B, n, E]. Eval only.
// A BF16 cache stores K, V rounded to bf16 and attends with attention_flash_bf16_forward (Q
// rounded too); an F32 cache uses attention_forward.
const Tensor& multi_head_attention_decode(const MultiHeadAttention& mha, const Tensor& x, KVCache& kv,
                                          MultiHeadAttentionCache& cache);

}  // namespace cabm
