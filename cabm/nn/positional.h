// Position information, three kinds (the first two added to the token embeddings):
//  - learned (GPT-style): an Embedding pos_embed.weight [T_max, E]; position t adds row t.
//  - sinusoidal (Vaswani et al. 2017, §3.5), no parameters:
//      PE[t, 2i] = sin(t / 10000^(2i/E)),  PE[t, 2i+1] = cos(t / 10000^(2i/E))
//  - rotary (RoPE, Su et al. 2021): nothing added here; every attention layer rotates its Q and K
//    by position (EncoderLayerConfig::rope, cabm/kernels/rope.h).
#pragma once

#include "cabm/core/tensor.h"
#include "cabm/kernels/dropout.h"
#include "cabm/nn/embedding.h"

#include <string>

namespace cabm {

enum class PositionalKind { kLearned, kSinusoidal, kRotary };
const char* positional_name(PositionalKind kind);             // "learned" | "sinusoidal" | "rotary"
PositionalKind parse_positional(const std::string& name);     // cabm::Error for anything else

// y: [B, T, E] contiguous; y[b, t] += pos.weight[start + t]. start + T must not exceed T_max.
void positional_embedding_forward(const Embedding& pos, int64_t start, const Tensor& y);

// grad.weight[start + t] += Σ_b dy[b, t] (accumulates). dy: [B, T, E]. Deterministic.
void positional_embedding_backward(int64_t start, const Tensor& dy, Embedding& grad);

// Writes PE[start .. start+T) into out [T, E] (computed in double, rounded to float).
void sinusoidal_encoding(int64_t start, const Tensor& out);

// y: [B, T, E] contiguous; y[b, t] += PE[start + t]. Its backward is the identity.
void sinusoidal_encoding_forward(int64_t start, const Tensor& y);

// The input stack of the models: y = dropout(embed[tokens] + position(start + t)).
// tokens: I64 [B, T]; y: [B, T, E] contiguous; pos: the learned table (ignored for sinusoidal).
struct TokenInput {
  const Embedding* embed;
  const Embedding* pos;     // learned positions, or null
  bool sinusoidal = false;  // without pos: add the sinusoidal encoding (else nothing: rotary)
};
void token_input_forward(const TokenInput& input, const Tensor& tokens, int64_t start, const DropoutArgs& dropout,
                         const Tensor& y);

// dy: [B, T, E], CONSUMED (dropout backward in place). Accumulates into grad_embed and,
// for learned positions, grad_pos.
void token_input_backward(const Tensor& tokens, int64_t start, const DropoutArgs& dropout, const Tensor& dy,
                          Embedding& grad_embed, Embedding* grad_pos);

}  // namespace cabm
