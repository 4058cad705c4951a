// Named parameters with PyTorch's state_dict names, so weights move between cabm and PyTorch
// without conversion code. A module's parameter list is also how optimizers, gradient
// clipping and checkpoints see it: make a second module of the same configuration to hold
// gradients, and the two lists zip name by name:
//
//   CausalLM model = make_causal_lm(config), grads = make_causal_lm(config);
//   NamedTensors p = named_parameters(model), g = named_parameters(grads);  // p[i].name == g[i].name
//   zero_parameters(g);  // make_* sets LayerNorm weights to 1: zero a gradient module before use
//
// Backward passes ACCUMULATE into the gradient module (micro-batches add up); zero it once per
// optimiser step.
#pragma once

#include "cabm/core/tensor.h"
#include "cabm/nn/causal_lm.h"
#include "cabm/nn/classifier.h"
#include "cabm/nn/encoder.h"

#include <string>
#include <utility>
#include <vector>

namespace cabm {

struct NamedTensor {
  std::string name;
  Tensor tensor;  // a view sharing the module's storage
};
using NamedTensors = std::vector<NamedTensor>;

// Appends the module's parameters as `prefix + name`, in PyTorch's state_dict order.
// MultiheadAttention: in_proj_weight/in_proj_bias when packed, else q_proj_weight,
// k_proj_weight, v_proj_weight and in_proj_bias; then out_proj.weight/bias.
void append_parameters(const MultiHeadAttention& mha, const std::string& prefix, NamedTensors& out);
void append_parameters(const EncoderLayer& layer, const std::string& prefix, NamedTensors& out);
void append_parameters(const Encoder& encoder, const std::string& prefix, NamedTensors& out);
void append_parameters(const LayerNorm& norm, const std::string& prefix, NamedTensors& out);
void append_parameters(const Linear& linear, const std::string& prefix, NamedTensors& out);
void append_parameters(const Embedding& embed, const std::string& prefix, NamedTensors& out);
// embed.weight, pos_embed.weight (learned), encoder.*, head.weight (untied only).
void append_parameters(const CausalLM& model, const std::string& prefix, NamedTensors& out);
// embed.weight, pos_embed.weight (learned), encoder.*, classifier.weight, classifier.bias.
void append_parameters(const Classifier& model, const std::string& prefix, NamedTensors& out);

template <typename Module>
NamedTensors named_parameters(const Module& module, const std::string& prefix = "") {
  NamedTensors out;
  append_parameters(module, prefix, out);
  return out;
}

// Sets every tensor of the list to zero (e.g. gradients, once per optimiser step).
void zero_parameters(const NamedTensors& params);
// Total number of elements.
int64_t parameter_count(const NamedTensors& params);

}  // namespace cabm
