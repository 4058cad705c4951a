#include "cabm/kernels/cross_entropy.h"

#include "cabm/core/error.h"
#include "cabm/kernels/softmax.h"

#include <cmath>

namespace cabm {

namespace {
void check_args(const CrossEntropyArgs& args) {
  CABM_CHECK(args.rows >= 0 && args.V > 0, "cross-entropy needs rows >= 0 and V > 0, got {} and {}", args.rows,
             args.V);
  CABM_CHECK(args.label_smoothing >= 0.0f && args.label_smoothing <= 1.0f, "label_smoothing {} outside [0, 1]",
             args.label_smoothing);
}
}  // namespace

CrossEntropyResult cross_entropy_forward(const CrossEntropyArgs& args, const float* logits, int64_t ld,
                                         const int64_t* targets, float* lse) {
  check_args(args);
  const int64_t V = args.V;
  for (int64_t r = 0; r < args.rows; ++r) {
    const int64_t t = targets[r];
    if (t != args.ignore_index && (t < 0 || t >= V))
      throw Error(fmt::format("cross-entropy: target {} of row {} is outside [0, {}) and is not ignore_index {}", t, r,
                              V, args.ignore_index));
  }
  logsumexp_rows(logits, ld, args.rows, V, lse);
  const double eps = args.label_smoothing;
  double total = 0.0;
  int64_t count = 0;
  // −log p[c] = lse − z[c]. Rows summed in order (serial): a loss is a scalar, cheap next to the GEMMs.
  for (int64_t r = 0; r < args.rows; ++r) {
    const int64_t t = targets[r];
    if (t == args.ignore_index) continue;
    const float* z = logits + r * ld;
    double row = (1.0 - eps) * (static_cast<double>(lse[r]) - z[t]);
    if (eps > 0.0) {
      double sum_z = 0.0;
      for (int64_t c = 0; c < V; ++c) sum_z += z[c];
      row += eps / static_cast<double>(V) * (static_cast<double>(V) * lse[r] - sum_z);
    }
    total += row;
    ++count;
  }
  return {count > 0 ? static_cast<float>(total / static_cast<double>(count)) : 0.0f, count};
}

void cross_entropy_backward(const CrossEntropyArgs& args, const float* logits, int64_t ld, const int64_t* targets,
                            const float* lse, int64_t count, float scale, float* dlogits, int64_t d_ld) {
  check_args(args);
  const int64_t V = args.V;
  const float eps = args.label_smoothing;
  const float row_scale = count > 0 ? scale / static_cast<float>(count) : 0.0f;
  const float smooth = eps / static_cast<float>(V);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < args.rows; ++r) {
    const float* z = logits + r * ld;
    float* dz = dlogits + r * d_ld;
    const int64_t t = targets[r];
    if (t == args.ignore_index || count == 0) {
      for (int64_t c = 0; c < V; ++c) dz[c] = 0.0f;
      continue;
    }
    // p[c] − (1 − ε)[c = t] − ε/V, scaled. z[c] is read before dz[c] is written (aliasing).
    for (int64_t c = 0; c < V; ++c) dz[c] = (std::exp(z[c] - lse[r]) - smooth) * row_scale;
    dz[t] -= (1.0f - eps) * row_scale;
  }
}

}  // namespace cabm
