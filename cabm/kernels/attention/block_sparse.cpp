#include "cabm/kernels/attention/block_sparse.h"

#include "cabm/core/rng.h"

#include <algorithm>
#include <vector>

namespace cabm {

BlockSparseLayout bigbird_layout(int64_t N, int64_t M, const BigBirdConfig& config) {
  CABM_CHECK(N >= 1 && M >= 1, "bigbird_layout needs N, M >= 1, got {}, {}", N, M);
  CABM_CHECK(config.block >= 1 && config.heads >= 1, "bigbird_layout needs block >= 1 and heads >= 1");
  CABM_CHECK(config.local_blocks >= 0 && config.global_blocks >= 0 && config.random_blocks >= 0,
             "bigbird_layout block counts must be >= 0");
  const int64_t nq = (N + config.block - 1) / config.block, nk = (M + config.block - 1) / config.block;
  BlockSparseLayout layout;
  layout.block_q = layout.block_k = config.block;
  layout.blocks = Tensor::zeros({config.heads, nq, nk}, DType::BOOL);
  uint8_t* blocks = layout.blocks.data<uint8_t>();
  Rng rng(config.seed);
  std::vector<int64_t> candidates;
  for (int64_t h = 0; h < config.heads; ++h) {
    for (int64_t qb = 0; qb < nq; ++qb) {
      uint8_t* row = blocks + (h * nq + qb) * nk;
      const int64_t diagonal = std::clamp((qb * config.block + M - N) / config.block, int64_t{0}, nk - 1);
      for (int64_t kb = std::max<int64_t>(0, diagonal - config.local_blocks);
           kb <= std::min(nk - 1, diagonal + config.local_blocks); ++kb)
        row[kb] = 1;
      for (int64_t kb = 0; kb < std::min(nk, config.global_blocks); ++kb) row[kb] = 1;
      if (qb < config.global_blocks) std::fill_n(row, nk, uint8_t{1});
      candidates.clear();
      for (int64_t kb = 0; kb < nk; ++kb)
        if (!row[kb]) candidates.push_back(kb);
      // Partial Fisher–Yates: the first random_blocks candidates become a uniform sample.
      const int64_t take = std::min<int64_t>(config.random_blocks, static_cast<int64_t>(candidates.size()));
      for (int64_t t = 0; t < take; ++t) {
        const int64_t pick = t + static_cast<int64_t>(rng.next_u32() % static_cast<uint32_t>(candidates.size() - t));
        std::swap(candidates[t], candidates[pick]);
        row[candidates[t]] = 1;
      }
    }
  }
  return layout;
}

}  // namespace cabm
