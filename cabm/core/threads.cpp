#include "cabm/core/threads.h"

#include "cabm/core/checked.h"
#include "cabm/core/error.h"

#include <omp.h>

#include <cstdlib>
#include <string>

namespace cabm {

void set_num_threads(int threads) {
  CABM_CHECK(threads >= 1, "thread count must be at least 1, got {}", threads);
  omp_set_num_threads(threads);
}

int num_threads() { return omp_get_max_threads(); }

void init_threads_from_env() {
  const char* value = std::getenv("CABM_NUM_THREADS");
  if (value == nullptr || *value == '\0') return;
  set_num_threads(static_cast<int>(parse_integer(value, 1, kMaxThreads, "CABM_NUM_THREADS")));
}

}  // namespace cabm
