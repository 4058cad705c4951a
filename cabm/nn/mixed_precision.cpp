#include "cabm/nn/mixed_precision.h"

#include "cabm/nn/bf16_util.h"

namespace cabm {

std::string precision_name(Precision precision) {
  return precision == Precision::kBf16 ? "bf16" : "fp32";
}

Precision parse_precision(const std::string& name) {
  if (name == "fp32") return Precision::kFp32;
  if (name == "bf16") return Precision::kBf16;
  throw Error(fmt::format("unknown precision '{}' (expected fp32 or bf16)", name));
}

void refresh_bf16_weights(const Linear& layer) {
  if (layer.weight_bf16.defined()) round_to_bf16(layer.weight, layer.weight_bf16);
}

void set_precision(Linear& layer, Precision precision) {
  if (precision == Precision::kFp32) {
    layer.weight_bf16 = Tensor();
    return;
  }
  if (!layer.weight_bf16.defined()) layer.weight_bf16 = Tensor::empty(layer.weight.shape(), rounded_dtype());
  refresh_bf16_weights(layer);
}

void set_precision(MultiHeadAttention& mha, Precision precision) {
  Linear* projections[3] = {&mha.q_proj, &mha.k_proj, &mha.v_proj};
  if (precision == Precision::kFp32) {
    mha.in_proj_weight_bf16 = Tensor();
    for (Linear* p : projections) p->weight_bf16 = Tensor();
    set_precision(mha.out_proj, precision);
    return;
  }
  if (mha.packed() && !mha.in_proj_weight_bf16.defined()) {
    // One [E + 2Ekv, E] copy whose row slices serve the three projections, like the fp32 weight.
    const int64_t E = mha.embed_dim(), Ekv = mha.kv_dim();
    const int64_t offsets[3] = {0, E, E + Ekv}, rows[3] = {E, Ekv, Ekv};
    mha.in_proj_weight_bf16 = Tensor::empty(mha.in_proj_weight.shape(), rounded_dtype());
    for (int64_t p = 0; p < 3; ++p)
      projections[p]->weight_bf16 = mha.in_proj_weight_bf16.narrow(0, offsets[p], rows[p]);
  }
  for (Linear* p : projections) set_precision(*p, precision);  // unpacked: own copies; all: filled
  set_precision(mha.out_proj, precision);
}

void set_precision(EncoderLayer& layer, Precision precision) {
  set_precision(layer.self_attn, precision);
  set_precision(layer.ffn.linear1, precision);
  set_precision(layer.ffn.linear2, precision);
}

void set_precision(Encoder& encoder, Precision precision) {
  for (EncoderLayer& layer : encoder.layers) set_precision(layer, precision);
}

void set_precision(CausalLM& model, Precision precision) {
  set_precision(model.encoder, precision);
  // The output matrix: head.weight, or embed.weight when tied (head.weight is then undefined,
  // and its bf16 copy holds the embedding's).
  if (precision == Precision::kFp32) {
    model.head.weight_bf16 = Tensor();
    return;
  }
  const Tensor& output = model.config.tie_head ? model.embed.weight : model.head.weight;
  if (!model.head.weight_bf16.defined()) model.head.weight_bf16 = Tensor::empty(output.shape(), rounded_dtype());
  round_to_bf16(output, model.head.weight_bf16);
}

void set_precision(Classifier& model, Precision precision) {
  set_precision(model.encoder, precision);
  set_precision(model.classifier, precision);
}

Precision precision_of(const MultiHeadAttention& mha) {
  return mha.bf16() ? Precision::kBf16 : Precision::kFp32;
}
Precision precision_of(const CausalLM& model) {
  return model.head.weight_bf16.defined() ? Precision::kBf16 : Precision::kFp32;
}
Precision precision_of(const Classifier& model) {
  return model.classifier.weight_bf16.defined() ? Precision::kBf16 : Precision::kFp32;
}

void refresh_bf16_weights(const MultiHeadAttention& mha) {
  for (const Linear* p : {&mha.q_proj, &mha.k_proj, &mha.v_proj, &mha.out_proj}) refresh_bf16_weights(*p);
}

void refresh_bf16_weights(const EncoderLayer& layer) {
  refresh_bf16_weights(layer.self_attn);
  refresh_bf16_weights(layer.ffn.linear1);
  refresh_bf16_weights(layer.ffn.linear2);
}

void refresh_bf16_weights(const Encoder& encoder) {
  for (const EncoderLayer& layer : encoder.layers) refresh_bf16_weights(layer);
}

void refresh_bf16_weights(const CausalLM& model) {
  refresh_bf16_weights(model.encoder);
  if (model.head.weight_bf16.defined())
    round_to_bf16(model.config.tie_head ? model.embed.weight : model.head.weight, model.head.weight_bf16);
}

void refresh_bf16_weights(const Classifier& model) {
  refresh_bf16_weights(model.encoder);
  refresh_bf16_weights(model.classifier);
}

}  // namespace cabm
