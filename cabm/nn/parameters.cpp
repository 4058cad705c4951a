#include "cabm/nn/parameters.h"

namespace cabm {

void append_parameters(const Linear& linear, const std::string& prefix, NamedTensors& out) {
  out.push_back({prefix + "weight", linear.weight});
  if (linear.bias.defined()) out.push_back({prefix + "bias", linear.bias});
}

void append_parameters(const LayerNorm& norm, const std::string& prefix, NamedTensors& out) {
  out.push_back({prefix + "weight", norm.weight});
  out.push_back({prefix + "bias", norm.bias});
}

void append_parameters(const MultiHeadAttention& mha, const std::string& prefix, NamedTensors& out) {
  if (mha.packed()) {
    out.push_back({prefix + "in_proj_weight", mha.in_proj_weight});
    if (mha.in_proj_bias.defined()) out.push_back({prefix + "in_proj_bias", mha.in_proj_bias});
  } else {
    out.push_back({prefix + "q_proj_weight", mha.q_proj.weight});
    out.push_back({prefix + "k_proj_weight", mha.k_proj.weight});
    out.push_back({prefix + "v_proj_weight", mha.v_proj.weight});
    if (mha.in_proj_bias.defined()) out.push_back({prefix + "in_proj_bias", mha.in_proj_bias});
  }
  append_parameters(mha.out_proj, prefix + "out_proj.", out);
}

void append_parameters(const EncoderLayer& layer, const std::string& prefix, NamedTensors& out) {
  append_parameters(layer.self_attn, prefix + "self_attn.", out);
  append_parameters(layer.ffn.linear1, prefix + "linear1.", out);
  append_parameters(layer.ffn.linear2, prefix + "linear2.", out);
  append_parameters(layer.norm1, prefix + "norm1.", out);
  append_parameters(layer.norm2, prefix + "norm2.", out);
}

void append_parameters(const Encoder& encoder, const std::string& prefix, NamedTensors& out) {
  for (size_t l = 0; l < encoder.layers.size(); ++l)
    append_parameters(encoder.layers[l], prefix + "layers." + std::to_string(l) + ".", out);
  if (encoder.norm) append_parameters(*encoder.norm, prefix + "norm.", out);
}

}  // namespace cabm

namespace cabm {

void append_parameters(const Embedding& embed, const std::string& prefix, NamedTensors& out) {
  out.push_back({prefix + "weight", embed.weight});
}

void append_parameters(const CausalLM& model, const std::string& prefix, NamedTensors& out) {
  append_parameters(model.embed, prefix + "embed.", out);
  if (model.pos_embed.weight.defined()) append_parameters(model.pos_embed, prefix + "pos_embed.", out);
  append_parameters(model.encoder, prefix + "encoder.", out);
  if (model.head.weight.defined()) out.push_back({prefix + "head.weight", model.head.weight});
}

void append_parameters(const Classifier& model, const std::string& prefix, NamedTensors& out) {
  append_parameters(model.embed, prefix + "embed.", out);
  if (model.pos_embed.weight.defined()) append_parameters(model.pos_embed, prefix + "pos_embed.", out);
  append_parameters(model.encoder, prefix + "encoder.", out);
  append_parameters(model.classifier, prefix + "classifier.", out);
}

void zero_parameters(const NamedTensors& params) {
  for (const NamedTensor& p : params) {
    Tensor view = p.tensor;  // shares the storage
    view.fill(0.0f);
  }
}

int64_t parameter_count(const NamedTensors& params) {
  int64_t n = 0;
  for (const NamedTensor& p : params) n += p.tensor.numel();
  return n;
}

}  // namespace cabm
