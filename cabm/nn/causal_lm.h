// A decoder-only causal language model (GPT-style, Radford et al. 2018/2019):
//   h0 = dropout(embed[tokens] + pos_embed[positions])          [B, T, E]
//   h  = encoder.norm(encoder(h0, Mask::causal()))              (L layers + final LayerNorm)
//   logits = h Wᵀ,  W = embed.weight (tied, default) or head.weight (untied, no bias)  [B, T, V]
//
// Parameter names are those of the PyTorch twin built from nn.Embedding and
// nn.TransformerEncoder(batch_first=True) (see tests/fixtures/make_grads.py):
//   embed.weight [V, E], pos_embed.weight [T_max, E] (learned positions only),
//   encoder.layers.{i}.self_attn.in_proj_weight, ..., encoder.norm.weight/bias,
//   head.weight [V, E] only when untied.
//
// Training: forward (training mode) → causal_lm_loss (writes cache.dlogits) → backward
// (accumulates into `grads`, a CausalLM made with the same config, zeroed by the caller once
// per optimiser step). Generation: decode_reset, then causal_lm_decode on the prompt and on
// each new token; the KV cache makes a token cost O(context).
#pragma once

#include "cabm/nn/embedding.h"
#include "cabm/nn/encoder.h"
#include "cabm/nn/forward_mode.h"
#include "cabm/nn/loss.h"
#include "cabm/nn/positional.h"

#include <vector>

namespace cabm {

// The layers' hyper-parameters (E, H, F, dropout, activation, norm_first, layer_norm_eps) are
// the EncoderLayerConfig this config extends: each of the L layers is made from it. The
// defaults differ from the seed's layer: pre-norm and GELU, as GPT-2 (post-norm also works).
// dropout also applies to the embeddings. The layers always have biases (bias must stay true:
// checkpoints do not record it).
struct CausalLMConfig : EncoderLayerConfig {
  CausalLMConfig() {
    activation = Activation::kGelu;
    norm_first = true;
  }

  int64_t vocab_size = 0;   // V
  int64_t max_seq_len = 0;  // T_max: rows of pos_embed; the longest context
  int64_t num_layers = 0;   // L
  bool tie_head = true;     // logits use embed.weight; false adds head.weight
  PositionalKind positional = PositionalKind::kLearned;
};

struct CausalLM {
  CausalLMConfig config;
  Embedding embed;      // [V, E]
  Embedding pos_embed;  // [T_max, E]; undefined weight when positional is sinusoidal
  Encoder encoder;      // always has the final norm (encoder.norm)
  Linear head;          // [V, E], no bias; undefined weight when tied. Mixed precision
                        // (cabm/nn/mixed_precision.h): head.weight_bf16 is the bf16 copy of the
                        // output matrix, embed.weight's when tied; a bf16 model decodes with a
                        // BF16 KV cache.
};

// Validates the config (clear cabm::Error) and allocates zero parameters; see cabm/nn/init.h
// for initialisation. Make a second one with the same config to hold gradients.
CausalLM make_causal_lm(const CausalLMConfig& config);

struct CausalLMCache {
  Tensor tokens;             // I64 [B, T]: the last forward's input (copied)
  Tensor embedded;           // [B, T, E]: encoder input (after embedding dropout)
  DropoutArgs embed_dropout;
  EncoderCache encoder;
  Tensor logits;             // [B, T, V]
  Tensor lse;                // [B·T]: saved by the loss
  Tensor dlogits;            // [B, T, V]: where backward starts (written by causal_lm_loss)
  Tensor d_hidden;           // [B, T, E] backward scratch
};

// tokens: I64 [B, T], T <= max_seq_len. Returns cache.logits [B, T, V].
const Tensor& causal_lm_forward(const CausalLM& model, const Tensor& tokens, CausalLMCache& cache,
                                const ForwardMode& mode = {});

// Mean cross-entropy of cache.logits against targets (I64 [B, T]; usually the inputs shifted
// by one; ignore_index marks padding). Writes cache.dlogits when options.compute_grad.
CrossEntropyResult causal_lm_loss(const Tensor& targets, const LossOptions& options, CausalLMCache& cache);

// Backpropagates cache.dlogits [B, T, V] (from causal_lm_loss, or written by the caller)
// through the model of the last forward; ACCUMULATES parameter gradients into grads.
void causal_lm_backward(const CausalLM& model, CausalLMCache& cache, CausalLM& grads);

// Incremental decoding with a KV cache (eval mode).
struct DecodeState {
  std::vector<KVCache> kv;  // one per layer
  EncoderCache encoder;
  Tensor embedded;          // [B, n, E]
  Tensor logits;            // [B, n, V]
  int64_t length() const { return kv.empty() ? 0 : kv.front().length; }
};

// Empties the state for batch size B and up to `capacity` positions (<= max_seq_len).
void decode_reset(const CausalLM& model, int64_t B, int64_t capacity, DecodeState& state);

// tokens: I64 [B, n], the next n tokens (the prompt, then one at a time) at positions
// length() .. length()+n−1. Returns state.logits [B, n, V], equal (up to float rounding) to
// the last n positions of causal_lm_forward over the whole prefix.
const Tensor& causal_lm_decode(const CausalLM& model, const Tensor& tokens, DecodeState& state);

}  // namespace cabm
