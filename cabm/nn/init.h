// Parameter initialisation, PyTorch's default distributions, drawn from cabm/core/rng.h's Rng in
// state_dict order (so one seed gives one model):
//  - Linear (nn.Linear.reset_parameters): weight and bias U(−1/√in, 1/√in)
//    (kaiming_uniform with a = √5 gives exactly this bound for the weight).
//  - MultiheadAttention: in_proj_weight (or q/k/v_proj_weight) xavier_uniform,
//    U(±√(6 / (fan_in + fan_out))) with the fans of the whole tensor ([3E, E] when packed);
//    in_proj_bias and out_proj.bias 0; out_proj.weight as Linear.
//  - LayerNorm: weight 1, bias 0.
//  - Embedding: N(0, std). PyTorch's default std is 1; the models use GPT-2's 0.02 for
//    embed/pos_embed (kEmbeddingStd): with a tied head, N(0, 1) embeddings make initial logits
//    of standard deviation √E and a loss far above log V.
// The untied LM head and the classifier layer are Linear (default init).
#pragma once

#include "cabm/core/rng.h"
#include "cabm/nn/causal_lm.h"
#include "cabm/nn/classifier.h"

namespace cabm {

inline constexpr float kEmbeddingStd = 0.02f;

void init_parameters(Linear& linear, Rng& rng);
void init_parameters(LayerNorm& norm, Rng& rng);
void init_parameters(MultiHeadAttention& mha, Rng& rng);
void init_parameters(EncoderLayer& layer, Rng& rng);
void init_parameters(Encoder& encoder, Rng& rng);
void init_parameters(Embedding& embed, float std, Rng& rng);
void init_parameters(CausalLM& model, Rng& rng);
void init_parameters(Classifier& model, Rng& rng);

}  // namespace cabm
