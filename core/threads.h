// Threading: OpenMP underneath. The thread count comes from --threads, else the environment
// variable CABM_NUM_THREADS, else OpenMP's default. Results never depend on the count beyond
// float rounding (kernels split work, not reductions, across threads where they can).
#pragma once

namespace cabm {

void set_num_threads(int threads);  // >= 1
int num_threads();
// Applies CABM_NUM_THREADS if set; throws cabm::Error naming the variable if it is malformed.
void init_threads_from_env();

}  // namespace cabm
