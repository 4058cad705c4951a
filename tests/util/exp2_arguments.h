// Arguments for the tests of the bf16 weights' exponential (detail::exp2_weight and its vector
// versions): x over the exponents P sees (x − m' <= 0, a rounding above 0 included), dense near 0,
// at the switch points of floor (integers) and of the old round-to-nearest (halves), through
// (−½, 0), where x − floor(x) is inexact and rounded down (the bits below 2^−24 of x), then the
// edges; padded to a multiple of 16 (one AVX-512 vector).
#pragma once

#include <cmath>
#include <vector>

namespace cabm::test {

inline std::vector<float> exp2_weight_arguments() {
  std::vector<float> xs;
  for (float x = -130.0f; x <= 0.25f; x += 0.000731f) xs.push_back(x);
  for (int n = -127; n <= 1; ++n)
    for (float h : {-0.5f, 0.0f, 0.5f}) {
      const float x = static_cast<float>(n) + h;
      xs.insert(xs.end(), {std::nextafter(x, -INFINITY), x, std::nextafter(x, INFINITY)});
    }
  for (float x = -0.5f; x < 0.0f; x = std::nextafter(x * 0.999f, 0.0f)) xs.push_back(x);
  for (float x = -1e-3f; x < 0.0f; x += 3.7e-7f) xs.push_back(x);
  xs.insert(xs.end(), {-0.0f, 0.0f, 1e-30f, -1e-30f, -126.0f, std::nextafter(-126.0f, -INFINITY), -1e30f, -INFINITY});
  while (xs.size() % 16) xs.push_back(-1.0f);
  return xs;
}

}  // namespace cabm::test
