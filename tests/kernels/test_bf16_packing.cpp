// The packed bf16 K and V layouts of attention/bf16_packing.h, which the avx512_bf16 and AMX
// attention kernels read: pack_kv_head against the index functions, element by element, for the
// padded sizes each kernel uses (the AMX forward's, d rounded up to 32, runs here whatever the CPU
// has), odd widths, strided heads and every head of a GQA layout, with each K packer the CPU
// runs (portable, AVX-512 transposes); the padding must be zero. And
// the per-thread storage they are packed into: aligned, K and V apart, reused; and the kernels'
// cache-line aligned vectors (kernels/aligned_vector.h).
#include "cabm/kernels/aligned_vector.h"
#include "cabm/kernels/attention/bf16_avx512.h"
#include "cabm/kernels/attention/bf16_packing.h"
#include "cabm/kernels/bf16.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <iostream>
#include <random>
#include <string>
#include <vector>

namespace cabm {
namespace {

using detail::packed_k_index;
using detail::packed_v_index;

int64_t round_up(int64_t a, int64_t b) {
  return (a + b - 1) / b * b;
}

// [B, M, H, width] bf16 head view over a buffer whose rows are `pad` elements longer (strided),
// holding random non-zero values: a zero in the packed copy can then only be padding.
struct HeadView {
  std::vector<bf16> storage;
  Tensor t;
  HeadView(int64_t B, int64_t M, int64_t H, int64_t width, int64_t pad, std::mt19937& rng)
      : storage(static_cast<size_t>(B * M * H * (width + pad))) {
    std::uniform_int_distribution<uint16_t> bits(0x3c00, 0x43ff);  // ±(2^-7 … 2^8), never zero
    for (bf16& x : storage) x.bits = static_cast<uint16_t>(bits(rng) | (rng() & 1 ? 0x8000 : 0));
    const int64_t row = width + pad;
    t = Tensor::from_external(storage.data(), {B, M, H, width}, DType::BF16, {M * H * row, H * row, row, 1});
  }
  uint16_t at(int64_t b, int64_t j, int64_t h, int64_t c) const {
    return t.data<bf16>()[b * t.stride(0) + j * t.stride(1) + h * t.stride(2) + c].bits;
  }
};

struct Padding {
  std::string kernel;
  int64_t dp, dvp, Mp;
};

struct KPacker {
  std::string name;
  detail::RowBlockPacker pack;
};

// The K packers this CPU runs: the portable one, and the AVX-512 transposes where AVX512_BF16 is.
std::vector<KPacker> k_packers() {
  std::vector<KPacker> packers = {{"portable", detail::pack_row_blocks}};
#if defined(CABM_HAVE_AVX512_BF16_CODE)
  if (cpu_has_avx512_bf16())
    packers.push_back({"avx512", detail::pack_row_blocks_avx512});
  else
    std::cout << "[ SKIPPED  ] pack_row_blocks_avx512: this CPU has no AVX512_BF16\n";
#else
  std::cout << "[ SKIPPED  ] pack_row_blocks_avx512: not built (not x86-64)\n";
#endif
  return packers;
}

TEST(Bf16Packing, KvHeadMatchesTheIndexFunctionsWithZeroPadding) {
  std::mt19937 rng(7);
  // (B, M, Hkv, d, dv): odd and even widths and key counts, one key, more keys than a block, more
  // than 16 column pairs with and without a whole number of 16-pair groups.
  const std::vector<std::vector<int64_t>> shapes = {{1, 1, 1, 1, 1},    {2, 17, 3, 5, 7},    {1, 33, 2, 64, 64},
                                                    {2, 40, 1, 40, 24}, {1, 16, 4, 128, 96}, {1, 50, 2, 17, 33},
                                                    {1, 29, 1, 100, 3}, {1, 7, 2, 200, 9},   {1, 48, 1, 33, 32}};
  const std::vector<KPacker> packers = k_packers();
  for (const auto& s : shapes) {
    const int64_t B = s[0], M = s[1], Hkv = s[2], d = s[3], dv = s[4];
    const HeadView k(B, M, Hkv, d, 3, rng), v(B, M, Hkv, dv, 1, rng);
    // The sizes attention/flash_bf16.cpp and attention/flash_amx.cpp pad to.
    const std::vector<Padding> paddings = {{"avx512_bf16", round_up(d, 2), round_up(dv, 16), round_up(M, 16)},
                                           {"amx", round_up(d, 32), round_up(dv, 16), round_up(M, 16) + 16}};
    for (const Padding& pad : paddings) {
      for (const KPacker& packer : packers) {
        for (int64_t b = 0; b < B; ++b) {
          for (int64_t h = 0; h < Hkv; ++h) {
            SCOPED_TRACE(testing::Message()
                         << pad.kernel << " K packer " << packer.name << " B " << B << " M " << M << " Hkv " << Hkv
                         << " d " << d << " dv " << dv << " head (" << b << ", " << h << ")");
            std::vector<bf16> kp(static_cast<size_t>(pad.Mp * pad.dp), bf16{0x7fc0}),
                vp(static_cast<size_t>(pad.Mp * pad.dvp), bf16{0x7fc0});  // NaN: stale contents must go
            detail::pack_kv_head(k.t, v.t, b, h, pad.Mp, pad.dp, pad.dvp, kp.data(), vp.data(), packer.pack);
            std::vector<bool> k_used(kp.size()), v_used(vp.size());
            for (int64_t j = 0; j < M; ++j) {
              for (int64_t c = 0; c < d; ++c) {
                const int64_t at = packed_k_index(j, c, pad.dp);
                ASSERT_LT(at, static_cast<int64_t>(kp.size()));
                ASSERT_EQ(kp[static_cast<size_t>(at)].bits, k.at(b, j, h, c)) << "K key " << j << " dim " << c;
                k_used[static_cast<size_t>(at)] = true;
              }
              for (int64_t c = 0; c < dv; ++c) {
                const int64_t at = packed_v_index(j, c, pad.dvp);
                ASSERT_LT(at, static_cast<int64_t>(vp.size()));
                ASSERT_EQ(vp[static_cast<size_t>(at)].bits, v.at(b, j, h, c)) << "V key " << j << " column " << c;
                v_used[static_cast<size_t>(at)] = true;
              }
            }
            for (size_t i = 0; i < kp.size(); ++i)
              if (!k_used[i]) {
                ASSERT_EQ(kp[i].bits, 0) << "K padding at " << i;
              }
            for (size_t i = 0; i < vp.size(); ++i)
              if (!v_used[i]) {
                ASSERT_EQ(vp[i].bits, 0) << "V padding at " << i;
              }
          }
        }
      }
    }
  }
}

TEST(Bf16Packing, StorageIsAlignedSeparateAndReused) {
  const detail::PackedKV small = detail::packed_kv_storage(100, 50);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(small.k) % 64, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(small.v) % 64, 0u);
  EXPECT_GE(small.v - small.k, 100);
  // The whole of both is writable (ASan checks the bounds in the sanitizer build).
  std::fill_n(small.k, 100, bf16{1});
  std::fill_n(small.v, 50, bf16{2});
  EXPECT_EQ(small.k[99].bits, 1);
  // A smaller request reuses the thread's storage; a larger one grows it.
  const detail::PackedKV again = detail::packed_kv_storage(10, 10);
  EXPECT_EQ(again.k, small.k);
  const detail::PackedKV large = detail::packed_kv_storage(1 << 20, 1 << 19);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(large.v) % 64, 0u);
  EXPECT_GE(large.v - large.k, 1 << 20);
  std::fill_n(large.k, 1 << 20, bf16{3});
  std::fill_n(large.v, 1 << 19, bf16{4});
  EXPECT_EQ(large.k[(1 << 20) - 1].bits, 3);
  EXPECT_EQ(large.v[(1 << 19) - 1].bits, 4);
}

// The kernels' per-thread tiles (detail::AlignedVector) start on a cache line whatever the size,
// after every regrowth, for 2- and 4-byte elements alike: glibc's malloc gives 16-byte alignment,
// which the first sizes below would hit at 16, 32 or 48 bytes into a line.
TEST(Bf16Packing, AlignedVectorStartsOnACacheLine) {
  detail::AlignedVector<float> f;
  detail::AlignedVector<bf16> h;
  std::vector<char> spacer;  // other allocations in between, so that the heap is not fresh
  for (size_t n : {1, 3, 17, 100, 1000, 4096, 24576, 40000, 100000, 7, 300000}) {
    spacer.resize(spacer.size() + n % 48 + 1);
    f.assign(n, 1.5f);
    h.assign(n, bf16{7});
    EXPECT_EQ(reinterpret_cast<uintptr_t>(f.data()) % 64, 0u) << n;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(h.data()) % 64, 0u) << n;
    EXPECT_EQ(f[n - 1], 1.5f);
    EXPECT_EQ(h[n - 1].bits, 7);
    detail::AlignedVector<float> copy = f;  // copies and moves keep the allocator
    EXPECT_EQ(reinterpret_cast<uintptr_t>(copy.data()) % 64, 0u) << n;
    const detail::AlignedVector<float> moved = std::move(copy);
    EXPECT_EQ(moved.size(), n);
  }
}

}  // namespace
}  // namespace cabm
