// The run-time dispatched LayerNorm row kernels (layernorm_body.h) on every instruction set this CPU
// runs (util/simd_isas.h; the others print why they are skipped) against the plain reference
// (layernorm_forward_reference / layernorm_backward_reference): row lengths with partial vectors,
// strided rows, absent weight or bias, large and non-finite inputs; add_layernorm_forward the same
// bits as layernorm_forward on the explicit sum; and the same bits for both thread counts. The sets
// sum a row in double in different orders, so they agree with the reference to float rounding of the
// statistics: a few ulps of the output's scale.
#include "cabm/kernels/cpu_isa.h"
#include "cabm/kernels/layernorm.h"
#include "util/simd_isas.h"
#include "util/test_util.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

namespace cabm {
namespace {

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  // (memcmp must not see the null data() of empty vectors: UBSan)
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// scale: the size of the terms that make an output (1 but for dx: rstd · |dy ⊙ w|, whose terms cancel).
void expect_near_all(const char* what, const std::vector<float>& actual, const std::vector<float>& want,
                     double scale = 1.0) {
  ASSERT_EQ(actual.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    if (!std::isfinite(want[i])) {
      EXPECT_TRUE(std::isnan(want[i]) ? std::isnan(actual[i]) : actual[i] == want[i]) << what << " index " << i;
    } else {
      // 16 ulps of the value: the statistics' last bit times |x̂| <= √E, and the ops after them.
      EXPECT_NEAR(actual[i], want[i], 16 * 1.2e-7 * (scale + std::fabs(want[i]))) << what << " index " << i;
    }
  }
}

std::vector<float> random_vec(int64_t n, uint64_t seed, float lo, float hi) {
  if (n == 0) return {};
  return test::random_tensor({n}, seed, lo, hi).to_vector();
}

TEST(LayerNormIsa, EverySetMatchesTheReference) {
  for (int64_t E : {1, 3, 8, 15, 16, 17, 33, 384}) {
    const int64_t rows = 6, ld = E + 5;
    std::vector<float> x = random_vec(rows * ld, 40 + E, -3.0f, 5.0f);
    for (int64_t c = 0; c < E; ++c) x[c] *= 1e18f;                       // row 0: large
    x[ld] = std::numeric_limits<float>::infinity();                      // row 1: inf, so NaN
    if (E > 2) x[2 * ld + 2] = std::numeric_limits<float>::quiet_NaN();  // row 2: NaN
    const std::vector<float> w = random_vec(E, 41, 0.5f, 1.5f), b = random_vec(E, 42, -1.0f, 1.0f);
    const std::vector<float> dy = random_vec(rows * E, 43, -1.0f, 1.0f);
    for (int params = 0; params < 3; ++params) {
      const LayerNormArgs args{rows, E, 1e-5f, params == 1 ? nullptr : w.data(), params == 2 ? nullptr : b.data()};
      std::vector<float> y_ref(rows * E), mean_ref(rows), rstd_ref(rows), dx_ref(rows * E), dw_ref(E, 0.5f),
          db_ref(E, 0.5f);
      layernorm_forward_reference(args, x.data(), ld, y_ref.data(), E, mean_ref.data(), rstd_ref.data());
      // The backward on the finite rows 3.. only (the others' gradients are NaN everywhere).
      const LayerNormArgs tail{rows - 3, E, args.eps, args.weight, args.bias};
      layernorm_backward_reference(tail, x.data() + 3 * ld, ld, mean_ref.data() + 3, rstd_ref.data() + 3,
                                   dy.data() + 3 * E, E, {dx_ref.data(), E, dw_ref.data(), db_ref.data()});
      for (SimdIsa isa : test::runnable_isas("LayerNorm")) {
        const test::ScopedSimdIsa pin(isa);
        SCOPED_TRACE(std::string("isa ") + simd_isa_name(isa) + ", E " + std::to_string(E) + ", params " +
                     std::to_string(params));
        std::vector<float> y(rows * E), mean(rows), rstd(rows), dx(rows * E), dw(E, 0.5f), db(E, 0.5f);
        layernorm_forward(args, x.data(), ld, y.data(), E, mean.data(), rstd.data());
        expect_near_all("y", y, y_ref);
        expect_near_all("mean", mean, mean_ref);
        expect_near_all("rstd", rstd, rstd_ref);
        layernorm_backward(tail, x.data() + 3 * ld, ld, mean.data() + 3, rstd.data() + 3, dy.data() + 3 * E, E,
                           {dx.data(), E, dw.data(), db.data()});
        double dx_scale = 1.0;
        for (int64_t r = 3; r < rows; ++r) dx_scale = std::max<double>(dx_scale, 1.5 * rstd_ref[r]);
        expect_near_all("dx", dx, dx_ref, dx_scale);
        expect_near_all("dweight", dw, dw_ref);
        expect_near_all("dbias", db, db_ref);

        // The fused residual add: the same bits as the sum normalised by layernorm_forward.
        const std::vector<float> branch = random_vec(rows * E, 44, -2.0f, 2.0f);
        std::vector<float> residual(rows * E), sum(rows * E), fused(rows * E), unfused(rows * E);
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t c = 0; c < E; ++c) residual[r * E + c] = x[r * ld + c];
        for (size_t i = 0; i < sum.size(); ++i) sum[i] = residual[i] + (branch[i] + b[i % E]);
        layernorm_forward(args, sum.data(), E, unfused.data(), E, nullptr, nullptr);
        add_layernorm_forward(args, residual.data(), branch.data(), b.data(), fused.data());
        EXPECT_TRUE(same_bits(fused, unfused));
      }
    }
  }
}

TEST(LayerNormIsa, SameBitsForBothThreadCounts) {
  const int64_t rows = 700, E = 101;  // several row blocks, and parallel backward chunks
  const std::vector<float> x = random_vec(rows * E, 50, -2.0f, 3.0f), dy = random_vec(rows * E, 51, -1.0f, 1.0f);
  const std::vector<float> w = random_vec(E, 52, 0.5f, 1.5f), b = random_vec(E, 53, -1.0f, 1.0f);
  const LayerNormArgs args{rows, E, 1e-5f, w.data(), b.data()};
  for (SimdIsa isa : test::runnable_isas("LayerNorm")) {
    const test::ScopedSimdIsa pin(isa);
    SCOPED_TRACE(std::string("isa ") + simd_isa_name(isa));
    std::vector<float> results[2][5];
    for (int threads : {1, 2}) {
      test::ScopedThreads scoped(threads);
      std::vector<float> y(rows * E), mean(rows), rstd(rows), dx(rows * E), dw(E, 0.0f), db(E, 0.0f), fused(rows * E);
      layernorm_forward(args, x.data(), E, y.data(), E, mean.data(), rstd.data());
      layernorm_backward(args, x.data(), E, mean.data(), rstd.data(), dy.data(), E,
                         {dx.data(), E, dw.data(), db.data()});
      add_layernorm_forward(args, x.data(), dy.data(), nullptr, fused.data());
      std::vector<float>* out = results[threads - 1];
      out[0] = y, out[1] = dx, out[2] = dw, out[3] = db, out[4] = fused;
    }
    for (int k = 0; k < 5; ++k) EXPECT_TRUE(same_bits(results[0][k], results[1][k])) << "output " << k;
  }
}

}  // namespace
}  // namespace cabm
