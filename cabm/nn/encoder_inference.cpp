#include "cabm/nn/encoder_inference.h"

#include "cabm/kernels/layernorm.h"

namespace cabm {

namespace {

const float* bias_of(const Linear& layer) {
  return layer.bias.defined() ? layer.bias.data<float>() : nullptr;
}

// y = norm(residual + (branch + bias of `product`)), all [rows, E] contiguous; y may alias residual.
void add_norm(const LayerNorm& norm, const Linear& product, const Tensor& residual, const Tensor& branch,
              const Tensor& y) {
  const LayerNormArgs args{residual.size(0), norm.dim(), norm.eps, norm.weight.data<float>(),
                           norm.bias.defined() ? norm.bias.data<float>() : nullptr};
  add_layernorm_forward(args, residual.data<float>(), branch.data<float>(), bias_of(product), y.data<float>());
}

void check_input(const EncoderLayer& layer, const Tensor& x) {
  const int64_t E = layer.config.d_model;
  if (x.dim() != 3 || x.size(2) != E || !x.is_contiguous() || x.dtype() != DType::F32)
    throw Error(
        fmt::format("encoder_layer_infer: input must be contiguous F32 [B, N, {}], got {}", E, shape_str(x.shape())));
  CABM_CHECK(!layer.config.norm_first, "encoder_layer_infer runs post-norm layers only");
}

}  // namespace

void encoder_layer_infer(const EncoderLayer& layer, const Tensor& x, const Mask& mask, EncoderInferenceWorkspace& ws,
                         InferenceActivation activation) {
  check_input(layer, x);
  const Tensor rows = as_rows(x);
  const int64_t n = rows.size(0), E = rows.size(1), F = layer.ffn.linear1.out_features();
  ensure_shape(ws.h, {n, E});
  ensure_shape(ws.branch, {n, E});
  ensure_shape(ws.hidden, {n, F});

  // h = LN1(x + (attn W_Oᵀ + b_O))
  const Tensor& heads = multi_head_attention_heads(layer.self_attn, AttentionInputs{x, x, x, mask}, ws.attn);
  linear_forward(without_bias(layer.self_attn.out_proj), as_rows(heads), ws.branch);
  add_norm(layer.norm1, layer.self_attn.out_proj, rows, ws.branch, ws.h);

  // x = LN2(h + (act(h W1ᵀ + b1) W2ᵀ + b2)); x is free to overwrite since h was made.
  const FeedForward& ffn = layer.ffn;
  linear_forward(without_bias(ffn.linear1), ws.h, ws.hidden);
  if (activation == InferenceActivation::kGeluTanh)
    bias_gelu_tanh_inplace(bias_of(ffn.linear1), ws.hidden.data<float>(), n, F);
  else
    bias_activation_inplace(ffn.activation, bias_of(ffn.linear1), ws.hidden.data<float>(), n, F);
  linear_forward(without_bias(ffn.linear2), ws.hidden, ws.branch);
  add_norm(layer.norm2, ffn.linear2, ws.h, ws.branch, rows);
}

}  // namespace cabm
