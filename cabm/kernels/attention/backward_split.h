// The tiled backwards' split of few heads (fp32 family: attention/flash_backward_body.h; bf16 on
// vdpbf16ps and AMX: attention/flash_bf16_backward.cpp). With fewer key/value heads than can
// keep the threads busy, the work items (head hd, key tile kt), n = hd·key_tiles + kt in order,
// are cut into R = backward_split_runs() contiguous runs of equal estimated cost, and thread t of
// T takes runs [t·R/T, (t+1)·R/T). dK and dV have one writer per key tile; dQ of a query row sums
// over every key tile, so each run accumulates its share of a head's dQ from zero, and a head cut
// between runs gets dQ = ((P₀ + P₁) + P₂) + … over its runs' partials in run order, whichever
// thread computed them. R does not depend on T, so neither do the partials nor their order: dQ is
// the same bits for any thread count.
#pragma once

#include "cabm/kernels/attention/flash_detail.h"
#include "cabm/kernels/attention/tile_mask.h"

#include <algorithm>
#include <cstdint>
#include <vector>

namespace cabm::detail {

// What a thread leaves for the others after its runs (split_key_tiles): the head whose sum it
// holds and later threads' runs continue, and its own partials of a head begun in an earlier
// thread's runs, in run order.
struct SplitPartials {
  int64_t open_head = -1;
  int64_t continued_head = -1;
  std::vector<float*> continued;
};

// Whether `heads` key/value heads balance over the processors as whole heads (a multiple of R, or
// at least 4R): then each thread takes whole heads and dQ has one writer per head; else the key
// tiles are split into runs (split_key_tiles). Depends on the processors, never on the threads.
inline bool backward_whole_heads(int64_t heads) {
  const int64_t runs = backward_split_runs();
  return heads % runs == 0 || heads >= 4 * runs;
}

// The floats of `sum` that split_key_tiles needs for thread t of T: the running sum of a head
// begun in its runs, and the partials of a head begun in an earlier thread's runs (at most one
// per run).
inline int64_t split_sum_floats(int t, int T, int64_t acc_floats) {
  const int R = backward_split_runs(), r0 = t * R / T, r1 = (t + 1) * R / T;
  return r0 < r1 ? (1 + (r0 > 0 ? r1 - r0 : 0)) * acc_floats : 0;
}

// prefix[n] (size heads · key_tiles + 1) = the estimated cost of items [0, n) over query rows
// `chunk`: an item costs the chunk's rows that see its key tile (mask.query_range), for each of
// the `group` query heads of its key/value head, + 1 so that empty items count.
inline void split_costs(const TileMask& mask, int64_t heads, int64_t Hkv, int64_t group, int64_t M, int64_t block_k,
                        Range chunk, std::vector<int64_t>& prefix) {
  const int64_t key_tiles = (M + block_k - 1) / block_k;
  for (int64_t n = 0; n < heads * key_tiles; ++n) {
    const int64_t b = n / key_tiles / Hkv, j0 = n % key_tiles * block_k;
    const Range rows = mask.query_range(b, {j0, std::min(M, j0 + block_k)});
    const int64_t seen = std::max<int64_t>(0, std::min(rows.end, chunk.end) - std::max(rows.begin, chunk.begin));
    prefix[static_cast<size_t>(n + 1)] = prefix[static_cast<size_t>(n)] + seen * group + 1;
  }
}

// Thread t's share of the items. prefix[n]: the estimated cost of items [0, n) (size items + 1).
// `dq`: the acc_floats floats the tiles of a head accumulate its dQ into, zeroed by begin(hd);
// tile(hd, kt) runs one item; write(hd, sums) writes a head's dQ from its sums (acc_floats,
// dq's layout); sum: split_sum_floats(t, T, acc_floats) floats of this thread's storage;
// shared[t] for each thread of the team. Called by every thread of the parallel region: it ends
// with two barriers (the partials are complete after the first, read before the second).
template <class Begin, class Tile, class Write>
void split_key_tiles(const std::vector<int64_t>& prefix, int64_t key_tiles, int64_t acc_floats, const float* dq,
                     float* sum, std::vector<SplitPartials>& shared, int t, int T, Begin&& begin, Tile&& tile,
                     Write&& write) {
  const int R = backward_split_runs(), r0 = t * R / T, r1 = (t + 1) * R / T;
  const int64_t total = prefix.back();
  const auto cut = [&](int r) {
    return static_cast<int64_t>(std::lower_bound(prefix.begin(), prefix.end(), total * r / R) - prefix.begin());
  };
  SplitPartials& mine = shared[static_cast<size_t>(t)];
  mine.continued_head = -1;
  mine.continued.clear();
  int64_t sum_head = -1;
  for (int r = r0; r < r1; ++r) {
    const int64_t begin_item = cut(r), end_item = cut(r + 1);
    int64_t head = -1;
    const auto finish_head = [&]() {
      const bool starts = head * key_tiles >= begin_item, ends = (head + 1) * key_tiles <= end_item;
      if (starts && ends) return write(head, dq);
      if (head * key_tiles < cut(r0)) {  // begun by an earlier thread, which adds this in
        float* part = sum + (1 + static_cast<int64_t>(mine.continued.size())) * acc_floats;
        std::copy_n(dq, acc_floats, part);
        mine.continued_head = head;
        mine.continued.push_back(part);
        return;
      }
      if (starts) {
        std::copy_n(dq, acc_floats, sum);
        sum_head = head;
      } else {
        for (int64_t e = 0; e < acc_floats; ++e) sum[e] += dq[e];
      }
      if (ends) {
        write(head, sum);
        sum_head = -1;
      }
    };
    for (int64_t n = begin_item; n < end_item; ++n) {
      if (n / key_tiles != head) {
        if (head >= 0) finish_head();
        head = n / key_tiles;
        begin(head);
      }
      tile(head, n % key_tiles);
    }
    if (head >= 0) finish_head();
  }
  mine.open_head = sum_head;
#pragma omp barrier
  // A head continued by later threads: their partials added in thread and run order.
  if (mine.open_head >= 0) {
    for (int u = t + 1; u < T; ++u) {
      const SplitPartials& other = shared[static_cast<size_t>(u)];
      if (other.continued_head != mine.open_head) continue;
      for (const float* part : other.continued)
        for (int64_t e = 0; e < acc_floats; ++e) sum[e] += part[e];
    }
    write(mine.open_head, sum);
  }
#pragma omp barrier
}

}  // namespace cabm::detail
