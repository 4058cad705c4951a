// Helpers shared by the tests: random tensors, comparisons with tolerances, a scoped thread count.
#pragma once

#include "core/rng.h"
#include "core/tensor.h"

#include <gtest/gtest.h>

#include <string>

namespace cabm::test {

// Uniform in [lo, hi), deterministic in seed.
Tensor random_tensor(const Shape& shape, uint64_t seed, float lo = -1.0f, float hi = 1.0f);

// max |a − b| and whether every element satisfies |a − b| <= atol + rtol·|b| (torch.allclose
// semantics, NaN equal only to NaN). Shapes must match.
struct Comparison {
  bool ok = true;
  double max_abs_diff = 0;
  std::string first_bad;  // "index 12: 0.5 vs 0.6"
};
Comparison compare(const Tensor& actual, const Tensor& expected, double rtol, double atol);

#define EXPECT_CLOSE(actual, expected, rtol, atol)                                              \
  do {                                                                                          \
    const auto cmp_ = ::cabm::test::compare((actual), (expected), (rtol), (atol));              \
    EXPECT_TRUE(cmp_.ok) << "max |diff| " << cmp_.max_abs_diff << "; first mismatch " << cmp_.first_bad; \
  } while (0)

class ScopedThreads {
 public:
  explicit ScopedThreads(int threads);
  ~ScopedThreads();

 private:
  int previous_;
};

std::string fixtures_dir();  // where make_fixtures.py wrote its files
std::string cabm_binary();   // path of the built `cabm` executable
std::string temp_dir();      // a fresh directory for this test process

}  // namespace cabm::test
