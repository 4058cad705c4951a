// Running a test on every instruction set of the run-time dispatched kernels (cpu_isa.h): the
// sets this CPU runs, each pinned in turn, and a printed line for each set it lacks.
#pragma once

#include "cabm/kernels/cpu_isa.h"

#include <cstdio>
#include <optional>
#include <vector>

namespace cabm::test {

// Pins the set for a scope (set_simd_isa_override), back to the default after.
struct ScopedSimdIsa {
  explicit ScopedSimdIsa(SimdIsa isa) { set_simd_isa_override(isa); }
  ~ScopedSimdIsa() { set_simd_isa_override(std::nullopt); }
  ScopedSimdIsa(const ScopedSimdIsa&) = delete;
  ScopedSimdIsa& operator=(const ScopedSimdIsa&) = delete;
};

// The instruction sets this CPU runs, narrowest first; the others are printed as skipped, naming
// `kernel` ("decode", "tiled attention", ...).
inline std::vector<SimdIsa> runnable_isas(const char* kernel) {
  std::vector<SimdIsa> isas;
  for (SimdIsa isa : {SimdIsa::kPortable, SimdIsa::kAvx2, SimdIsa::kAvx512}) {
    if (cpu_supports(isa)) {
      isas.push_back(isa);
    } else {
      std::printf("skipped: the %s %s kernel (this CPU lacks %s)\n", simd_isa_name(isa), kernel, simd_isa_name(isa));
    }
  }
  return isas;
}

}  // namespace cabm::test
