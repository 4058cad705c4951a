// What attention/decode.cpp (checks, partial states, threads, the merge) shares with the work item
// it runs once per instruction set (attention/decode_body.h, compiled in
// attention/decode_{avx512,avx2,portable}.cpp and chosen at run time by cpu_isa.h). Internal to
// kernels/. Also every header the body needs: the per-set files include this before their
// `#pragma GCC target` region, so that nothing outside the kernel's own code is compiled for a set.
#pragma once

#include "cabm/core/dtype.h"
#include "cabm/core/tensor.h"
#include "cabm/kernels/attention/mask.h"
#include "cabm/kernels/attention/reference.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include "cabm/kernels/x86_intrinsics.h"
#endif

namespace cabm {

inline constexpr int64_t kDecodeBlock = 64;  // keys whose scores are computed before the softmax update

struct DecodeShape {
  int64_t B, N, H, d, M, Hkv, dv, group, rows;  // rows = group · N: the query rows of one work item
};

// One call's operands, shared by its work items.
struct DecodeWork {
  const Tensor& q;
  const Tensor& k;
  const Tensor& v;
  const AttentionOptions& options;
  DecodeShape s;
  float scale;
  bool prefetch;  // ask for the next block's rows while a block computes (attention/decode.cpp)
};

// The partial softmax state of one work item: per row m, l and acc [dv].
struct DecodePartial {
  float* m;
  float* l;
  float* acc;
};

// A test hook: the work items prefetch the next block's rows always (1), never (0), or when the
// cache is big (-1, the default; attention/decode.cpp). Results are the same bits either way.
void set_decode_prefetch(int mode);

// The keys query row i may see, from the structural parts of the mask: [begin, end).
struct KeyRange {
  int64_t begin, end;
};
KeyRange decode_allowed_keys(const Mask& mask, int64_t b, int64_t i, int64_t N, int64_t M);

// Floats of a work item's per-thread scratch: the scaled queries of every key/value head, then the
// scores and weights of one block.
inline int64_t decode_scratch_floats(const DecodeShape& s) {
  return s.Hkv * s.rows * s.d + 2 * s.rows * kDecodeBlock;
}

// Keys [j0, j1) of batch item b for every key/value head hk, into parts[hk]: the same code in
// each set's namespace.
namespace decode_avx512 {
void run_item(const DecodeWork& work, int64_t b, int64_t j0, int64_t j1, const DecodePartial* parts, float* scratch);
}
namespace decode_avx2 {
void run_item(const DecodeWork& work, int64_t b, int64_t j0, int64_t j1, const DecodePartial* parts, float* scratch);
}
namespace decode_portable {
void run_item(const DecodeWork& work, int64_t b, int64_t j0, int64_t j1, const DecodePartial* parts, float* scratch);
}

}  // namespace cabm
