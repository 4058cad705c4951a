// Which OpenBLAS kernels cabm asks for (kernels/openblas_core.h): the kernels of the CPU's SIMD set
// where OpenBLAS took its generic ones, OpenBLAS's own choice everywhere else.
#include "cabm/kernels/openblas_core.h"

#include <gtest/gtest.h>

#include <string>

namespace cabm {
namespace {

std::string requested(const std::string& core, SimdIsa isa) {
  const char* name = openblas_core_to_request(core, isa);
  return name != nullptr ? name : "(none)";
}

TEST(OpenBlasCore, TheFallbackGetsTheKernelsOfTheCpusSet) {
  EXPECT_EQ(requested("Prescott", SimdIsa::kAvx512), "SkylakeX");
  EXPECT_EQ(requested("Prescott", SimdIsa::kAvx2), "Haswell");
  EXPECT_EQ(requested("PRESCOTT", SimdIsa::kAvx2), "Haswell");
  EXPECT_EQ(requested("Nehalem", SimdIsa::kAvx512), "SkylakeX");
  EXPECT_EQ(requested("Sandybridge", SimdIsa::kAvx2), "Haswell");
  EXPECT_EQ(requested("Core2", SimdIsa::kAvx2), "Haswell");
}

TEST(OpenBlasCore, AChoiceWithAvx2KernelsOrACpuWithoutAvx2Stands) {
  EXPECT_EQ(requested("Prescott", SimdIsa::kPortable), "(none)");  // the CPU runs nothing better
  EXPECT_EQ(requested("Nehalem", SimdIsa::kPortable), "(none)");
  EXPECT_EQ(requested("Haswell", SimdIsa::kAvx512), "(none)");  // OpenBLAS's judgement
  EXPECT_EQ(requested("SkylakeX", SimdIsa::kAvx512), "(none)");
  EXPECT_EQ(requested("Cooperlake", SimdIsa::kAvx512), "(none)");
  EXPECT_EQ(requested("Zen", SimdIsa::kAvx2), "(none)");
  EXPECT_EQ(requested("", SimdIsa::kAvx512), "(none)");
}

TEST(OpenBlasCore, ThisProcessNamesItsKernels) {
  EXPECT_FALSE(openblas_core().empty());
}

}  // namespace
}  // namespace cabm
