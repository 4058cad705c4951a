// The Mask type: each named constructor's meaning, alignment for N ≠ M, combination with &,
// broadcasting and validation errors.
#include "cabm/kernels/attention/mask.h"
#include "util/test_util.h"

#include <cmath>

namespace cabm {
namespace {

// allows(b, h, i, j) over the whole [B, H, N, M] grid as a string of 0/1 per row, for reading.
std::vector<std::string> grid(const Mask& mask, int64_t B, int64_t H, int64_t N, int64_t M) {
  const ResolvedMask r(mask, B, H, N, M);
  std::vector<std::string> rows;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < N; ++i) {
        std::string row;
        for (int64_t j = 0; j < M; ++j) row += r.allows(b, h, i, j) ? '1' : '0';
        rows.push_back(row);
      }
  return rows;
}

TEST(Mask, EmptyAttendsEverywhere) {
  EXPECT_TRUE(Mask().empty());
  EXPECT_EQ(grid(Mask(), 1, 1, 2, 3), (std::vector<std::string>{"111", "111"}));
}

TEST(Mask, CausalAlignments) {
  // N = 2 queries, M = 4 keys. Bottom-right: query i sits at key position i + 2.
  EXPECT_EQ(grid(Mask::causal(), 1, 1, 2, 4), (std::vector<std::string>{"1110", "1111"}));
  // Top-left (PyTorch's triu(diagonal=1)): query i sees keys 0..i.
  EXPECT_EQ(grid(Mask::causal(CausalAlign::kTopLeft), 1, 1, 2, 4), (std::vector<std::string>{"1000", "1100"}));
  // Square: both are the lower triangle.
  EXPECT_EQ(grid(Mask::causal(), 1, 1, 3, 3), grid(Mask::causal(CausalAlign::kTopLeft), 1, 1, 3, 3));
  EXPECT_THROW(Mask::causal(CausalAlign::kBottomRight) & Mask::causal(CausalAlign::kTopLeft), Error);
}

TEST(Mask, SlidingWindow) {
  EXPECT_EQ(grid(Mask::sliding_window(1, 0), 1, 1, 4, 4),
            (std::vector<std::string>{"1000", "1100", "0110", "0011"}));
  EXPECT_EQ(grid(Mask::sliding_window(0, 1), 1, 1, 3, 3), (std::vector<std::string>{"110", "011", "001"}));
  // Bottom-right aligned: one query against 5 keys sits at position 4.
  EXPECT_EQ(grid(Mask::sliding_window(2, 0), 1, 1, 1, 5), (std::vector<std::string>{"00111"}));
  // causal == window(unbounded, 0).
  EXPECT_EQ(grid(Mask::sliding_window(Mask::kUnbounded, 0), 1, 1, 3, 5), grid(Mask::causal(), 1, 1, 3, 5));
  EXPECT_THROW(Mask::sliding_window(-1, 0), Error);
}

TEST(Mask, KeyPadding) {
  EXPECT_EQ(grid(Mask::key_padding({2, 0}), 2, 1, 1, 3), (std::vector<std::string>{"110", "000"}));
  EXPECT_THROW(Mask::key_padding({-1}), Error);
  EXPECT_THROW(ResolvedMask(Mask::key_padding({2}), 2, 1, 1, 3), Error);     // wrong batch size
  EXPECT_THROW(ResolvedMask(Mask::key_padding({4, 1}), 2, 1, 1, 3), Error);  // longer than M
}

TEST(Mask, AllowBroadcastsRightAligned) {
  Tensor allowed = Tensor::zeros({3}, DType::BOOL);  // one row of keys, broadcast everywhere
  allowed.data<uint8_t>()[1] = 1;
  EXPECT_EQ(grid(Mask::allow(allowed), 2, 2, 2, 3), std::vector<std::string>(8, "010"));
  // [B, 1, 1, M]: per batch item.
  Tensor per_batch = Tensor::zeros({2, 1, 1, 2}, DType::BOOL);
  per_batch.data<uint8_t>()[0] = 1;
  per_batch.data<uint8_t>()[3] = 1;
  EXPECT_EQ(grid(Mask::allow(per_batch), 2, 1, 1, 2), (std::vector<std::string>{"10", "01"}));
  EXPECT_THROW(ResolvedMask(Mask::allow(Tensor::zeros({4}, DType::BOOL)), 1, 1, 2, 3), Error);
  EXPECT_THROW(Mask::allow(Tensor::zeros({3})), Error);  // F32 is not an allow mask
}

TEST(Mask, AdditiveBiasAndBlocking) {
  Tensor bias = Tensor::from_vector({0.5f, -INFINITY, 2.0f, 0.0f}, {2, 2});
  const ResolvedMask r(Mask::additive(bias) & Mask::additive(bias), 1, 1, 2, 2);
  float row[2];
  r.fill_row(0, 0, 0, row);
  EXPECT_EQ(row[0], 1.0f);  // biases add
  EXPECT_EQ(row[1], -INFINITY);
  r.fill_row(0, 0, 1, row);
  EXPECT_EQ(row[0], 4.0f);
  EXPECT_THROW(Mask::additive(Tensor::zeros({2}, DType::BOOL)), Error);
}

TEST(Mask, BlockSparse) {
  BlockSparseLayout layout{2, 2, Tensor::zeros({1, 2, 2}, DType::BOOL)};
  uint8_t* blocks = layout.blocks.data<uint8_t>();
  blocks[0] = 1;  // query block 0 → key block 0
  blocks[3] = 1;  // query block 1 → key block 1
  EXPECT_EQ(grid(Mask::block_sparse(layout), 1, 1, 3, 3), (std::vector<std::string>{"110", "110", "001"}));
  BlockSparseLayout wrong{2, 2, Tensor::zeros({1, 1, 2}, DType::BOOL)};
  EXPECT_THROW(ResolvedMask(Mask::block_sparse(wrong), 1, 1, 3, 3), Error);
}

TEST(Mask, CombinationIsConjunction) {
  const Mask m = Mask::causal() & Mask::key_padding({2}) & Mask::sliding_window(1, 0);
  EXPECT_EQ(grid(m, 1, 1, 3, 3), (std::vector<std::string>{"100", "110", "010"}));
  // Two key-padding masks keep the shorter length.
  EXPECT_EQ(grid(Mask::key_padding({3}) & Mask::key_padding({1}), 1, 1, 1, 3), (std::vector<std::string>{"100"}));
}

TEST(Mask, FullyMaskedQueryRows) {
  Tensor per_head = Tensor::zeros({1, 2, 2, 2}, DType::BOOL);
  uint8_t* p = per_head.data<uint8_t>();
  // Head 0 lets both rows attend; head 1 blocks row 1 entirely.
  p[0] = p[1] = p[2] = p[3] = 1;
  p[4] = 1;
  EXPECT_EQ(fully_masked_query_rows(Mask::allow(per_head), 1, 2, 2, 2), (std::vector<uint8_t>{0, 1}));
  EXPECT_EQ(fully_masked_query_rows(Mask::key_padding({0, 2}), 2, 1, 2, 2), (std::vector<uint8_t>{1, 1, 0, 0}));
}

}  // namespace
}  // namespace cabm
