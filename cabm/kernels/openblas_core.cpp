#include "cabm/kernels/openblas_core.h"

#include <cblas.h>
#include <strings.h>

namespace cabm {

std::string openblas_core() {
  const char* name = openblas_get_corename();
  return name != nullptr ? name : "";
}

const char* openblas_core_to_request(const std::string& core, SimdIsa isa) {
  // OpenBLAS's x86-64 cores whose kernels stop short of AVX2 (its dynamic.c): the fallback first.
  static constexpr const char* kBelowAvx2[] = {"Prescott", "Core2", "Penryn",     "Dunnington",
                                               "Nehalem",  "Atom",  "Sandybridge"};
  bool below = false;
  for (const char* name : kBelowAvx2) below = below || strcasecmp(core.c_str(), name) == 0;
  if (!below) return nullptr;
  switch (isa) {
    case SimdIsa::kAvx512:
      return "SkylakeX";
    case SimdIsa::kAvx2:
      return "Haswell";
    case SimdIsa::kPortable:
      return nullptr;
  }
  return nullptr;
}

}  // namespace cabm
