#include "cabm/kernels/attention_reference.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

namespace cabm {

float attention_scale(const AttentionOptions& options, int64_t d) {
  return options.scale ? *options.scale : 1.0f / std::sqrt(static_cast<float>(d));
}

void check_attention_shapes(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out) {
  for (const Tensor* t : {&q, &k, &v, &out}) {
    if (!t->defined() || t->dim() != 4 || t->dtype() != DType::F32)
      throw Error("attention: q, k, v and out must be F32 tensors of rank 4 ([B, N, H, d])");
    if (t->stride(3) != 1) throw Error("attention: the last (head-dim) axis must have stride 1");
  }
  const int64_t B = q.size(0), N = q.size(1), H = q.size(2), d = q.size(3);
  const int64_t M = k.size(1), dv = v.size(3);
  if (k.size(0) != B || k.size(2) != H || k.size(3) != d)
    throw Error(fmt::format("attention: k has shape {}, expected [{}, M, {}, {}]", shape_str(k.shape()), B, H, d));
  if (v.size(0) != B || v.size(1) != M || v.size(2) != H)
    throw Error(fmt::format("attention: v has shape {}, expected [{}, {}, {}, dv]", shape_str(v.shape()), B, M, H));
  if (out.shape() != Shape{B, N, H, dv})
    throw Error(fmt::format("attention: out has shape {}, expected {}", shape_str(out.shape()),
                            shape_str({B, N, H, dv})));
}

void attention_reference_forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& options,
                                 const Tensor& out, const Tensor* weights, const Tensor* lse) {
  check_attention_shapes(q, k, v, out);
  const int64_t B = q.size(0), N = q.size(1), H = q.size(2), d = q.size(3);
  const int64_t M = k.size(1), dv = v.size(3);
  if (weights)
    CABM_CHECK(weights->shape() == (Shape{B, H, N, M}) && weights->is_contiguous(), "weights must be [B, H, N, M]");
  if (lse) CABM_CHECK(lse->shape() == (Shape{B, H, N}) && lse->is_contiguous(), "lse must be [B, H, N]");
  CABM_CHECK(options.dropout >= 0.0f && options.dropout < 1.0f, "dropout {} outside [0, 1)", options.dropout);
  const ResolvedMask mask(options.mask, B, H, N, M);
  const float scale = attention_scale(options, d);
  const float keep_scale = 1.0f / (1.0f - options.dropout);

  const float* qp = q.data<float>();
  const float* kp = k.data<float>();
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
          // s = mask row, then s += scale · q_i · k_j where the mask allows.
          mask.fill_row(b, h, i, s.data());
          const float* qi = qp + b * q.stride(0) + i * q.stride(1) + h * q.stride(2);
          float row_max = -INFINITY;
          for (int64_t j = 0; j < M; ++j) {
            if (s[j] == -INFINITY) continue;
            const float* kj = kp + b * k.stride(0) + j * k.stride(1) + h * k.stride(2);
            float dot = 0.0f;
            for (int64_t c = 0; c < d; ++c) dot += qi[c] * kj[c];
            s[j] += dot * scale;
            row_max = std::max(row_max, s[j]);
          }
          // Softmax with the maximum subtracted; a row with no finite score stays all zero.
          float sum = 0.0f;
          for (int64_t j = 0; j < M; ++j) {
            s[j] = row_max == -INFINITY ? 0.0f : std::exp(s[j] - row_max);
            sum += s[j];
          }
          const float inv_sum = sum > 0.0f ? 1.0f / sum : 0.0f;
          for (int64_t j = 0; j < M; ++j) {
            s[j] *= inv_sum;
            if (options.dropout > 0.0f)
              s[j] = attention_dropout_keep(options, b, h, H, i, j, M) ? s[j] * keep_scale : 0.0f;
          }
          if (lp) lp[(b * H + h) * N + i] = row_max == -INFINITY ? -INFINITY : row_max + std::log(sum);
          if (wp) std::copy(s.begin(), s.end(), wp + ((b * H + h) * N + i) * M);
          // o_i = Σ_j A[i, j] v_j
          float* oi = op + b * out.stride(0) + i * out.stride(1) + h * out.stride(2);
          for (int64_t c = 0; c < dv; ++c) oi[c] = 0.0f;
          for (int64_t j = 0; j < M; ++j) {
            if (s[j] == 0.0f) continue;
            const float* vj = vp + b * v.stride(0) + j * v.stride(1) + h * v.stride(2);
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

void check_attention_backward_shapes(const AttentionSaved& saved, const Tensor& dout, const AttentionGrads& grads) {
  check_attention_shapes(saved.q, saved.k, saved.v, saved.out);
  const auto check_like = [](const Tensor& t, const Tensor& like, const char* name) {
    if (!t.defined() || t.dtype() != DType::F32 || t.shape() != like.shape() || t.stride(3) != 1)
      throw Error(fmt::format("attention backward: {} must be an F32 tensor of shape {} with unit last stride", name,
                              shape_str(like.shape())));
  };
  check_like(dout, saved.out, "dout");
  check_like(grads.dq, saved.q, "dq");
  check_like(grads.dk, saved.k, "dk");
  check_like(grads.dv, saved.v, "dv");
  if (saved.lse.defined()) {
    const Shape expected = {saved.q.size(0), saved.q.size(2), saved.q.size(1)};
    if (saved.lse.dtype() != DType::F32 || saved.lse.shape() != expected || !saved.lse.is_contiguous())
      throw Error(fmt::format("attention backward: lse has shape {}, expected contiguous F32 {}",
                              shape_str(saved.lse.shape()), shape_str(expected)));
  }
}

// Backward of one softmax row (Vaswani et al. 2017 forward; the chain rule through softmax):
//   s_j = scale · q_i·k_j + bias_ij (−inf where blocked)    p = softmax(s)
//   z_j = keep_ij / (1 − p_drop) (1 without dropout)        a_j = p_j z_j    o_i = Σ_j a_j v_j
// With g = dL/do_i:
//   dL/dv_j += a_j g
//   dP_j := dL/dp_j = z_j (g · v_j)
//   dS_j := dL/ds_j = p_j (dP_j − Σ_l p_l dP_l),   and Σ_l p_l dP_l = g · Σ_l a_l v_l = g · o_i =: D_i
//   dL/dq_i = scale Σ_j dS_j k_j,   dL/dk_j += scale dS_j q_i
// A fully masked row has p = 0, hence no gradient at all.
void attention_reference_backward(const AttentionSaved& saved, const Tensor& dout, const AttentionOptions& options,
                                  const AttentionGrads& grads) {
  check_attention_backward_shapes(saved, dout, grads);
  const Tensor &q = saved.q, &k = saved.k, &v = saved.v, &out = saved.out;
  const int64_t B = q.size(0), N = q.size(1), H = q.size(2), d = q.size(3);
  const int64_t M = k.size(1), dv = v.size(3);
  CABM_CHECK(options.dropout >= 0.0f && options.dropout < 1.0f, "dropout {} outside [0, 1)", options.dropout);
  const ResolvedMask mask(options.mask, B, H, N, M);
  const float scale = attention_scale(options, d);
  const float keep_scale = 1.0f / (1.0f - options.dropout);

  const auto row = [](const Tensor& t, int64_t b, int64_t i, int64_t h) {
    return t.data<float>() + b * t.stride(0) + i * t.stride(1) + h * t.stride(2);
  };

  // Heads are independent; within a head dk and dv accumulate over the rows, so one thread owns a head.
#pragma omp parallel
  {
    std::vector<float> s(static_cast<size_t>(M));   // S[b, h, i, :], then P
    std::vector<float> z(static_cast<size_t>(M));   // dropout factors of the row
#pragma omp for collapse(2) schedule(static)
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t h = 0; h < H; ++h) {
        const DropoutMatrix dropout(options, b, h, H, M);
        for (int64_t j = 0; j < M; ++j) {
          std::fill_n(row(grads.dk, b, j, h), d, 0.0f);
          std::fill_n(row(grads.dv, b, j, h), dv, 0.0f);
        }
        for (int64_t i = 0; i < N; ++i) {
          const float* qi = row(q, b, i, h);
          const float* gi = row(dout, b, i, h);
          float* dqi = row(grads.dq, b, i, h);
          std::fill_n(dqi, d, 0.0f);
          // p = softmax(scale · q_i Kᵀ + mask row), as in the forward.
          mask.fill_row(b, h, i, s.data());
          float row_max = -INFINITY;
          for (int64_t j = 0; j < M; ++j) {
            if (s[j] == -INFINITY) continue;
            const float* kj = row(k, b, j, h);
            float dot = 0.0f;
            for (int64_t c = 0; c < d; ++c) dot += qi[c] * kj[c];
            s[j] += dot * scale;
            row_max = std::max(row_max, s[j]);
          }
          if (row_max == -INFINITY) continue;  // fully masked row: no gradient
          float sum = 0.0f;
          for (int64_t j = 0; j < M; ++j) {
            s[j] = std::exp(s[j] - row_max);
            sum += s[j];
          }
          for (int64_t j = 0; j < M; ++j) s[j] /= sum;
          if (options.dropout > 0.0f) dropout.fill_row(i, 0, M, keep_scale, z.data(), 1);
          else std::fill(z.begin(), z.end(), 1.0f);

          float D = 0.0f;  // D_i = g · o_i
          const float* oi = row(out, b, i, h);
          for (int64_t c = 0; c < dv; ++c) D += gi[c] * oi[c];
          for (int64_t j = 0; j < M; ++j) {
            if (s[j] == 0.0f) continue;
            const float* vj = row(v, b, j, h);
            const float* kj = row(k, b, j, h);
            float* dvj = row(grads.dv, b, j, h);
            float* dkj = row(grads.dk, b, j, h);
            float g_dot_v = 0.0f;
            for (int64_t c = 0; c < dv; ++c) g_dot_v += gi[c] * vj[c];
            const float a = s[j] * z[j];
            for (int64_t c = 0; c < dv; ++c) dvj[c] += a * gi[c];
            const float ds = s[j] * (z[j] * g_dot_v - D);
            for (int64_t c = 0; c < d; ++c) {
              dqi[c] += scale * ds * kj[c];
              dkj[c] += scale * ds * qi[c];
            }
          }
        }
      }
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
