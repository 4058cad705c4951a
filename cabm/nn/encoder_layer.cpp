#include "cabm/nn/encoder_layer.h"

#include <algorithm>

namespace cabm {

EncoderLayer make_encoder_layer(const EncoderLayerConfig& config) {
  if (config.d_model <= 0 || config.nhead <= 0 || config.dim_feedforward <= 0)
    throw Error(fmt::format("TransformerEncoderLayer: sizes must be positive (d_model={}, nhead={}, dim_feedforward={})",
                            config.d_model, config.nhead, config.dim_feedforward));
  if (!(config.dropout >= 0.0f && config.dropout < 1.0f))
    throw Error(fmt::format("TransformerEncoderLayer: dropout {} outside [0, 1)", config.dropout));
  EncoderLayer layer;
  layer.config = config;
  layer.self_attn = make_multi_head_attention({config.d_model, config.nhead, 0, 0, config.bias, config.num_kv_heads, config.rope});
  layer.ffn = make_feed_forward(config.d_model, config.dim_feedforward, config.activation, config.bias);
  layer.norm1 = make_layer_norm(config.d_model, config.layer_norm_eps);
  layer.norm2 = make_layer_norm(config.d_model, config.layer_norm_eps);
  return layer;
}

namespace {
// out = a + b, element-wise over n floats.
void add(const float* a, const float* b, float* out, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

// out += a
void add_into(float* out, const float* a, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) out[i] += a[i];
}

void check_input(const EncoderLayer& layer, const Tensor& x) {
  const int64_t E = layer.config.d_model;
  if (x.dim() != 3 || x.size(2) != E || !x.is_contiguous())
    throw Error(fmt::format("TransformerEncoderLayer: input must be contiguous [B, N, {}], got {}", E,
                            shape_str(x.shape())));
}
}  // namespace

const Tensor& encoder_layer_forward(const EncoderLayer& layer, const Tensor& x, const Mask& mask,
                                    EncoderLayerCache& cache, const ForwardMode& mode) {
  check_input(layer, x);
  const Shape shape = x.shape();
  const int64_t n = x.numel();
  const float p = layer.config.dropout;
  for (Tensor* t : {&cache.norm1_out, &cache.mid, &cache.ffn_out, &cache.output}) ensure_shape(*t, shape);
  cache.mask = mask;
  cache.dropout1 = dropout_args(mode, DropoutSite::kAttentionResidual, p);
  cache.dropout2 = dropout_args(mode, DropoutSite::kFeedForwardResidual, p);
  const DropoutArgs hidden_dropout = dropout_args(mode, DropoutSite::kFeedForwardHidden, p);

  // out = residual + D1(self_attn(input)).
  auto attention_sublayer = [&](const Tensor& input, const float* residual, float* out) {
    AttentionInputs in{input, input, input, mask};
    if (mode.training && p > 0.0f) {
      in.dropout = p;
      in.dropout_seed = dropout_key(mode);
      in.dropout_offset = dropout_offset(mode, DropoutSite::kAttentionWeights);
    }
    const Tensor& attn = multi_head_attention_forward(layer.self_attn, in, cache.attn);
    if (cache.dropout1.active()) {
      dropout_forward(cache.dropout1, attn.data<float>(), out, n);
      add_into(out, residual, n);
    } else {
      add(residual, attn.data<float>(), out, n);
    }
  };
  // cache.ffn_out = D2(ffn(input)).
  auto ffn_branch = [&](const Tensor& input) {
    feed_forward_forward(layer.ffn, as_rows(input), as_rows(cache.ffn_out), cache.ffn, hidden_dropout);
    if (cache.dropout2.active()) dropout_forward(cache.dropout2, cache.ffn_out.data<float>(), cache.ffn_out.data<float>(), n);
  };

  if (layer.config.norm_first) {
    // mid = x + D1(attn(LN1(x))); out = mid + D2(ffn(LN2(mid)))
    layer_norm_forward(layer.norm1, as_rows(x), as_rows(cache.norm1_out), cache.norm1);
    attention_sublayer(cache.norm1_out, x.data<float>(), cache.mid.data<float>());
    ensure_shape(cache.norm2_out, shape);
    layer_norm_forward(layer.norm2, as_rows(cache.mid), as_rows(cache.norm2_out), cache.norm2);
    ffn_branch(cache.norm2_out);
    add(cache.mid.data<float>(), cache.ffn_out.data<float>(), cache.output.data<float>(), n);
  } else {
    // mid = x + D1(attn(x)); h = LN1(mid); sum2 = h + D2(ffn(h)); out = LN2(sum2)
    attention_sublayer(x, x.data<float>(), cache.mid.data<float>());
    layer_norm_forward(layer.norm1, as_rows(cache.mid), as_rows(cache.norm1_out), cache.norm1);
    ffn_branch(cache.norm1_out);
    ensure_shape(cache.sum2, shape);
    add(cache.norm1_out.data<float>(), cache.ffn_out.data<float>(), cache.sum2.data<float>(), n);
    layer_norm_forward(layer.norm2, as_rows(cache.sum2), as_rows(cache.output), cache.norm2);
  }
  return cache.output;
}

void encoder_layer_backward(const EncoderLayer& layer, const Tensor& x, const Tensor& dy, const Tensor& dx,
                            EncoderLayerCache& cache, EncoderLayer& grads) {
  check_input(layer, x);
  const Shape shape = x.shape();
  const int64_t n = x.numel();
  CABM_CHECK(cache.output.defined() && cache.output.shape() == shape, "TransformerEncoderLayer backward without a "
                                                                       "matching forward");
  CABM_CHECK(dy.shape() == shape && dy.is_contiguous() && dx.shape() == shape && dx.is_contiguous(),
             "TransformerEncoderLayer: dy {} and dx {} must be contiguous {}", shape_str(dy.shape()),
             shape_str(dx.shape()), shape_str(shape));
  ensure_shape(cache.d_a, shape);
  ensure_shape(cache.d_b, shape);
  float* da = cache.d_a.data<float>();
  float* db = cache.d_b.data<float>();
  // cache.ffn_out (the forward's branch output) is not needed by the backward pass: it serves
  // as a third scratch buffer, so the backward can run again on the same forward.
  const Tensor& dc_tensor = cache.ffn_out;
  float* dc = cache.ffn_out.data<float>();

  // Self-attention branch D1(attn(input)): g (in cache.d_b) is the gradient of the branch
  // output; it is consumed, and d(input) is written into cache.ffn_out.
  auto attention_branch_backward = [&](const Tensor& input) {
    dropout_backward(cache.dropout1, db, db, n);
    AttentionInputs in{input, input, input, cache.mask};
    multi_head_attention_backward(layer.self_attn, in, cache.d_b, cache.attn, grads.self_attn,
                                  AttentionInputGrads{dc_tensor, dc_tensor, dc_tensor});
  };

  if (layer.config.norm_first) {
    // y = m + D2(ffn(LN2(m))):  dm = dy + LN2ᵀ ffnᵀ D2ᵀ dy
    dropout_backward(cache.dropout2, dy.data<float>(), db, n);  // db = D2ᵀ dy
    feed_forward_backward(layer.ffn, as_rows(cache.norm2_out), as_rows(cache.d_b), as_rows(cache.d_a), cache.ffn,
                          grads.ffn);                             // da = ffnᵀ db
    layer_norm_backward(layer.norm2, as_rows(cache.mid), as_rows(cache.d_a), as_rows(cache.d_a), cache.norm2,
                        grads.norm2);                             // da = LN2ᵀ da
    add_into(da, dy.data<float>(), n);                            // da = dm
    // m = x + D1(attn(LN1(x))):  dx = dm + LN1ᵀ attnᵀ D1ᵀ dm
    std::copy(da, da + n, db);
    attention_branch_backward(cache.norm1_out);                   // dc = attnᵀ D1ᵀ dm
    layer_norm_backward(layer.norm1, as_rows(x), as_rows(dc_tensor), as_rows(cache.d_b), cache.norm1,
                        grads.norm1);                             // db = LN1ᵀ dc
    add(da, db, dx.data<float>(), n);
  } else {
    // y = LN2(s2):  ds2 = LN2ᵀ dy
    layer_norm_backward(layer.norm2, as_rows(cache.sum2), as_rows(dy), as_rows(cache.d_a), cache.norm2, grads.norm2);
    // s2 = h + D2(ffn(h)):  dh = ds2 + ffnᵀ D2ᵀ ds2
    dropout_backward(cache.dropout2, da, db, n);                  // db = D2ᵀ ds2
    feed_forward_backward(layer.ffn, as_rows(cache.norm1_out), as_rows(cache.d_b), as_rows(dc_tensor), cache.ffn,
                          grads.ffn);                             // dc = ffnᵀ db
    add_into(da, dc, n);                                          // da = dh
    // h = LN1(s1):  ds1 = LN1ᵀ dh
    layer_norm_backward(layer.norm1, as_rows(cache.mid), as_rows(cache.d_a), as_rows(cache.d_a), cache.norm1,
                        grads.norm1);
    // s1 = x + D1(attn(x)):  dx = ds1 + attnᵀ D1ᵀ ds1
    std::copy(da, da + n, db);
    attention_branch_backward(x);                                 // dc = attnᵀ D1ᵀ ds1
    add(da, dc, dx.data<float>(), n);
  }
}

const Tensor& encoder_layer_decode(const EncoderLayer& layer, const Tensor& x, KVCache& kv, EncoderLayerCache& cache) {
  check_input(layer, x);
  const Shape shape = x.shape();
  const int64_t n = x.numel();
  for (Tensor* t : {&cache.norm1_out, &cache.mid, &cache.ffn_out, &cache.output}) ensure_shape(*t, shape);
  float* mid = cache.mid.data<float>();
  if (layer.config.norm_first) {
    layer_norm_forward(layer.norm1, as_rows(x), as_rows(cache.norm1_out), cache.norm1);
    const Tensor& attn = multi_head_attention_decode(layer.self_attn, cache.norm1_out, kv, cache.attn);
    add(x.data<float>(), attn.data<float>(), mid, n);
    ensure_shape(cache.norm2_out, shape);
    layer_norm_forward(layer.norm2, as_rows(cache.mid), as_rows(cache.norm2_out), cache.norm2);
    feed_forward_forward(layer.ffn, as_rows(cache.norm2_out), as_rows(cache.ffn_out), cache.ffn);
    add(mid, cache.ffn_out.data<float>(), cache.output.data<float>(), n);
  } else {
    const Tensor& attn = multi_head_attention_decode(layer.self_attn, x, kv, cache.attn);
    add(x.data<float>(), attn.data<float>(), mid, n);
    layer_norm_forward(layer.norm1, as_rows(cache.mid), as_rows(cache.norm1_out), cache.norm1);
    feed_forward_forward(layer.ffn, as_rows(cache.norm1_out), as_rows(cache.ffn_out), cache.ffn);
    ensure_shape(cache.sum2, shape);
    add(cache.norm1_out.data<float>(), cache.ffn_out.data<float>(), cache.sum2.data<float>(), n);
    layer_norm_forward(layer.norm2, as_rows(cache.sum2), as_rows(cache.output), cache.norm2);
  }
  return cache.output;
}

}  // namespace cabm
