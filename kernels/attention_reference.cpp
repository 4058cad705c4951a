#include "kernels/attention_reference.h"

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

AttentionResult scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                             const AttentionOptions& options, bool need_weights) {
  AttentionResult result;
  result.output = Tensor::empty({q.size(0), q.size(1), q.size(2), v.size(3)});
  if (need_weights) result.weights = Tensor::empty({q.size(0), q.size(2), q.size(1), k.size(1)});
  attention_reference_forward(q, k, v, options, result.output, need_weights ? &result.weights : nullptr);
  return result;
}

}  // namespace cabm
