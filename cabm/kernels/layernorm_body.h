// The LayerNorm row kernels (layernorm.cpp) compiled once per instruction set:
// layernorm_{avx512,avx2,portable}.cpp include this file inside a `#pragma GCC target` region
// after defining
//   CABM_SIMD_LEVEL          2, 1 or 0: the simd.h flavour (GCC does not define
//                            __AVX512F__ inside such a region, so it is chosen explicitly)
//   CABM_SIMD_NS             that flavour's namespace (simd_avx512, ...): one per set, so that the
//                            inline vector functions of different sets never merge at link time
//   CABM_LAYERNORM_VARIANT   the namespace of this set's row kernels (layernorm_avx512, ...)
// and after including layernorm_item.h, so that every header this code needs is read outside the
// region. Everything here has internal linkage but the row kernels declared in layernorm_item.h.
//
// The sums over a row are in double (exact enough to match PyTorch's Welford to the last float bit
// in practice, and immune to cancellation), written as `omp simd` reductions that the compiler
// vectorises for the region's set; the element-wise parts are simd::Vec code, a row's tail through
// a zero-padded copy. Each set sums in its own fixed order: the same bits on every call and for
// every thread count, within float rounding of the other sets.
#include "cabm/kernels/simd.h"

namespace cabm::CABM_LAYERNORM_VARIANT {
namespace {

namespace simd = ::cabm::CABM_SIMD_NS;
using simd::load_n;
using simd::store_n;
using simd::Vec;

// p[c, c + count), or `fallback` if p is null (an absent weight or bias).
inline Vec load_or(const float* p, int64_t c, int64_t count, Vec fallback) {
  return p ? load_n(p + c, count) : fallback;
}

}  // namespace

void forward_row(const LayerNormArgs& args, const float* x, float* y, float* mean, float* rstd) {
  const int64_t E = args.E;
  double sum = 0.0;
#pragma omp simd reduction(+ : sum)
  for (int64_t c = 0; c < E; ++c) sum += x[c];
  const double mu = sum / static_cast<double>(E);
  double sq = 0.0;
#pragma omp simd reduction(+ : sq)
  for (int64_t c = 0; c < E; ++c) {
    const double centred = x[c] - mu;
    sq += centred * centred;
  }
  const float m = static_cast<float>(mu);
  const float rs = static_cast<float>(1.0 / std::sqrt(sq / static_cast<double>(E) + args.eps));
  const Vec mv = simd::set1(m), rsv = simd::set1(rs), one = simd::set1(1.0f), zero = simd::zero();
  for (int64_t c = 0; c < E; c += simd::kWidth) {
    const int64_t count = std::min<int64_t>(simd::kWidth, E - c);
    const Vec xhat = simd::mul(simd::sub(load_n(x + c, count), mv), rsv);
    const Vec w = load_or(args.weight, c, count, one), b = load_or(args.bias, c, count, zero);
    store_n(y + c, simd::add(simd::mul(xhat, w), b), count);
  }
  if (mean) *mean = m;
  if (rstd) *rstd = rs;
}

void add_row(const float* residual, const float* branch, const float* bias, float* y, int64_t E) {
  const Vec zero = simd::zero();
  for (int64_t c = 0; c < E; c += simd::kWidth) {
    const int64_t count = std::min<int64_t>(simd::kWidth, E - c);
    const Vec b = simd::add(load_n(branch + c, count), load_or(bias, c, count, zero));
    store_n(y + c, simd::add(load_n(residual + c, count), b), count);
  }
}

void backward_row(const LayerNormArgs& args, const float* x, float mean, float rstd, const float* dy, float* dx,
                  float* pw, float* pb) {
  const int64_t E = args.E;
  const float* w = args.weight;
  const Vec mv = simd::set1(mean), rsv = simd::set1(rstd), one = simd::set1(1.0f);
  if (pw) {
    for (int64_t c = 0; c < E; c += simd::kWidth) {
      const int64_t count = std::min<int64_t>(simd::kWidth, E - c);
      const Vec xhat = simd::mul(simd::sub(load_n(x + c, count), mv), rsv), g = load_n(dy + c, count);
      store_n(pw + c, simd::add(load_n(pw + c, count), simd::mul(g, xhat)), count);
      store_n(pb + c, simd::add(load_n(pb + c, count), g), count);
    }
  }
  if (!dx) return;
  // mean(g) and mean(g ⊙ x̂), g = dy ⊙ w, accumulated in double.
  double sum_g = 0.0, sum_gx = 0.0;
#pragma omp simd reduction(+ : sum_g, sum_gx)
  for (int64_t c = 0; c < E; ++c) {
    const float xhat = (x[c] - mean) * rstd;
    const float g = dy[c] * (w ? w[c] : 1.0f);
    sum_g += g;
    sum_gx += static_cast<double>(g) * xhat;
  }
  const Vec mean_g = simd::set1(static_cast<float>(sum_g / static_cast<double>(E)));
  const Vec mean_gx = simd::set1(static_cast<float>(sum_gx / static_cast<double>(E)));
  for (int64_t c = 0; c < E; c += simd::kWidth) {
    const int64_t count = std::min<int64_t>(simd::kWidth, E - c);
    const Vec xhat = simd::mul(simd::sub(load_n(x + c, count), mv), rsv);
    const Vec g = simd::mul(load_n(dy + c, count), load_or(w, c, count, one));
    // dy is read before dx is written (they may alias).
    store_n(dx + c, simd::mul(rsv, simd::sub(simd::sub(g, mean_g), simd::mul(xhat, mean_gx))), count);
  }
}

}  // namespace cabm::CABM_LAYERNORM_VARIANT
