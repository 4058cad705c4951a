#include "cabm/kernels/rope.h"

#include <algorithm>
#include <cmath>

namespace cabm {

RopeStyle parse_rope_style(const std::string& name) {
  if (name == "none") return RopeStyle::kNone;
  if (name == "neox") return RopeStyle::kNeox;
  if (name == "gptj") return RopeStyle::kGptj;
  throw Error(fmt::format("rope: unknown layout '{}' (expected none, neox or gptj)", name));
}

const char* rope_style_name(RopeStyle style) {
  switch (style) {
    case RopeStyle::kNone: return "none";
    case RopeStyle::kNeox: return "neox";
    case RopeStyle::kGptj: return "gptj";
  }
  return "?";
}

int64_t rope_resolved_dim(const RopeOptions& options, int64_t d) {
  if (!(options.theta > 0.0f) || !std::isfinite(options.theta))
    throw Error(fmt::format("rope: theta must be a finite number > 0, got {}", options.theta));
  const int64_t rd = options.rope_dim == 0 ? d : options.rope_dim;
  if (rd < 0 || rd > d || rd % 2 != 0)
    throw Error(fmt::format("rope: rope_dim must be even and between 2 and the head dim {}, got {}", d, rd));
  return rd;
}

namespace {

// Rotates every row of x by the angles of its position; sign −1 rotates back.
void rotate(const Tensor& x, const std::vector<int64_t>& positions, const RopeOptions& options, float sign) {
  CABM_CHECK(x.defined() && x.dtype() == DType::F32 && x.dim() == 4 && x.stride(3) == 1,
             "rope: x must be an F32 [B, L, H, d] tensor with unit last stride");
  const int64_t B = x.size(0), L = x.size(1), H = x.size(2), d = x.size(3);
  CABM_CHECK(static_cast<int64_t>(positions.size()) == L, "rope: {} positions for {} rows", positions.size(), L);
  if (options.style == RopeStyle::kNone) return;
  const int64_t rd = rope_resolved_dim(options, d), pairs = rd / 2;
  if (pairs == 0) return;
  // inv_freq in float as Hugging Face computes it: exponent 2p / rd in float, θ^exponent rounded.
  std::vector<float> inv_freq(static_cast<size_t>(pairs));
  for (int64_t p = 0; p < pairs; ++p) {
    const float exponent = static_cast<float>(2 * p) / static_cast<float>(rd);
    inv_freq[p] = 1.0f / static_cast<float>(std::pow(static_cast<double>(options.theta), exponent));
  }
  // A tiny θ makes θ^(−2p/rd), or position × that, overflow float: the rotation would be NaN and the
  // attention silently masked. Refused here, before any row is touched.
  int64_t max_position = 0;
  for (int64_t t : positions) max_position = std::max<int64_t>(max_position, t < 0 ? -t : t);
  for (int64_t p = 0; p < pairs; ++p)
    if (!std::isfinite(inv_freq[p]) ||
        static_cast<double>(max_position) * static_cast<double>(inv_freq[p]) > 3.0e38)
      throw Error(fmt::format("rope: theta {} makes the rotary angles overflow float at position {} (theta^(-2p/{}) "
                              "= {})",
                              options.theta, max_position, rd, inv_freq[p]));
  const int64_t a_step = options.style == RopeStyle::kNeox ? 1 : 2;         // element a of pair p: p·a_step
  const int64_t b_offset = options.style == RopeStyle::kNeox ? pairs : 1;  // element b: a + b_offset
#pragma omp parallel
  {
    std::vector<float> cs(static_cast<size_t>(2 * pairs));  // cos, sin of one position
#pragma omp for schedule(static)
    for (int64_t t = 0; t < L; ++t) {
      for (int64_t p = 0; p < pairs; ++p) {
        const float angle = static_cast<float>(positions[t]) * inv_freq[p];
        cs[2 * p] = static_cast<float>(std::cos(static_cast<double>(angle)));
        cs[2 * p + 1] = sign * static_cast<float>(std::sin(static_cast<double>(angle)));
      }
      for (int64_t b = 0; b < B; ++b) {
        for (int64_t h = 0; h < H; ++h) {
          float* row = x.data<float>() + b * x.stride(0) + t * x.stride(1) + h * x.stride(2);
          for (int64_t p = 0; p < pairs; ++p) {
            float& xa = row[p * a_step];
            float& xb = row[p * a_step + b_offset];
            const float c = cs[2 * p], s = cs[2 * p + 1];
            const float a = xa, bb = xb;
            xa = a * c - bb * s;
            xb = bb * c + a * s;
          }
        }
      }
    }
  }
}

}  // namespace

void rope_forward(const Tensor& x, const std::vector<int64_t>& positions, const RopeOptions& options) {
  rotate(x, positions, options, 1.0f);
}

void rope_backward(const Tensor& dx, const std::vector<int64_t>& positions, const RopeOptions& options) {
  rotate(dx, positions, options, -1.0f);
}

}  // namespace cabm
