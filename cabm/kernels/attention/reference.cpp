#include "cabm/kernels/attention/reference.h"

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

namespace cabm {

float attention_scale(const AttentionOptions& options, int64_t d) {
  return options.scale ? *options.scale : 1.0f / std::sqrt(static_cast<float>(d));
}

void check_attention_shapes(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, DType operands) {
  const std::pair<const Tensor*, const char*> tensors[] = {{&q, "q"}, {&k, "k"}, {&v, "v"}, {&out, "out"}};
  for (int n = 0; n < 4; ++n) {
    const auto& [t, name] = tensors[n];
    const DType want = n == 3 ? DType::F32 : operands;  // out is F32 for either operand type
    if (!t->defined() || t->dim() != 4 || t->dtype() != want)
      throw Error(fmt::format("attention: {} must be a rank-4 {} tensor ([B, L, H, d]){}", name, dtype_name(want),
                              t->defined() ? fmt::format(", got {} {}", dtype_name(t->dtype()), shape_str(t->shape()))
                                           : std::string(", got an undefined tensor")));
    if (t->stride(3) != 1) throw Error(fmt::format("attention: the last (head-dim) axis of {} must have stride 1", name));
  }
  const int64_t B = q.size(0), N = q.size(1), H = q.size(2), d = q.size(3);
  const int64_t M = k.size(1), Hkv = k.size(2), dv = v.size(3);
  if (k.size(0) != B || k.size(3) != d)
    throw Error(fmt::format("attention: k has shape {}, expected [{}, M, Hkv, {}]", shape_str(k.shape()), B, d));
  if (Hkv < 1 || H % Hkv != 0)
    throw Error(fmt::format("attention: q has {} heads, k and v {}: the query heads must be a multiple of the "
                            "key/value heads",
                            H, Hkv));
  if (v.size(0) != B || v.size(1) != M || v.size(2) != Hkv)
    throw Error(fmt::format("attention: v has shape {}, expected [{}, {}, {}, dv]", shape_str(v.shape()), B, M, Hkv));
  if (out.shape() != Shape{B, N, H, dv})
    throw Error(fmt::format("attention: out has shape {}, expected {}", shape_str(out.shape()),
                            shape_str({B, N, H, dv})));
}

void check_attention_variants(const AttentionOptions& options, int64_t H, int64_t N, int64_t M) {
  if (!(options.softcap >= 0.0f) || !std::isfinite(options.softcap))
    throw Error(fmt::format("attention: softcap must be a finite number >= 0 (0 = off), got {}", options.softcap));
  if (!options.alibi_slopes.empty()) {
    if (static_cast<int64_t>(options.alibi_slopes.size()) != H)
      throw Error(fmt::format("attention: alibi_slopes has {} values, expected one per query head ({})",
                              options.alibi_slopes.size(), H));
    for (float s : options.alibi_slopes)
      if (!std::isfinite(s)) throw Error("attention: alibi_slopes must be finite");
  }
  if (!options.q_positions.empty() && static_cast<int64_t>(options.q_positions.size()) != N)
    throw Error(fmt::format("attention: q_positions has {} values, expected N = {}", options.q_positions.size(), N));
  if (!options.k_positions.empty() && static_cast<int64_t>(options.k_positions.size()) != M)
    throw Error(fmt::format("attention: k_positions has {} values, expected M = {}", options.k_positions.size(), M));
  if (options.sinks.defined()) {
    const Tensor& s = options.sinks;
    if (s.dtype() != DType::F32 || s.shape() != Shape{H} || !s.is_contiguous())
      throw Error(fmt::format("attention: sinks must be a contiguous F32 tensor [{}], got {} {}", H,
                              dtype_name(s.dtype()), shape_str(s.shape())));
    for (int64_t h = 0; h < H; ++h)
      if (std::isnan(s.data<float>()[h]) || s.data<float>()[h] == INFINITY)
        throw Error("attention: sinks must not be NaN or +inf");
  }
}

std::vector<float> alibi_paper_slopes(int64_t H) {
  CABM_CHECK(H >= 1, "alibi_paper_slopes: {} heads", H);
  // Slopes of a power of two n: the geometric sequence starting at 2^(−8/n) with that ratio.
  const auto power_of_two_slopes = [](int64_t n) {
    std::vector<double> slopes(static_cast<size_t>(n));
    const double start = std::exp2(-8.0 / static_cast<double>(n));
    for (int64_t i = 0; i < n; ++i) slopes[i] = std::pow(start, static_cast<double>(i + 1));
    return slopes;
  };
  int64_t closest = 1;
  while (closest * 2 <= H) closest *= 2;
  std::vector<double> slopes = power_of_two_slopes(closest);
  const std::vector<double> doubled = power_of_two_slopes(2 * closest);
  for (int64_t i = 0; static_cast<int64_t>(slopes.size()) < H; i += 2) slopes.push_back(doubled[i]);
  return std::vector<float>(slopes.begin(), slopes.end());
}

namespace {

// One row of scores, exactly as every kernel defines them (the order in attention/reference.h):
//   t_j = scale · q_i·k_j,  t_j → c·tanh(t_j / c) when soft-capped,
//   s_j = t_j − slope_h·|pos_i − pos_j| + additive mask parts,  −inf where a blocking part says so.
class RowScores {
 public:
  RowScores(const AttentionOptions& options, const Tensor& q, const Tensor& k, const ResolvedMask& mask)
      : options_(options), q_(q), k_(k), mask_(mask), N_(q.size(1)), M_(k.size(1)), d_(q.size(3)),
        group_(q.size(2) / k.size(2)), scale_(attention_scale(options, q.size(3))) {}

  // Fills s[0..M) for row (b, h, i) and returns its maximum (−inf for a fully masked row). When
  // cap_grad is non-null it receives dc/dt = 1 − tanh²(t/c) (1 without soft-capping).
  float fill(int64_t b, int64_t h, int64_t i, float* s, float* cap_grad) const {
    mask_.fill_row(b, h, i, s);
    const float* qi = q_.data<float>() + b * q_.stride(0) + i * q_.stride(1) + h * q_.stride(2);
    const int64_t hk = h / group_;
    const float cap = options_.softcap;
    const float slope = options_.alibi_slopes.empty() ? 0.0f : options_.alibi_slopes[h];
    const int64_t qpos = options_.q_positions.empty() ? M_ - N_ + i : options_.q_positions[i];
    float row_max = -INFINITY;
    for (int64_t j = 0; j < M_; ++j) {
      if (s[j] == -INFINITY) continue;
      const float* kj = k_.data<float>() + b * k_.stride(0) + j * k_.stride(1) + hk * k_.stride(2);
      float dot = 0.0f;
      for (int64_t c = 0; c < d_; ++c) dot += qi[c] * kj[c];
      float t = dot * scale_;
      if (cap > 0.0f) {
        const float th = std::tanh(t / cap);
        t = cap * th;
        if (cap_grad) cap_grad[j] = 1.0f - th * th;
      } else if (cap_grad) {
        cap_grad[j] = 1.0f;
      }
      if (slope != 0.0f) {
        const int64_t kpos = options_.k_positions.empty() ? j : options_.k_positions[j];
        t -= slope * static_cast<float>(std::llabs(qpos - kpos));
      }
      s[j] += t;
      row_max = std::max(row_max, s[j]);
    }
    return row_max;
  }

  float scale() const { return scale_; }

 private:
  const AttentionOptions& options_;
  const Tensor &q_, &k_;
  const ResolvedMask& mask_;
  int64_t N_, M_, d_, group_;
  float scale_;
};

float sink_logit(const AttentionOptions& options, int64_t h) {
  return options.sinks.defined() ? options.sinks.data<float>()[h] : -INFINITY;
}

}  // namespace

void attention_reference_forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& options,
                                 const Tensor& out, const Tensor* weights, const Tensor* lse) {
  check_attention_shapes(q, k, v, out);
  const int64_t B = q.size(0), N = q.size(1), H = q.size(2);
  const int64_t M = k.size(1), dv = v.size(3), group = H / k.size(2);
  if (weights)
    CABM_CHECK(weights->shape() == (Shape{B, H, N, M}) && weights->is_contiguous(), "weights must be [B, H, N, M]");
  if (lse) CABM_CHECK(lse->shape() == (Shape{B, H, N}) && lse->is_contiguous(), "lse must be [B, H, N]");
  CABM_CHECK(options.dropout >= 0.0f && options.dropout < 1.0f, "dropout {} outside [0, 1)", options.dropout);
  check_attention_variants(options, H, N, M);
  const ResolvedMask mask(options.mask, B, H, N, M);
  const RowScores scores(options, q, k, mask);
  const float keep_scale = 1.0f / (1.0f - options.dropout);

  const float* vp = v.data<float>();
  float* op = out.data<float>();
  float* wp = weights ? weights->data<float>() : nullptr;
  float* lp = lse ? lse->data<float>() : nullptr;

#pragma omp parallel
  {
    std::vector<float> s(static_cast<size_t>(M));  // one score row: S[b, h, i, :]
#pragma omp for collapse(3) schedule(static)
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t h = 0; h < H; ++h) {
        for (int64_t i = 0; i < N; ++i) {
          const float row_max = scores.fill(b, h, i, s.data(), nullptr);
          // Softmax with the maximum subtracted; the sink joins the denominator only. A row with no
          // finite score stays all zero (whatever its sink).
          const float sink = sink_logit(options, h);
          const float m = std::max(row_max, sink);
          float sum = row_max == -INFINITY ? 0.0f : std::exp(sink - m);
          for (int64_t j = 0; j < M; ++j) {
            s[j] = row_max == -INFINITY ? 0.0f : std::exp(s[j] - m);
            sum += s[j];
          }
          const float inv_sum = row_max == -INFINITY ? 0.0f : 1.0f / sum;
          for (int64_t j = 0; j < M; ++j) {
            s[j] *= inv_sum;
            if (options.dropout > 0.0f)
              s[j] = attention_dropout_keep(options, b, h, H, i, j, M) ? s[j] * keep_scale : 0.0f;
          }
          if (lp) lp[(b * H + h) * N + i] = row_max == -INFINITY ? -INFINITY : m + std::log(sum);
          if (wp) std::copy(s.begin(), s.end(), wp + ((b * H + h) * N + i) * M);
          // o_i = Σ_j A[i, j] v_j
          float* oi = op + b * out.stride(0) + i * out.stride(1) + h * out.stride(2);
          for (int64_t c = 0; c < dv; ++c) oi[c] = 0.0f;
          for (int64_t j = 0; j < M; ++j) {
            if (s[j] == 0.0f) continue;
            const float* vj = vp + b * v.stride(0) + j * v.stride(1) + (h / group) * v.stride(2);
            for (int64_t c = 0; c < dv; ++c) oi[c] += s[j] * vj[c];
          }
        }
      }
    }
  }
}

DropoutMatrix::DropoutMatrix(const AttentionOptions& options, int64_t b, int64_t h, int64_t H, int64_t M)
    : seed_(options.dropout_seed),
      stream_(options.dropout_offset * 0x100000000ull + static_cast<uint64_t>(b * H + h)),
      M_(M),
      p_(options.dropout) {}

void DropoutMatrix::fill_row(int64_t i, int64_t j0, int64_t j1, float value, float* out, int64_t stride) const {
  int64_t j = j0;
  while (j < j1) {
    const uint64_t index = static_cast<uint64_t>(i * M_ + j);
    const std::array<float, 4> u = uniform4(seed_, stream_, index >> 2);
    for (uint64_t lane = index & 3; lane < 4 && j < j1; ++lane, ++j) out[(j - j0) * stride] = u[lane] >= p_ ? value : 0.0f;
  }
}

void check_attention_backward_shapes(const AttentionSaved& saved, const Tensor& dout, const AttentionGrads& grads,
                                     DType operands, bool need_lse) {
  check_attention_shapes(saved.q, saved.k, saved.v, saved.out, operands);
  const auto check_like = [](const Tensor& t, const Tensor& like, const char* name) {
    if (!t.defined() || t.dtype() != DType::F32 || t.shape() != like.shape() || t.stride(3) != 1)
      throw Error(fmt::format("attention backward: {} must be an F32 tensor of shape {} with unit last stride", name,
                              shape_str(like.shape())));
  };
  check_like(dout, saved.out, "dout");
  check_like(grads.dq, saved.q, "dq");
  check_like(grads.dk, saved.k, "dk");
  check_like(grads.dv, saved.v, "dv");
  if (need_lse && !saved.lse.defined())
    throw Error(fmt::format("attention backward: this kernel needs the forward's lse, a contiguous F32 {} tensor",
                            shape_str({saved.q.size(0), saved.q.size(2), saved.q.size(1)})));
  if (saved.lse.defined()) {
    const Shape expected = {saved.q.size(0), saved.q.size(2), saved.q.size(1)};
    if (saved.lse.dtype() != DType::F32 || saved.lse.shape() != expected || !saved.lse.is_contiguous())
      throw Error(fmt::format("attention backward: lse has shape {}, expected contiguous F32 {}",
                              shape_str(saved.lse.shape()), shape_str(expected)));
  }
}

// Backward of one softmax row (Vaswani et al. 2017 forward; the chain rule through softmax):
//   t_j = scale · q_i·k_j → c·tanh(t_j/c)    s_j = t_j + bias_ij (−inf where blocked)
//   p = softmax over (s, σ_h) restricted to the keys (σ_h the sink, if any; it has no value)
//   z_j = keep_ij / (1 − p_drop) (1 without dropout)        a_j = p_j z_j    o_i = Σ_j a_j v_j
// With g = dL/do_i:
//   dL/dv_j += a_j g
//   dP_j := dL/dp_j = z_j (g · v_j)     (dP = 0 for the sink: it contributes no value)
//   dS_j := dL/ds_j = p_j (dP_j − Σ_l p_l dP_l),   and Σ_l p_l dP_l = g · Σ_l a_l v_l = g · o_i =: D_i
//   dL/dσ_h += −p_σ D_i                 (p_σ = exp(σ_h − lse_i), the sink's share of the row)
//   dT_j = dS_j · (1 − tanh²(t_j/c))    (dT_j = dS_j without soft-capping; the bias has no input)
//   dL/dq_i = scale Σ_j dT_j k_j,   dL/dk_j += scale dT_j q_i
// A fully masked row has p = 0, hence no gradient at all. With GQA the query heads of a group are
// visited in order by one thread, which owns the group's dk and dv: sums in a fixed order.
void attention_reference_backward(const AttentionSaved& saved, const Tensor& dout, const AttentionOptions& options,
                                  const AttentionGrads& grads) {
  check_attention_backward_shapes(saved, dout, grads);
  const Tensor &q = saved.q, &k = saved.k, &v = saved.v, &out = saved.out;
  const int64_t B = q.size(0), N = q.size(1), H = q.size(2), d = q.size(3);
  const int64_t M = k.size(1), Hkv = k.size(2), dv = v.size(3), group = H / Hkv;
  CABM_CHECK(options.dropout >= 0.0f && options.dropout < 1.0f, "dropout {} outside [0, 1)", options.dropout);
  check_attention_variants(options, H, N, M);
  const bool want_dsinks = options.sinks.defined() && grads.dsinks.defined();
  if (want_dsinks)
    CABM_CHECK(grads.dsinks.dtype() == DType::F32 && grads.dsinks.shape() == (Shape{H}) && grads.dsinks.is_contiguous(),
               "attention backward: dsinks must be a contiguous F32 [{}] tensor", H);
  const ResolvedMask mask(options.mask, B, H, N, M);
  const RowScores scores(options, q, k, mask);
  const float scale = scores.scale();
  const float keep_scale = 1.0f / (1.0f - options.dropout);
  // dsinks[h] is summed over b and i: per (b, h) partials, added in b order at the end.
  std::vector<double> dsink_parts(static_cast<size_t>(want_dsinks ? B * H : 0), 0.0);

  const auto row = [](const Tensor& t, int64_t b, int64_t i, int64_t h) {
    return t.data<float>() + b * t.stride(0) + i * t.stride(1) + h * t.stride(2);
  };

#pragma omp parallel
  {
    std::vector<float> s(static_cast<size_t>(M));   // S[b, h, i, :], then P
    std::vector<float> z(static_cast<size_t>(M));   // dropout factors of the row
    std::vector<float> cg(static_cast<size_t>(M));  // soft-cap derivative of the row
#pragma omp for collapse(2) schedule(static)
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t hk = 0; hk < Hkv; ++hk) {
        for (int64_t j = 0; j < M; ++j) {
          std::fill_n(row(grads.dk, b, j, hk), d, 0.0f);
          std::fill_n(row(grads.dv, b, j, hk), dv, 0.0f);
        }
        for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
          const DropoutMatrix dropout(options, b, h, H, M);
          const float sink = sink_logit(options, h);
          for (int64_t i = 0; i < N; ++i) {
            const float* qi = row(q, b, i, h);
            const float* gi = row(dout, b, i, h);
            float* dqi = row(grads.dq, b, i, h);
            std::fill_n(dqi, d, 0.0f);
            const float row_max = scores.fill(b, h, i, s.data(), cg.data());
            if (row_max == -INFINITY) continue;  // fully masked row: no gradient
            const float m = std::max(row_max, sink);
            float sum = std::exp(sink - m);
            for (int64_t j = 0; j < M; ++j) {
              s[j] = std::exp(s[j] - m);
              sum += s[j];
            }
            for (int64_t j = 0; j < M; ++j) s[j] /= sum;
            if (options.dropout > 0.0f) dropout.fill_row(i, 0, M, keep_scale, z.data(), 1);
            else std::fill(z.begin(), z.end(), 1.0f);

            float D = 0.0f;  // D_i = g · o_i
            const float* oi = row(out, b, i, h);
            for (int64_t c = 0; c < dv; ++c) D += gi[c] * oi[c];
            if (want_dsinks) dsink_parts[b * H + h] -= static_cast<double>(std::exp(sink - m) / sum) * D;
            for (int64_t j = 0; j < M; ++j) {
              if (s[j] == 0.0f) continue;
              const float* vj = row(v, b, j, hk);
              const float* kj = row(k, b, j, hk);
              float* dvj = row(grads.dv, b, j, hk);
              float* dkj = row(grads.dk, b, j, hk);
              float g_dot_v = 0.0f;
              for (int64_t c = 0; c < dv; ++c) g_dot_v += gi[c] * vj[c];
              const float a = s[j] * z[j];
              for (int64_t c = 0; c < dv; ++c) dvj[c] += a * gi[c];
              const float dt = s[j] * (z[j] * g_dot_v - D) * cg[j];
              for (int64_t c = 0; c < d; ++c) {
                dqi[c] += scale * dt * kj[c];
                dkj[c] += scale * dt * qi[c];
              }
            }
          }
        }
      }
    }
  }
  if (want_dsinks) {
    float* ds = grads.dsinks.data<float>();
    for (int64_t h = 0; h < H; ++h) {
      double total = 0.0;
      for (int64_t b = 0; b < B; ++b) total += dsink_parts[b * H + h];
      ds[h] = static_cast<float>(total);
    }
  }
}

AttentionResult scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                             const AttentionOptions& options, bool need_weights) {
  AttentionResult result;
  result.output = Tensor::empty({q.size(0), q.size(1), q.size(2), v.size(3)});
  if (need_weights) result.weights = Tensor::empty({q.size(0), q.size(2), q.size(1), k.size(1)});
  attention_reference_forward(q, k, v, options, result.output, need_weights ? &result.weights : nullptr);
  return result;
}

}  // namespace cabm
