// Software prefetch for the tiled attention kernels (internal to cabm/kernels/attention/): the
// rows of a head are a slice of tensors of megabytes, each row H·d elements from the next, so they
// come from L3 or memory, and at training shapes (N 128, d 32) waiting for them was a large part
// of a call. No vector types: the same code for every instruction set.
#pragma once

#include "cabm/core/tensor.h"
#include "cabm/kernels/attention/reference.h"
#include "cabm/kernels/cpu_isa.h"

#include <algorithm>
#include <cstdint>
#include <vector>

namespace cabm::detail {

// Rows to ask for into L2 a few lines at a time, between the steps of a tile loop. Issued all at
// once, a head's worth of requests (two thousand lines at N 128, d 32) filled the core's miss
// buffers and the loop waited for them: that fp32 backward ran 4-6% faster than without, pumped
// 6-10% (Intel Xeon, session 28).
class RowPrefetch {
 public:
  void clear() {
    ranges_.clear();
    range_ = 0;
    row_ = 0;
    line_ = 0;
  }
  // Rows [0, rows) of `bytes` bytes each, `stride` bytes apart.
  void add(const void* data, int64_t stride, int64_t rows, int64_t bytes) {
    if (rows > 0 && bytes > 0) ranges_.push_back({reinterpret_cast<uintptr_t>(data), stride, rows, bytes});
  }
  // Sets the lines per pump so that `pumps` pumps ask for all the rows added.
  void spread_over(int64_t pumps) {
    int64_t lines = 0;
    for (const Range& r : ranges_) lines += r.rows * ((r.bytes + 63) / 64 + 1);
    per_pump_ = std::max<int64_t>(4, (lines + pumps - 1) / std::max<int64_t>(pumps, 1));
  }
  // Asks for the next lines (fewer at the end).
  void pump() {
    int64_t lines = per_pump_;
    while (lines > 0 && range_ < ranges_.size()) {
      const Range& r = ranges_[range_];
      const uintptr_t first = r.data + static_cast<uintptr_t>(row_ * r.stride);
      const uintptr_t end = first + static_cast<uintptr_t>(r.bytes);
      if (line_ == 0) line_ = first & ~uintptr_t{63};
      for (; line_ < end && lines > 0; line_ += 64, --lines)
        __builtin_prefetch(reinterpret_cast<const void*>(line_), 0, 2);
      if (line_ >= end) {
        line_ = 0;
        if (++row_ == r.rows) {
          row_ = 0;
          ++range_;
        }
      }
    }
  }

 private:
  struct Range {
    uintptr_t data;
    int64_t stride, rows, bytes;
  };
  std::vector<Range> ranges_;
  size_t range_ = 0;
  int64_t row_ = 0, per_pump_ = 16;
  uintptr_t line_ = 0;
};

// The most bytes of a head's rows queue_backward_head asks for: 256 KiB, where it was measured
// (Intel Xeon, 2 MiB of L2 per core, session 28), and at most a quarter of the L2 elsewhere, so
// that the next head's rows and the current head's (as many again) share half of it. On a Zen 3
// (512 KiB) the training shape's heads (N 128, d 32: 128.5 KiB) then go without: unmeasured there.
inline int64_t prefetch_head_bytes() {
  return std::min<int64_t>(256 << 10, cpu_l2_bytes() / 4);
}

// The rows a backward over key/value head (b, hk) reads and writes, queued on `prefetch` (cleared
// first) to be asked for over `pumps` pumps: Q, dO, O, lse and dQ of its `group` query heads, K, V,
// dK and dV; nothing when they exceed prefetch_head_bytes() (long sequences, whose tiles are
// compute-bound, and whose rows would not stay in L2 until used).
inline void queue_backward_head(RowPrefetch& prefetch, const AttentionSaved& saved, const Tensor& dout,
                                const AttentionGrads& grads, int64_t b, int64_t hk, int64_t pumps) {
  prefetch.clear();
  const int64_t N = saved.q.size(1), M = saved.k.size(1), group = saved.q.size(2) / saved.k.size(2);
  const auto head = [&](const Tensor& t, int64_t rows, int64_t h) {
    const int64_t e = static_cast<int64_t>(dtype_size(t.dtype()));
    const char* base = static_cast<const char*>(t.raw_data()) + (b * t.stride(0) + h * t.stride(2)) * e;
    prefetch.add(base, t.stride(1) * e, rows, t.size(3) * e);
  };
  int64_t bytes = 0;
  for (const Tensor* t : {&saved.q, &dout, &saved.out, &grads.dq})
    bytes += group * N * t->size(3) * static_cast<int64_t>(dtype_size(t->dtype()));
  for (const Tensor* t : {&saved.k, &saved.v, &grads.dk, &grads.dv})
    bytes += M * t->size(3) * static_cast<int64_t>(dtype_size(t->dtype()));
  if (bytes + group * N * 4 > prefetch_head_bytes()) return;
  head(saved.k, M, hk);
  head(saved.v, M, hk);
  for (int64_t u = 0; u < group; ++u) {
    const int64_t h = hk * group + u;
    head(saved.q, N, h);
    head(dout, N, h);
    head(saved.out, N, h);
    prefetch.add(saved.lse.data<float>() + (b * saved.q.size(2) + h) * N, 0, 1, N * 4);
  }
  head(grads.dk, M, hk);
  head(grads.dv, M, hk);
  for (int64_t u = 0; u < group; ++u) head(grads.dq, N, hk * group + u);
  prefetch.spread_over(pumps);
}

// Asks for rows [0, rows) of `cols` floats, `stride` floats apart, to come into L1 for writing:
// the forward's tile of out, cold by the time the tile ends. Written then, each line waits for its
// fill; asked for when the tile starts, they arrive during its products. (Timed in place in a
// backward at N 128, d 32 for its dk and dv rows: 8,000-9,000 cycles per 32-key tile without,
// 1,100-1,200 with; Intel Xeon, session 28.)
inline void prefetch_rows_for_write(float* data, int64_t stride, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    const uintptr_t first = reinterpret_cast<uintptr_t>(data + r * stride);
    for (uintptr_t line = first & ~uintptr_t{63}; line < first + static_cast<uintptr_t>(cols * 4); line += 64)
      __builtin_prefetch(reinterpret_cast<const void*>(line), 1, 3);
  }
}

}  // namespace cabm::detail
