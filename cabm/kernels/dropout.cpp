#include "cabm/kernels/dropout.h"

#include "cabm/core/error.h"

#include <algorithm>

namespace cabm {

void dropout_forward(const DropoutArgs& args, const float* x, float* y, int64_t n) {
  if (!args.active()) {
    if (x != y) std::copy(x, x + n, y);
    return;
  }
  CABM_CHECK(args.p < 1.0f, "dropout probability {} must be below 1", args.p);
  const float keep_scale = 1.0f / (1.0f - args.p);
  // One Philox block gives the uniforms of four consecutive elements.
  const int64_t blocks = (n + 3) / 4;
#pragma omp parallel for schedule(static)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const std::array<float, 4> u = uniform4(args.seed, args.stream, static_cast<uint64_t>(blk));
    for (int64_t lane = 0; lane < 4; ++lane) {
      const int64_t i = blk * 4 + lane;
      if (i < n) y[i] = u[lane] >= args.p ? x[i] * keep_scale : 0.0f;
    }
  }
}

}  // namespace cabm
