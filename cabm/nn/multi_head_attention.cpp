#include "cabm/nn/multi_head_attention.h"

#include "cabm/kernels/attention/attention.h"
#include "cabm/nn/bf16_util.h"

#include <algorithm>

namespace cabm {

MultiHeadAttention make_multi_head_attention(MultiHeadAttentionConfig config) {
  const int64_t E = config.embed_dim, H = config.num_heads;
  if (config.kdim == 0) config.kdim = E;
  if (config.vdim == 0) config.vdim = E;
  if (E <= 0 || H <= 0 || config.kdim <= 0 || config.vdim <= 0)
    throw Error(fmt::format("MultiheadAttention: sizes must be positive (embed_dim={}, num_heads={}, kdim={}, vdim={})",
                            E, H, config.kdim, config.vdim));
  if (E % H != 0)
    throw Error(fmt::format("MultiheadAttention: embed_dim {} is not divisible by num_heads {}", E, H));
  if (config.num_kv_heads == 0) config.num_kv_heads = H;
  if (config.num_kv_heads < 0 || H % config.num_kv_heads != 0)
    throw Error(fmt::format("MultiheadAttention: num_heads {} is not a multiple of num_kv_heads {}", H,
                            config.num_kv_heads));
  if (config.rope.style != RopeStyle::kNone) rope_resolved_dim(config.rope, E / H);
  MultiHeadAttention mha;
  mha.config = config;
  const int64_t Ekv = mha.kv_dim(), rows = mha.qkv_dim();
  // PyTorch keeps one in_proj_bias [3E] even when the weights are separate.
  if (config.bias) mha.in_proj_bias = Tensor::zeros({rows});
  const bool packed = config.kdim == E && config.vdim == E;
  if (packed) mha.in_proj_weight = Tensor::zeros({rows, E});
  Linear* projections[3] = {&mha.q_proj, &mha.k_proj, &mha.v_proj};
  const int64_t widths[3] = {E, config.kdim, config.vdim};
  const int64_t offsets[3] = {0, E, E + Ekv}, outputs[3] = {E, Ekv, Ekv};
  for (int64_t p = 0; p < 3; ++p) {
    projections[p]->weight = packed ? mha.in_proj_weight.narrow(0, offsets[p], outputs[p])
                                    : Tensor::zeros({outputs[p], widths[p]});
    if (config.bias) projections[p]->bias = mha.in_proj_bias.narrow(0, offsets[p], outputs[p]);
  }
  mha.out_proj = make_linear(E, E, config.bias);
  return mha;
}

namespace {

void check_inputs(const MultiHeadAttention& mha, const AttentionInputs& in) {
  const int64_t E = mha.embed_dim();
  auto check = [](const Tensor& t, const char* name, int64_t width) {
    if (!t.defined() || t.dim() != 3 || t.dtype() != DType::F32 || t.size(2) != width || t.size(1) == 0 ||
        t.size(0) == 0)
      throw Error(fmt::format("MultiheadAttention: {} must be F32 [B, L, {}] with B, L > 0, got {}", name, width,
                              t.defined() ? shape_str(t.shape()) : "undefined"));
  };
  check(in.query, "query", E);
  check(in.key, "key", mha.config.kdim);
  check(in.value, "value", mha.config.vdim);
  if (in.key.size(0) != in.query.size(0) || in.value.size(0) != in.query.size(0))
    throw Error("MultiheadAttention: query, key and value differ in batch size");
  if (in.key.size(1) != in.value.size(1))
    throw Error(fmt::format("MultiheadAttention: key length {} differs from value length {}", in.key.size(1),
                            in.value.size(1)));
}

bool is_self_attention(const AttentionInputs& in) {
  return in.query.raw_data() == in.key.raw_data() && in.key.raw_data() == in.value.raw_data() &&
         in.query.shape() == in.key.shape() && in.query.strides() == in.key.strides() &&
         in.key.strides() == in.value.strides();
}

// [B, L, E] buffer (row stride `row`) seen as heads [B, L, H, d].
Tensor split_heads(const Tensor& buffer, int64_t offset, int64_t B, int64_t L, int64_t H, int64_t d, int64_t row) {
  return buffer.as_strided({B, L, H, d}, {L * row, row, d, 1}, offset);
}

// Makes t an own contiguous buffer (never a view into `shared`), reallocating only when needed.
void ensure_own(Tensor& t, const Shape& shape, DType dtype, const Tensor& shared) {
  if (t.defined() && t.shares_storage(shared)) t = Tensor();
  ensure_shape(t, shape, dtype);
}

// [B, L, H, d] contiguous head tensor as [B·L, H·d] rows.
Tensor head_rows(const Tensor& heads) {
  return heads.view({heads.size(0) * heads.size(1), heads.size(2) * heads.size(3)});
}

// Positions first .. first + n − 1 (rotary).
std::vector<int64_t> positions(int64_t first, int64_t n) {
  std::vector<int64_t> p(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) p[i] = first + i;
  return p;
}

// Rotary: Q and K (fp32 heads, views into the projection buffers) rotated in place, or, with
// backward, dQ and dK rotated back.
void apply_rope(const MultiHeadAttention& mha, const Tensor& q, const Tensor& k, int64_t position, bool backward) {
  const RopeOptions& rope = mha.config.rope;
  if (rope.style == RopeStyle::kNone) return;
  const std::vector<int64_t> qp = positions(position, q.size(1)), kp = positions(position, k.size(1));
  if (backward) {
    rope_backward(q, qp, rope);
    rope_backward(k, kp, rope);
  } else {
    rope_forward(q, qp, rope);
    rope_forward(k, kp, rope);
  }
}

// Q, K, V head views of a packed [B, L, E + 2Ekv] buffer.
void split_qkv(const MultiHeadAttention& mha, const Tensor& qkv, int64_t B, int64_t L, Tensor& q, Tensor& k,
               Tensor& v) {
  const int64_t E = mha.embed_dim(), Ekv = mha.kv_dim(), W = mha.qkv_dim(), d = mha.head_dim();
  q = split_heads(qkv, 0, B, L, mha.num_heads(), d, W);
  k = split_heads(qkv, E, B, L, mha.num_kv_heads(), d, W);
  v = split_heads(qkv, E + Ekv, B, L, mha.num_kv_heads(), d, W);
}

// Forgets the head views of a packed projection buffer before it is resized: while they share its
// storage, ensure_shape cannot reuse it and would allocate fresh memory for every new shape.
void drop_views(Tensor& q, Tensor& k, Tensor& v) {
  for (Tensor* t : {&q, &k, &v}) *t = Tensor();
}

// Mixed precision: cache.q_bf16/k_bf16/v_bf16 = bf16(cache.q/k/v).
void round_heads(const MultiHeadAttention& mha, MultiHeadAttentionCache& cache, int64_t B) {
  const int64_t N = cache.q.size(1), M = cache.k.size(1), d = mha.head_dim();
  if (cache.self_attention) {
    drop_views(cache.q_bf16, cache.k_bf16, cache.v_bf16);
    ensure_shape(cache.qkv_bf16, {B, N, mha.qkv_dim()}, DType::BF16);
    round_to_bf16(as_rows(cache.qkv), as_rows(cache.qkv_bf16));
    split_qkv(mha, cache.qkv_bf16, B, N, cache.q_bf16, cache.k_bf16, cache.v_bf16);
    return;
  }
  const Tensor* heads[3] = {&cache.q, &cache.k, &cache.v};
  Tensor* rounded[3] = {&cache.q_bf16, &cache.k_bf16, &cache.v_bf16};
  const int64_t lengths[3] = {N, M, M}, head_counts[3] = {mha.num_heads(), mha.num_kv_heads(), mha.num_kv_heads()};
  for (int p = 0; p < 3; ++p) {
    ensure_own(*rounded[p], {B, lengths[p], head_counts[p], d}, DType::BF16, cache.qkv_bf16);
    round_to_bf16(head_rows(*heads[p]), head_rows(*rounded[p]));
  }
}

// cache.q/k/v = the bf16-rounded values, as fp32 (for the fp32 reference kernel).
void widen_heads(MultiHeadAttentionCache& cache) {
  if (cache.self_attention) {
    widen_from_bf16(as_rows(cache.qkv_bf16), as_rows(cache.qkv));
    return;
  }
  widen_from_bf16(head_rows(cache.q_bf16), head_rows(cache.q));
  widen_from_bf16(head_rows(cache.k_bf16), head_rows(cache.k));
  widen_from_bf16(head_rows(cache.v_bf16), head_rows(cache.v));
}

}  // namespace

const Tensor& multi_head_attention_heads(const MultiHeadAttention& mha, const AttentionInputs& in,
                                         MultiHeadAttentionCache& cache) {
  check_inputs(mha, in);
  const int64_t B = in.query.size(0), N = in.query.size(1), M = in.key.size(1);
  const int64_t E = mha.embed_dim(), H = mha.num_heads(), d = mha.head_dim();
  const int64_t head_counts[3] = {H, mha.num_kv_heads(), mha.num_kv_heads()};

  cache.self_attention = mha.packed() && is_self_attention(in);
  if (cache.self_attention) {
    // One GEMM for Q, K and V: [B·N, E] × [E, E + 2Ekv].
    drop_views(cache.q, cache.k, cache.v);
    ensure_shape(cache.qkv, {B, N, mha.qkv_dim()});
    const Linear fused{mha.in_proj_weight, mha.in_proj_bias, mha.in_proj_weight_bf16};
    linear_forward(fused, as_rows(in.query.contiguous()), as_rows(cache.qkv), &cache.query_bf16);
    split_qkv(mha, cache.qkv, B, N, cache.q, cache.k, cache.v);
  } else {
    const Linear* projections[3] = {&mha.q_proj, &mha.k_proj, &mha.v_proj};
    const Tensor* inputs[3] = {&in.query, &in.key, &in.value};
    Tensor* heads[3] = {&cache.q, &cache.k, &cache.v};
    for (int p = 0; p < 3; ++p) {
      const int64_t L = inputs[p]->size(1);
      // Own contiguous [B, L, E or Ekv] buffers; reallocated only when they do not fit.
      ensure_own(*heads[p], {B, L, head_counts[p], d}, DType::F32, cache.qkv);
      linear_forward(*projections[p], as_rows(inputs[p]->contiguous()), heads[p]->view({B * L, head_counts[p] * d}));
    }
  }

  apply_rope(mha, cache.q, cache.k, in.position, false);
  ensure_shape(cache.attn, {B, N, E});
  ensure_shape(cache.lse, {B, H, N});
  cache.options = AttentionOptions{};
  cache.options.mask = in.mask;
  cache.options.dropout = in.dropout;
  cache.options.dropout_seed = in.dropout_seed;
  cache.options.dropout_offset = in.dropout_offset;
  const Tensor attn_heads = cache.attn.view({B, N, H, d});
  if (mha.bf16()) round_heads(mha, cache, B);
  cache.bf16_kernel = mha.bf16() && !in.need_weights;
  if (in.need_weights) {
    if (mha.bf16()) widen_heads(cache);  // the weights from the fp32 reference on bf16-rounded Q, K, V
    ensure_shape(cache.weights, {B, H, N, M});
    attention_reference_forward(cache.q, cache.k, cache.v, cache.options, attn_heads, &cache.weights, &cache.lse);
    if (in.average_weights) {
      // PyTorch's attn_output_weights.mean(dim=1).
      ensure_shape(cache.averaged_weights, {B, N, M});
      const float* w = cache.weights.data<float>();
      float* avg = cache.averaged_weights.data<float>();
      for (int64_t b = 0; b < B; ++b)
        for (int64_t e = 0; e < N * M; ++e) {
          float sum = 0.0f;
          for (int64_t h = 0; h < H; ++h) sum += w[(b * H + h) * N * M + e];
          avg[b * N * M + e] = sum / static_cast<float>(H);
        }
    }
  } else if (cache.bf16_kernel) {
    attention_forward(cache.q_bf16, cache.k_bf16, cache.v_bf16, cache.options, attn_heads, &cache.lse);
  } else {
    attention_forward(cache.q, cache.k, cache.v, cache.options, attn_heads, &cache.lse);  // the fast path
  }
  return cache.attn;
}

const Tensor& multi_head_attention_forward(const MultiHeadAttention& mha, const AttentionInputs& in,
                                           MultiHeadAttentionCache& cache) {
  multi_head_attention_heads(mha, in, cache);
  const int64_t B = in.query.size(0), N = in.query.size(1), E = mha.embed_dim();
  ensure_shape(cache.output, {B, N, E});
  linear_forward(mha.out_proj, as_rows(cache.attn), as_rows(cache.output), &cache.attn_bf16);
  return cache.output;
}

namespace {
bool same_tensor(const Tensor& a, const Tensor& b) {
  return a.defined() && b.defined() && a.raw_data() == b.raw_data() && a.shape() == b.shape() &&
         a.strides() == b.strides();
}

// A [B, L, W] input or input gradient as [B·L, W] rows (contiguous tensors only).
Tensor rows_of(const Tensor& t) { return t.defined() ? as_rows(t) : Tensor(); }
}  // namespace

void multi_head_attention_backward(const MultiHeadAttention& mha, const AttentionInputs& in, const Tensor& dout,
                                   MultiHeadAttentionCache& cache, MultiHeadAttention& grads,
                                   const AttentionInputGrads& dinputs) {
  check_inputs(mha, in);
  const int64_t B = in.query.size(0), N = in.query.size(1), M = in.key.size(1);
  const int64_t E = mha.embed_dim(), H = mha.num_heads(), d = mha.head_dim();
  CABM_CHECK(cache.output.defined() && cache.output.shape() == (Shape{B, N, E}) && cache.k.size(1) == M,
             "MultiheadAttention backward without a matching forward");
  CABM_CHECK(dout.shape() == (Shape{B, N, E}) && dout.is_contiguous(), "MultiheadAttention: dout {} must be [{}, {}, {}]",
             shape_str(dout.shape()), B, N, E);
  CABM_CHECK(grads.config.embed_dim == E && grads.packed() == mha.packed() &&
                 grads.config.kdim == mha.config.kdim && grads.config.vdim == mha.config.vdim &&
                 grads.num_kv_heads() == mha.num_kv_heads(),
             "MultiheadAttention gradients must come from a module of the same configuration");
  auto check_grad = [](const Tensor& g, const Tensor& x, const char* name) {
    if (g.defined() && (g.shape() != x.shape() || !g.is_contiguous()))
      throw Error(fmt::format("MultiheadAttention: gradient of {} must be contiguous {}, got {}", name,
                              shape_str(x.shape()), shape_str(g.shape())));
  };
  check_grad(dinputs.query, in.query, "query");
  check_grad(dinputs.key, in.key, "key");
  check_grad(dinputs.value, in.value, "value");

  // out_proj: d(attn) = dout W_O;  dW_O += doutᵀ attn;  db_O += Σ dout.
  ensure_shape(cache.d_attn, {B, N, E});
  linear_backward(mha.out_proj, as_rows(cache.attn), as_rows(dout), as_rows(cache.d_attn), grads.out_proj, false,
                  &cache.attn_bf16);

  // Attention: dQ, dK, dV (head views of [B, *, E or Ekv] buffers).
  const int64_t head_counts[3] = {H, mha.num_kv_heads(), mha.num_kv_heads()};
  if (cache.self_attention) {
    drop_views(cache.d_q, cache.d_k, cache.d_v);
    ensure_shape(cache.d_qkv, {B, N, mha.qkv_dim()});
    split_qkv(mha, cache.d_qkv, B, N, cache.d_q, cache.d_k, cache.d_v);
  } else {
    Tensor* heads[3] = {&cache.d_q, &cache.d_k, &cache.d_v};
    const int64_t lengths[3] = {N, M, M};
    for (int p = 0; p < 3; ++p) ensure_own(*heads[p], {B, lengths[p], head_counts[p], d}, DType::F32, cache.d_qkv);
  }
  const AttentionGrads attention_grads{cache.d_q, cache.d_k, cache.d_v};
  if (cache.bf16_kernel) {
    // The bf16 Q, K, V of the forward; dO, P and dS are rounded inside, gradients are fp32.
    const AttentionSaved saved{cache.q_bf16, cache.k_bf16, cache.v_bf16, cache.attn.view({B, N, H, d}), cache.lse};
    attention_backward(saved, cache.d_attn.view({B, N, H, d}), cache.options, attention_grads);
  } else {
    const AttentionSaved saved{cache.q, cache.k, cache.v, cache.attn.view({B, N, H, d}), cache.lse};
    attention_backward(saved, cache.d_attn.view({B, N, H, d}), cache.options, attention_grads);
  }

  apply_rope(mha, cache.d_q, cache.d_k, in.position, true);

  // Input projections: d(input) = dX W_X;  dW_X += dXᵀ input;  db_X += Σ dX (X = Q, K, V).
  const bool all_alias = same_tensor(dinputs.query, dinputs.key) && same_tensor(dinputs.query, dinputs.value);
  const bool none = !dinputs.query.defined() && !dinputs.key.defined() && !dinputs.value.defined();
  if (cache.self_attention && (all_alias || none)) {
    // One GEMM pair for the packed projection: d(input) = d(QKV) W_in, dW_in += d(QKV)ᵀ input.
    const Linear fused{mha.in_proj_weight, mha.in_proj_bias, mha.in_proj_weight_bf16};
    Linear fused_grad{grads.in_proj_weight, grads.in_proj_bias, Tensor()};
    linear_backward(fused, as_rows(in.query.contiguous()), as_rows(cache.d_qkv), rows_of(dinputs.query), fused_grad,
                    false, &cache.query_bf16);
    return;
  }
  auto d_rows = [&](int p, int64_t L) -> Tensor {
    const int64_t width = head_counts[p] * d, offsets[3] = {0, E, E + mha.kv_dim()};
    if (cache.self_attention) return cache.d_qkv.as_strided({B * L, width}, {mha.qkv_dim(), 1}, offsets[p]);
    const Tensor* heads[3] = {&cache.d_q, &cache.d_k, &cache.d_v};
    return heads[p]->view({B * L, width});
  };
  const Linear* projections[3] = {&mha.q_proj, &mha.k_proj, &mha.v_proj};
  Linear* projection_grads[3] = {&grads.q_proj, &grads.k_proj, &grads.v_proj};
  const Tensor* inputs[3] = {&in.query, &in.key, &in.value};
  const Tensor* outputs[3] = {&dinputs.query, &dinputs.key, &dinputs.value};
  for (int p = 0; p < 3; ++p) {
    bool accumulate = false;
    for (int earlier = 0; earlier < p; ++earlier) accumulate = accumulate || same_tensor(*outputs[p], *outputs[earlier]);
    const int64_t L = inputs[p]->size(1);
    linear_backward(*projections[p], as_rows(inputs[p]->contiguous()), d_rows(p, L), rows_of(*outputs[p]),
                    *projection_grads[p], accumulate);
  }
}

void kv_cache_reset(KVCache& kv, int64_t B, int64_t capacity, int64_t kv_dim, DType dtype) {
  CABM_CHECK(B > 0 && capacity > 0 && kv_dim > 0, "KV cache sizes must be positive (B={}, capacity={}, Ekv={})", B,
             capacity, kv_dim);
  CABM_CHECK(dtype == DType::F32 || dtype == DType::BF16, "KV cache dtype must be F32 or BF16");
  ensure_shape(kv.k, {B, capacity, kv_dim}, dtype);
  ensure_shape(kv.v, {B, capacity, kv_dim}, dtype);
  kv.length = 0;
}

const Tensor& multi_head_attention_decode(const MultiHeadAttention& mha, const Tensor& x, KVCache& kv,
                                          MultiHeadAttentionCache& cache) {
  const int64_t E = mha.embed_dim(), H = mha.num_heads(), d = mha.head_dim();
  const int64_t Hkv = mha.num_kv_heads(), Ekv = mha.kv_dim();
  CABM_CHECK(mha.config.kdim == E && mha.config.vdim == E, "decoding needs self-attention (kdim = vdim = E)");
  CABM_CHECK(x.dim() == 3 && x.size(2) == E && x.is_contiguous(), "decode input {} must be contiguous [B, n, {}]",
             shape_str(x.shape()), E);
  const int64_t B = x.size(0), n = x.size(1), cap = kv.capacity();
  CABM_CHECK(kv.k.defined() && kv.k.size(0) == B && kv.k.size(2) == Ekv, "KV cache {} does not fit input {}",
             shape_str(kv.k.shape()), shape_str(x.shape()));
  if (kv.length + n > cap)
    throw Error(fmt::format("KV cache full: {} positions + {} new exceed its capacity {}", kv.length, n, cap));

  // Q of the new positions; K and V appended to the cache, batch item by batch item (the
  // cache rows of one item are contiguous, those of different items are cap·E apart).
  if (cache.q.shares_storage(cache.qkv)) cache.q = Tensor();  // never write into a forward's packed buffer
  ensure_shape(cache.q, {B, n, H, d});
  linear_forward(mha.q_proj, as_rows(x), cache.q.view({B * n, E}));
  const bool bf16_kv = kv.k.dtype() == DType::BF16;
  if (bf16_kv) {
    // K, V of the new positions in fp32 scratch (one GEMM each), rounded into the cache rows.
    ensure_own(cache.k, {B, n, Hkv, d}, DType::F32, cache.qkv);
    ensure_own(cache.v, {B, n, Hkv, d}, DType::F32, cache.qkv);
    linear_forward(mha.k_proj, as_rows(x), head_rows(cache.k));
    linear_forward(mha.v_proj, as_rows(x), head_rows(cache.v));
    apply_rope(mha, cache.q, cache.k, kv.length, false);
    for (int64_t b = 0; b < B; ++b) {
      round_to_bf16(head_rows(cache.k).narrow(0, b * n, n), kv.k.select(0, b).narrow(0, kv.length, n));
      round_to_bf16(head_rows(cache.v).narrow(0, b * n, n), kv.v.select(0, b).narrow(0, kv.length, n));
    }
    ensure_own(cache.q_bf16, {B, n, H, d}, DType::BF16, cache.qkv_bf16);
    round_to_bf16(head_rows(cache.q), head_rows(cache.q_bf16));
  } else {
    for (int64_t b = 0; b < B; ++b) {
      const Tensor xb = x.select(0, b);
      linear_forward(mha.k_proj, xb, kv.k.select(0, b).narrow(0, kv.length, n));
      linear_forward(mha.v_proj, xb, kv.v.select(0, b).narrow(0, kv.length, n));
    }
    // The new keys, where they sit in the cache.
    apply_rope(mha, cache.q, kv.k.as_strided({B, n, Hkv, d}, {cap * Ekv, Ekv, d, 1}, kv.length * Ekv), kv.length, false);
  }
  const int64_t L = kv.length + n;
  const Tensor k = kv.k.as_strided({B, L, Hkv, d}, {cap * Ekv, Ekv, d, 1});
  const Tensor v = kv.v.as_strided({B, L, Hkv, d}, {cap * Ekv, Ekv, d, 1});

  ensure_shape(cache.attn, {B, n, E});
  AttentionOptions options;
  options.mask = Mask::causal(CausalAlign::kBottomRight);
  attention_forward(bf16_kv ? cache.q_bf16 : cache.q, k, v, options, cache.attn.view({B, n, H, d}));
  ensure_shape(cache.output, {B, n, E});
  linear_forward(mha.out_proj, as_rows(cache.attn), as_rows(cache.output));
  kv.length = L;
  return cache.output;
}

}  // namespace cabm
