// Threading: OpenMP underneath. The thread count comes from --threads, else the environment
// variable CABM_NUM_THREADS, else OpenMP's default. Results never depend on the count beyond
// float rounding (kernels split work, not reductions, across threads where they can).
#pragma once

#include <algorithm>
#include <cstdint>

namespace cabm {

inline constexpr int kMaxThreads = 4096;  // the most --threads / CABM_NUM_THREADS accept

void set_num_threads(int threads);  // >= 1
int num_threads();
// Applies CABM_NUM_THREADS if set; throws cabm::Error naming the variable if it is malformed.
void init_threads_from_env();

// body(begin, end) over [0, n) in blocks of `block` items (the last may be shorter), the blocks
// shared among the threads in contiguous runs (static schedule). One block runs on the calling
// thread without a parallel region: element-wise kernels pick `block` so that a block is worth
// more than a fork-join (tens of microseconds), and tiny buffers never wake the other threads.
// The split depends only on n and block, never on the thread count.
template <typename Body>
void parallel_for_blocks(int64_t n, int64_t block, const Body& body) {
  if (n <= 0) return;
  const int64_t blocks = (n + block - 1) / block;
  if (blocks == 1) return body(int64_t{0}, n);
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < blocks; ++b) body(b * block, std::min(n, (b + 1) * block));
}

}  // namespace cabm
