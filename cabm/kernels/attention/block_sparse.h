// Block-sparse attention layouts (Mask::block_sparse). A layout marks which (query block, key
// block) pairs may attend; the flash kernel skips every tile whose blocks are all false.
#pragma once

#include "cabm/kernels/attention/mask.h"

#include <cstdint>

namespace cabm {

// BigBird (Zaheer et al. 2020, "Big Bird: Transformers for Longer Sequences"), block form:
//  - local:  query block qb sees key blocks within `local_blocks` of its diagonal block, where the
//            diagonal is aligned bottom-right like every cabm mask (key block of position qb·block + M − N);
//  - global: the first `global_blocks` key blocks are seen by every query block, and the first
//            `global_blocks` query blocks see every key block;
//  - random: each query block additionally sees `random_blocks` key blocks drawn without
//            replacement from the rest (Philox, seeded; per head when heads > 1).
struct BigBirdConfig {
  int64_t block = 64;
  int64_t local_blocks = 1;   // on each side of the diagonal
  int64_t global_blocks = 1;
  int64_t random_blocks = 2;
  int64_t heads = 1;          // 1: one layout shared by all heads; else one per head
  uint64_t seed = 0;
};

// blocks: BOOL [heads, ceil(N / block), ceil(M / block)].
BlockSparseLayout bigbird_layout(int64_t N, int64_t M, const BigBirdConfig& config);

}  // namespace cabm
