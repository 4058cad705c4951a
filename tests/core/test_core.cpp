#include "cabm/core/dtype.h"
#include "cabm/core/error.h"
#include "cabm/core/rng.h"
#include "cabm/core/tensor.h"
#include "cabm/core/threads.h"
#include "util/test_util.h"

#include <cmath>
#include <cstring>
#include <set>

namespace cabm {
namespace {

TEST(Tensor, ContiguousStridesAndViews) {
  Tensor t = Tensor::zeros({2, 3, 4});
  EXPECT_EQ(t.strides(), (Shape{12, 4, 1}));
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.raw_data()) % 64, 0u);
  Tensor v = t.view({6, -1});
  EXPECT_EQ(v.shape(), (Shape{6, 4}));
  EXPECT_TRUE(v.shares_storage(t));
  EXPECT_THROW(t.view({5, -1}), Error);
  EXPECT_THROW(t.view({-1, -1}), Error);
}

TEST(Tensor, NarrowSelectAndStridedCopy) {
  Tensor t = test::random_tensor({3, 5, 7}, 1);
  Tensor n = t.narrow(1, 1, 3);  // [3, 3, 7], not contiguous
  EXPECT_FALSE(n.is_contiguous());
  Tensor c = n.clone();
  EXPECT_TRUE(c.is_contiguous());
  for (int64_t a = 0; a < 3; ++a)
    for (int64_t b = 0; b < 3; ++b)
      for (int64_t k = 0; k < 7; ++k) EXPECT_EQ(c.at({a, b, k}), t.at({a, b + 1, k}));
  Tensor s = t.select(2, 4);
  EXPECT_EQ(s.shape(), (Shape{3, 5}));
  EXPECT_EQ(s.at({2, 3}), t.at({2, 3, 4}));
  EXPECT_THROW(t.narrow(1, 3, 3), Error);
  EXPECT_THROW(t.select(0, 3), Error);
  EXPECT_THROW(t.at({0, 0}), Error);
}

TEST(Tensor, DtypeCheckedAccess) {
  Tensor t = Tensor::zeros({4}, DType::BOOL);
  EXPECT_NO_THROW(t.data<uint8_t>());
  EXPECT_THROW(t.data<float>(), Error);
  EXPECT_THROW(Tensor().data<float>(), Error);
}

TEST(Tensor, ZeroSizedShapes) {
  Tensor t = Tensor::zeros({0, 3});
  EXPECT_EQ(t.numel(), 0);
  Tensor c = t.clone();
  EXPECT_EQ(c.shape(), (Shape{0, 3}));
  EXPECT_THROW(Tensor::empty({-1, 2}), Error);
}

TEST(Tensor, FromExternalUsesCallerMemoryInPlace) {
  std::vector<float> buffer(2 * 3 * 4);
  for (size_t i = 0; i < buffer.size(); ++i) buffer[i] = static_cast<float>(i);
  const Tensor t = Tensor::from_external(buffer.data(), {2, 3, 4});
  EXPECT_EQ(t.data<float>(), buffer.data());
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.at({1, 2, 3}), 23.0f);
  t.select(0, 1).fill(-1.0f);  // writes land in the caller's buffer
  EXPECT_EQ(buffer[12], -1.0f);
  EXPECT_EQ(buffer[11], 11.0f);
  // Strided: every other column of a [3, 8] row-major matrix.
  std::vector<float> wide(3 * 8);
  for (size_t i = 0; i < wide.size(); ++i) wide[i] = static_cast<float>(i);
  const Tensor cols = Tensor::from_external(wide.data(), {3, 4}, DType::F32, {8, 2});
  EXPECT_EQ(cols.at({2, 3}), 22.0f);
  EXPECT_FALSE(cols.is_contiguous());
  EXPECT_EQ(cols.clone().to_vector(), (std::vector<float>{0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22}));
  {
    const Tensor copy = t;  // destroying tensors never frees the caller's memory
  }
  EXPECT_EQ(buffer[0], 0.0f);
  EXPECT_THROW(Tensor::from_external(nullptr, {2}), Error);
  EXPECT_THROW(Tensor::from_external(buffer.data(), {2, 3}, DType::F32, {1}), Error);
  EXPECT_THROW(Tensor::from_external(buffer.data(), {2, 3}, DType::F32, {-3, 1}), Error);
}

TEST(Error, CheckReportsFileAndLine) {
  try {
    CABM_CHECK(1 + 1 == 3, "arithmetic is {}", "broken");
    FAIL() << "no throw";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("test_core.cpp:"), std::string::npos) << msg;
    EXPECT_NE(msg.find("arithmetic is broken"), std::string::npos) << msg;
  }
}

float bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

TEST(BFloat16, RoundsToNearestEven) {
  // 1 + 2^-8 is exactly halfway between bf16 1.0 and 1 + 2^-7: ties to even (1.0).
  EXPECT_EQ(float_to_bf16(1.0f + 0x1p-8f).bits, 0x3f80);
  // 1 + 3·2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6: ties to even (1 + 2^-6).
  EXPECT_EQ(float_to_bf16(1.0f + 3 * 0x1p-8f).bits, 0x3f82);
  // Just above halfway rounds up.
  EXPECT_EQ(float_to_bf16(bits_to_float(0x3f808001u)).bits, 0x3f81);
  EXPECT_EQ(float_to_bf16(INFINITY).bits, 0x7f80);
  EXPECT_EQ(float_to_bf16(-INFINITY).bits, 0xff80);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::nanf("")))));
  // A NaN whose payload sits only in the low bits must stay NaN, not become inf.
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(bits_to_float(0x7f800001u)))));
  // Subnormals round like everything else.
  EXPECT_EQ(float_to_bf16(bits_to_float(0x00008000u)).bits, 0x0000);  // tie, even → 0
  EXPECT_EQ(float_to_bf16(bits_to_float(0x00018000u)).bits, 0x0002);  // tie, odd → up
  // The largest finite value rounds up to inf only past the halfway point.
  EXPECT_EQ(float_to_bf16(bits_to_float(0x7f7f7fffu)).bits, 0x7f7f);
  EXPECT_EQ(float_to_bf16(bits_to_float(0x7f7fffffu)).bits, 0x7f80);
  for (float x : {0.0f, -0.0f, 1.0f, -2.5f, 3.140625f}) EXPECT_EQ(bf16_to_float(float_to_bf16(x)), x);
}

TEST(Half, DecodesEveryClass) {
  EXPECT_EQ(half_bits_to_float(0x3c00), 1.0f);
  EXPECT_EQ(half_bits_to_float(0xc000), -2.0f);
  EXPECT_EQ(half_bits_to_float(0x7bff), 65504.0f);
  EXPECT_EQ(half_bits_to_float(0x0001), 0x1p-24f);
  EXPECT_EQ(half_bits_to_float(0x7c00), INFINITY);
  EXPECT_TRUE(std::isnan(half_bits_to_float(0x7e00)));
  EXPECT_TRUE(std::signbit(half_bits_to_float(0x8000)));
}

TEST(Philox, KnownAnswer) {
  // Random123's known-answer vector for philox4x32_10 with zero counter and key.
  const auto r = philox4x32(0, 0, 0);
  EXPECT_EQ(r[0], 0x6627e8d5u);
  EXPECT_EQ(r[1], 0xe169c58du);
  EXPECT_EQ(r[2], 0xbc57ac4cu);
  EXPECT_EQ(r[3], 0x9b00dbd8u);
}

TEST(Philox, UniformIsUniformAndCounterBased) {
  double sum = 0;
  std::set<float> distinct;
  for (uint64_t i = 0; i < 100000; ++i) {
    const float u = uniform(42, 7, i);
    ASSERT_GE(u, 0.0f);
    ASSERT_LT(u, 1.0f);
    sum += u;
    if (i < 1000) distinct.insert(u);
  }
  EXPECT_NEAR(sum / 100000, 0.5, 0.005);
  EXPECT_GT(distinct.size(), 990u);
  EXPECT_EQ(uniform(42, 7, 12345), uniform(42, 7, 12345));
  EXPECT_NE(uniform(42, 7, 12345), uniform(43, 7, 12345));
  Rng a(5), b(5);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(a.next_u32(), b.next_u32());
  Rng c(5, a.position());
  EXPECT_EQ(a.next_uniform(), c.next_uniform());
}

TEST(Threads, SetAndRead) {
  test::ScopedThreads scoped(1);
  EXPECT_EQ(num_threads(), 1);
  set_num_threads(2);
  EXPECT_EQ(num_threads(), 2);
  EXPECT_THROW(set_num_threads(0), Error);
}

}  // namespace
}  // namespace cabm

namespace cabm {
namespace {

// ensure_shape keeps a workspace's storage for every shape that fits in it (no fresh pages per
// batch), but never one that a view shares, and grows it when a shape does not fit.
TEST(EnsureShape, ReusesStorageThatFitsAndIsNotShared) {
  Tensor t;
  ensure_shape(t, {4, 8});
  const void* first = t.raw_data();
  ensure_shape(t, {3, 5});
  EXPECT_EQ(t.raw_data(), first);
  EXPECT_EQ(t.shape(), (Shape{3, 5}));
  EXPECT_TRUE(t.is_contiguous());
  ensure_shape(t, {16}, DType::BF16);  // 32 bytes of 128
  EXPECT_EQ(t.raw_data(), first);
  EXPECT_EQ(t.dtype(), DType::BF16);
  const Tensor view = t;  // shared: reusing would change what `view` sees
  ensure_shape(t, {2, 2});
  EXPECT_NE(t.raw_data(), first);
  EXPECT_EQ(view.raw_data(), first);
  const void* second = t.raw_data();
  ensure_shape(t, {64, 64});  // larger than the storage
  EXPECT_NE(t.raw_data(), second);
  EXPECT_EQ(t.numel(), 64 * 64);
  std::vector<float> external(8);
  Tensor ext = Tensor::from_external(external.data(), {8});
  ensure_shape(ext, {4});  // the caller's memory is never re-viewed
  EXPECT_NE(ext.raw_data(), static_cast<void*>(external.data()));
}

}  // namespace
}  // namespace cabm
