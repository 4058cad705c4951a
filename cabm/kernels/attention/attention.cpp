#include "cabm/kernels/attention/attention.h"

#include "cabm/kernels/attention/flash_bf16.h"
#include "cabm/kernels/bf16.h"

#include <cmath>
#include <vector>

namespace cabm {
namespace {

// Whether a tiled kernel takes these variants itself (sinks are applied around them, below).
bool tiled_supports(const Tensor& q, const Tensor& k, const AttentionOptions& options, bool backward) {
  if (q.dtype() == DType::BF16) return flash_bf16_supports_variants(q.size(2), k.size(2), options, backward);
  return flash_supports_variants(q.size(2), k.size(2), options);
}

// lse' = log(e^lse + e^σ_h) and out · e^(lse − lse') per row; fully masked rows (lse −inf) stay
// 0 with lse −inf.
void fold_sinks(const Tensor& sinks, const Tensor& out, const Tensor& lse) {
  const int64_t B = out.size(0), N = out.size(1), H = out.size(2), dv = out.size(3);
  const float* sp = sinks.data<float>();
  float* lp = lse.data<float>();
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t i = 0; i < N; ++i) {
        float& l = lp[(b * H + h) * N + i];
        if (l == -INFINITY || sp[h] == -INFINITY) continue;
        const float m = std::max(l, sp[h]);
        const float folded = m + std::log(std::exp(l - m) + std::exp(sp[h] - m));
        const float factor = std::exp(l - folded);
        float* o = out.data<float>() + b * out.stride(0) + i * out.stride(1) + h * out.stride(2);
        for (int64_t c = 0; c < dv; ++c) o[c] *= factor;
        l = folded;
      }
    }
  }
}

// dsinks[h] = −Σ_{b,i} e^(σ_h − lse'_i) (dO_i · O_i), summed in a fixed order.
void sink_gradient(const AttentionSaved& saved, const Tensor& dout, const Tensor& sinks, const Tensor& dsinks) {
  const Tensor& out = saved.out;
  const int64_t B = out.size(0), N = out.size(1), H = out.size(2), dv = out.size(3);
  CABM_CHECK(dsinks.dtype() == DType::F32 && dsinks.shape() == (Shape{H}) && dsinks.is_contiguous(),
             "attention backward: dsinks must be a contiguous F32 [{}] tensor", H);
  const float* sp = sinks.data<float>();
  const float* lp = saved.lse.data<float>();
  std::vector<double> parts(static_cast<size_t>(B * H), 0.0);
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      double total = 0.0;
      for (int64_t i = 0; i < N; ++i) {
        const float l = lp[(b * H + h) * N + i];
        if (l == -INFINITY) continue;
        const float* o = out.data<float>() + b * out.stride(0) + i * out.stride(1) + h * out.stride(2);
        const float* g = dout.data<float>() + b * dout.stride(0) + i * dout.stride(1) + h * dout.stride(2);
        float D = 0.0f;
        for (int64_t c = 0; c < dv; ++c) D += g[c] * o[c];
        total -= static_cast<double>(std::exp(sp[h] - l)) * D;
      }
      parts[b * H + h] = total;
    }
  }
  for (int64_t h = 0; h < H; ++h) {
    double total = 0.0;
    for (int64_t b = 0; b < B; ++b) total += parts[b * H + h];
    dsinks.data<float>()[h] = static_cast<float>(total);
  }
}

}  // namespace

AttentionKernel attention_forward_kernel(const Tensor& q, const Tensor& k, const AttentionOptions& options) {
  if (attention_decode_supports(q, k, options)) return AttentionKernel::kDecode;
  if (!tiled_supports(q, k, options, false)) return AttentionKernel::kReference;
  return q.dtype() == DType::BF16 ? AttentionKernel::kFlashBf16 : AttentionKernel::kFlash;
}

AttentionKernel attention_backward_kernel(const AttentionSaved& saved, const AttentionOptions& options) {
  if (!tiled_supports(saved.q, saved.k, options, true)) return AttentionKernel::kReference;
  if (saved.q.dtype() == DType::BF16) return AttentionKernel::kFlashBf16;
  return saved.lse.defined() ? AttentionKernel::kFlash : AttentionKernel::kReference;
}

void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& options,
                       const Tensor& out, const Tensor* lse) {
  CABM_CHECK(q.dtype() == k.dtype() && q.dtype() == v.dtype() && (q.dtype() == DType::F32 || q.dtype() == DType::BF16),
             "attention: q, k, v must all be F32 or all BF16, got {}, {}, {}", dtype_name(q.dtype()),
             dtype_name(k.dtype()), dtype_name(v.dtype()));
  CABM_CHECK(q.dim() == 4 && k.dim() == 4, "attention: q and k must be of rank 4");
  const AttentionKernel kernel = attention_forward_kernel(q, k, options);
  if (kernel == AttentionKernel::kReference)
    return attention_reference_forward(widened_to_f32(q), widened_to_f32(k), widened_to_f32(v), options, out, nullptr,
                                       lse);
  check_attention_variants(options, q.size(2), q.size(1), k.size(1));
  // Sinks: the tiled kernels run without them and the result is folded here (needs the lse).
  Tensor own_lse;
  const Tensor* kernel_lse = lse;
  if (options.sinks.defined() && !lse) {
    own_lse = Tensor::empty({q.size(0), q.size(2), q.size(1)});
    kernel_lse = &own_lse;
  }
  if (kernel == AttentionKernel::kDecode) attention_decode_forward(q, k, v, options, out, kernel_lse);
  else if (kernel == AttentionKernel::kFlashBf16) attention_flash_bf16_forward(q, k, v, options, out, kernel_lse);
  else attention_flash_forward(q, k, v, options, out, kernel_lse);
  if (options.sinks.defined()) fold_sinks(options.sinks, out, *kernel_lse);
}

void attention_backward(const AttentionSaved& saved, const Tensor& dout, const AttentionOptions& options,
                        const AttentionGrads& grads) {
  switch (attention_backward_kernel(saved, options)) {
    case AttentionKernel::kFlashBf16:
      CABM_CHECK(saved.lse.defined(), "attention_backward: bf16 operands need the forward's lse");
      attention_flash_bf16_backward(saved, dout, options, grads);
      break;
    case AttentionKernel::kFlash: attention_flash_backward(saved, dout, options, grads); break;
    case AttentionKernel::kDecode:  // never chosen for a backward
    case AttentionKernel::kReference: {
      const AttentionSaved wide{widened_to_f32(saved.q), widened_to_f32(saved.k), widened_to_f32(saved.v), saved.out,
                                saved.lse};
      return attention_reference_backward(wide, dout, options, grads);
    }
  }
  if (options.sinks.defined() && grads.dsinks.defined()) sink_gradient(saved, dout, options.sinks, grads.dsinks);
}

}  // namespace cabm
