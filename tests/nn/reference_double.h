// A double-precision reference of the nn/ forward passes, written independently of the float
// code (plain loops, one function per module), reading parameters by their PyTorch names. The
// gradient-check tests differentiate it by central differences and compare with the float
// backward passes. Masks use cabm/kernels/attention/mask.h's ResolvedMask (the mask semantics are tested
// elsewhere) and dropout uses the same counter-based decisions as the kernels, so training
// mode is checked too.
#pragma once

#include "cabm/kernels/attention/reference.h"
#include "cabm/kernels/attention/mask.h"
#include "cabm/nn/forward_mode.h"
#include "cabm/nn/parameters.h"

#include <cmath>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace cabm::test::ref {

using Vec = std::vector<double>;
using Params = std::map<std::string, Vec>;

inline Vec to_vec(const Tensor& t) {
  const std::vector<float> f = t.to_vector();
  return Vec(f.begin(), f.end());
}

inline Params to_params(const NamedTensors& named) {
  Params p;
  for (const NamedTensor& n : named) p[n.name] = to_vec(n.tensor);
  return p;
}

inline const Vec& get(const Params& p, const std::string& name) {
  auto it = p.find(name);
  if (it == p.end()) throw std::runtime_error("reference: missing parameter " + name);
  return it->second;
}

// y[R, out] = x[R, in] Wᵀ + b (b may be empty).
inline Vec linear(const Vec& x, int64_t R, int64_t in, const Vec& W, const double* b, int64_t out,
                  int64_t w_offset = 0) {
  Vec y(static_cast<size_t>(R * out));
  for (int64_t r = 0; r < R; ++r)
    for (int64_t o = 0; o < out; ++o) {
      double s = b ? b[o] : 0.0;
      for (int64_t k = 0; k < in; ++k) s += x[r * in + k] * W[w_offset + o * in + k];
      y[r * out + o] = s;
    }
  return y;
}

inline Vec layer_norm(const Vec& x, int64_t R, int64_t E, const Vec& w, const Vec& b, double eps) {
  Vec y(x.size());
  for (int64_t r = 0; r < R; ++r) {
    double mean = 0, var = 0;
    for (int64_t c = 0; c < E; ++c) mean += x[r * E + c];
    mean /= E;
    for (int64_t c = 0; c < E; ++c) var += (x[r * E + c] - mean) * (x[r * E + c] - mean);
    var /= E;
    for (int64_t c = 0; c < E; ++c) y[r * E + c] = (x[r * E + c] - mean) / std::sqrt(var + eps) * w[c] + b[c];
  }
  return y;
}

inline double act(Activation a, double x) {
  return a == Activation::kRelu ? (x > 0 ? x : 0.0) : 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0)));
}

// Element i of a buffer after dropout with args (identity when inactive).
inline void dropout(Vec& v, const DropoutArgs& args) {
  if (!args.active()) return;
  for (size_t i = 0; i < v.size(); ++i) v[i] = dropout_keep(args, i) ? v[i] / (1.0 - args.p) : 0.0;
}

struct MhaShape {
  int64_t B, N, M, E, H, kdim, vdim;
  int64_t Hkv = 0;     // key/value heads (grouped-query attention); 0 = H
  RopeOptions rope{};  // rotary positions on q (0..N−1) and k (0..M−1)
};

// Rotary positions on x [B, L, heads·d] in double, at the float angles of cabm/kernels/rope.h.
inline void rotate(Vec& x, int64_t B, int64_t L, int64_t heads, int64_t d, const RopeOptions& o) {
  if (o.style == RopeStyle::kNone) return;
  const int64_t rd = o.rope_dim ? o.rope_dim : d;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < L; ++t)
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t pr = 0; pr < rd / 2; ++pr) {
          const float inv =
              1.0f / static_cast<float>(std::pow(double{o.theta}, static_cast<float>(2 * pr) / static_cast<float>(rd)));
          const double angle = static_cast<float>(t) * inv;
          const int64_t base = ((b * L + t) * heads + h) * d;
          const int64_t ia = base + (o.style == RopeStyle::kNeox ? pr : 2 * pr);
          const int64_t ib = ia + (o.style == RopeStyle::kNeox ? rd / 2 : 1);
          const double xa = x[ia], xb = x[ib];
          x[ia] = xa * std::cos(angle) - xb * std::sin(angle);
          x[ib] = xb * std::cos(angle) + xa * std::sin(angle);
        }
}

// PyTorch MultiheadAttention (batch_first) with parameters under `prefix`.
inline Vec mha(const Params& p, const std::string& prefix, const MhaShape& s, const Vec& query, const Vec& key,
               const Vec& value, const AttentionOptions& options) {
  const int64_t B = s.B, N = s.N, M = s.M, E = s.E, H = s.H, d = E / H;
  const int64_t Hkv = s.Hkv ? s.Hkv : H, Ekv = Hkv * d, group = H / Hkv;
  const bool packed = p.count(prefix + "in_proj_weight") > 0;
  const Vec* bias = p.count(prefix + "in_proj_bias") ? &get(p, prefix + "in_proj_bias") : nullptr;
  // Rows of the packed weight: W_Q [E], W_K [Ekv], W_V [Ekv].
  const int64_t first_row[3] = {0, E, E + Ekv}, rows[3] = {E, Ekv, Ekv};
  auto proj = [&](const Vec& x, int64_t L, int64_t width, int which, const char* name) {
    const double* b = bias ? bias->data() + first_row[which] : nullptr;
    if (packed)
      return linear(x, B * L, width, get(p, prefix + "in_proj_weight"), b, rows[which], first_row[which] * E);
    return linear(x, B * L, width, get(p, prefix + name), b, rows[which]);
  };
  Vec q = proj(query, N, E, 0, "q_proj_weight");
  Vec k = proj(key, M, s.kdim, 1, "k_proj_weight");
  const Vec v = proj(value, M, s.vdim, 2, "v_proj_weight");
  rotate(q, B, N, H, d, s.rope);
  rotate(k, B, M, Hkv, d, s.rope);
  const ResolvedMask mask(options.mask, B, H, N, M);
  const double scale = options.scale ? *options.scale : 1.0 / std::sqrt(static_cast<double>(d));
  Vec attn(static_cast<size_t>(B * N * E), 0.0);
  std::vector<float> row(static_cast<size_t>(M));
  Vec sc(static_cast<size_t>(M));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < N; ++i) {
        mask.fill_row(b, h, i, row.data());
        double mx = -INFINITY;
        for (int64_t j = 0; j < M; ++j) {
          if (row[j] == -INFINITY) {
            sc[j] = -INFINITY;
            continue;
          }
          double dot = 0;
          for (int64_t c = 0; c < d; ++c)
            dot += q[(b * N + i) * E + h * d + c] * k[(b * M + j) * Ekv + (h / group) * d + c];
          sc[j] = dot * scale + row[j];
          mx = std::max(mx, sc[j]);
        }
        if (mx == -INFINITY) continue;  // fully masked: output 0
        double sum = 0;
        for (int64_t j = 0; j < M; ++j) sum += sc[j] == -INFINITY ? 0.0 : std::exp(sc[j] - mx);
        for (int64_t j = 0; j < M; ++j) {
          double a = sc[j] == -INFINITY ? 0.0 : std::exp(sc[j] - mx) / sum;
          if (options.dropout > 0)
            a = attention_dropout_keep(options, b, h, H, i, j, M) ? a / (1.0 - options.dropout) : 0.0;
          for (int64_t c = 0; c < d; ++c)
            attn[(b * N + i) * E + h * d + c] += a * v[(b * M + j) * Ekv + (h / group) * d + c];
        }
      }
  const Vec& ob = get(p, prefix + "out_proj.bias");
  return linear(attn, B * N, E, get(p, prefix + "out_proj.weight"), ob.data(), E);
}

// nn.TransformerEncoderLayer (batch_first) under `prefix`; x [B, N, E].
inline Vec encoder_layer(const Params& p, const std::string& prefix, const EncoderLayerConfig& cfg, int64_t B,
                         int64_t N, const Vec& x, const Mask& mask, const ForwardMode& mode) {
  const int64_t E = cfg.d_model, F = cfg.dim_feedforward, R = B * N;
  auto ln = [&](const Vec& v, const char* name) {
    return layer_norm(v, R, E, get(p, prefix + name + ".weight"), get(p, prefix + name + ".bias"), cfg.layer_norm_eps);
  };
  auto sa = [&](const Vec& v) {
    AttentionOptions options;
    options.mask = mask;
    if (mode.training && cfg.dropout > 0) {
      options.dropout = cfg.dropout;
      options.dropout_seed = dropout_key(mode);
      options.dropout_offset = dropout_offset(mode, DropoutSite::kAttentionWeights);
    }
    Vec out = mha(p, prefix + "self_attn.", {B, N, N, E, cfg.nhead, E, E, cfg.num_kv_heads, cfg.rope}, v, v, v,
                  options);
    dropout(out, dropout_args(mode, DropoutSite::kAttentionResidual, cfg.dropout));
    return out;
  };
  auto ff = [&](const Vec& v) {
    Vec hdn = linear(v, R, E, get(p, prefix + "linear1.weight"), get(p, prefix + "linear1.bias").data(), F);
    for (double& e : hdn) e = act(cfg.activation, e);
    dropout(hdn, dropout_args(mode, DropoutSite::kFeedForwardHidden, cfg.dropout));
    Vec out = linear(hdn, R, F, get(p, prefix + "linear2.weight"), get(p, prefix + "linear2.bias").data(), E);
    dropout(out, dropout_args(mode, DropoutSite::kFeedForwardResidual, cfg.dropout));
    return out;
  };
  auto add = [](Vec a, const Vec& b) {
    for (size_t i = 0; i < a.size(); ++i) a[i] += b[i];
    return a;
  };
  if (cfg.norm_first) {
    const Vec m = add(x, sa(ln(x, "norm1")));
    return add(m, ff(ln(m, "norm2")));
  }
  const Vec h = ln(add(x, sa(x)), "norm1");
  return ln(add(h, ff(h)), "norm2");
}

inline Vec encoder(const Params& p, const std::string& prefix, const EncoderLayerConfig& cfg, int64_t L, int64_t B,
                   int64_t N, Vec x, const Mask& mask, const ForwardMode& mode) {
  ForwardMode m = mode;
  for (int64_t l = 0; l < L; ++l) {
    m.layer = static_cast<uint64_t>(l);
    x = encoder_layer(p, prefix + "layers." + std::to_string(l) + ".", cfg, B, N, x, mask, m);
  }
  if (p.count(prefix + "norm.weight"))
    x = layer_norm(x, B * N, cfg.d_model, get(p, prefix + "norm.weight"), get(p, prefix + "norm.bias"),
                   cfg.layer_norm_eps);
  return x;
}

// Mean cross-entropy, PyTorch semantics (see cabm/kernels/cross_entropy.h).
inline double cross_entropy(const Vec& logits, int64_t rows, int64_t V, const std::vector<int64_t>& targets,
                            int64_t ignore_index, double eps) {
  double total = 0;
  int64_t count = 0;
  for (int64_t r = 0; r < rows; ++r) {
    if (targets[r] == ignore_index) continue;
    double mx = -INFINITY;
    for (int64_t c = 0; c < V; ++c) mx = std::max(mx, logits[r * V + c]);
    double sum = 0;
    for (int64_t c = 0; c < V; ++c) sum += std::exp(logits[r * V + c] - mx);
    const double lse = mx + std::log(sum);
    double smooth = 0;
    for (int64_t c = 0; c < V; ++c) smooth += lse - logits[r * V + c];
    total += (1 - eps) * (lse - logits[r * V + targets[r]]) + eps / V * smooth;
    ++count;
  }
  return count ? total / count : 0.0;
}

// Token + learned or sinusoidal position embeddings (rotary: none here; with the models'
// embedding dropout).
inline Vec token_input(const Params& p, const std::vector<int64_t>& tokens, int64_t B, int64_t T, int64_t E,
                       float dropout_p, const ForwardMode& mode, bool rotary = false) {
  const Vec& we = get(p, "embed.weight");
  const Vec* wp = p.count("pos_embed.weight") ? &get(p, "pos_embed.weight") : nullptr;
  Vec x(static_cast<size_t>(B * T * E));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = 0; c < E; ++c) {
        double pe;
        if (rotary) {
          pe = 0.0;
        } else if (wp) {
          pe = (*wp)[t * E + c];
        } else {
          const double omega = std::pow(10000.0, -2.0 * static_cast<double>(c / 2) / static_cast<double>(E));
          pe = c % 2 == 0 ? std::sin(t * omega) : std::cos(t * omega);
        }
        x[(b * T + t) * E + c] = we[tokens[b * T + t] * E + c] + pe;
      }
  ForwardMode m = mode;
  m.layer = kModelLayer;
  dropout(x, dropout_args(m, DropoutSite::kEmbedding, dropout_p));
  return x;
}

inline Vec causal_lm_logits(const Params& p, const CausalLMConfig& cfg, const std::vector<int64_t>& tokens, int64_t B,
                            int64_t T, const ForwardMode& mode) {
  const Vec x = token_input(p, tokens, B, T, cfg.d_model, cfg.dropout, mode, cfg.positional == PositionalKind::kRotary);
  const Vec h = encoder(p, "encoder.", cfg, cfg.num_layers, B, T, x, Mask::causal(), mode);
  const Vec& W = cfg.tie_head ? get(p, "embed.weight") : get(p, "head.weight");
  return linear(h, B * T, cfg.d_model, W, nullptr, cfg.vocab_size);
}

inline Vec classifier_logits(const Params& p, const ClassifierConfig& cfg, const std::vector<int64_t>& tokens,
                             const std::vector<int64_t>& lengths, int64_t B, int64_t T, const ForwardMode& mode) {
  const int64_t E = cfg.d_model;
  const Vec x = token_input(p, tokens, B, T, E, cfg.dropout, mode);
  const Vec h = encoder(p, "encoder.", cfg, cfg.num_layers, B, T, x, Mask::key_padding(lengths), mode);
  Vec pooled(static_cast<size_t>(B * E), 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < lengths[b]; ++t)
      for (int64_t c = 0; c < E; ++c) pooled[b * E + c] += h[(b * T + t) * E + c] / lengths[b];
  return linear(pooled, B, E, get(p, "classifier.weight"), get(p, "classifier.bias").data(), cfg.num_classes);
}

// Central differences of f() with respect to every element of v (which f reads): step h
// (double precision: truncation O(h²), rounding O(1e-16 / h)).
inline Vec numeric_gradient(const std::function<double()>& f, Vec& v, double h = 1e-6) {
  Vec g(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    const double saved = v[i];
    v[i] = saved + h;
    const double up = f();
    v[i] = saved - h;
    const double down = f();
    v[i] = saved;
    g[i] = (up - down) / (2 * h);
  }
  return g;
}

// Σ w ⊙ y: the scalar whose gradient with respect to y is w.
inline double dot(const Vec& w, const Vec& y) {
  double s = 0;
  for (size_t i = 0; i < y.size(); ++i) s += w[i] * y[i];
  return s;
}

}  // namespace cabm::test::ref
