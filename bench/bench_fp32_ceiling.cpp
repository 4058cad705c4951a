// How close can an fp32 block product come to the FMA loop on this core? One core, data in L1
// unless said otherwise, the AVX-512 set (skipped with the reason elsewhere), each line as GFLOP/s
// and as a percentage of the FMA loop run first:
//   fma loop            24 independent accumulators, no loads (the peak `cabm bench` divides by)
//   6x4 loop, B fixed   the micro-kernel's k loop (4 vector loads of B, 6 broadcasts of A, 24
//                       FMAs) with B's four vectors read from the same 256 bytes every step
//   6x4 loop, B moving  the same loop with B's row advancing every step, as in every real product
//   block_kernel K=..   the library's micro-kernel (attention/tile_product.h), one call per K steps
//   tile 64x64x64 ...   tile_product as the forward runs it: S = K·Qᵀ with the tile maximum, and
//                       O = α∘O + V·Pᵀ with K and V streamed from 1 MiB heads (L2)
//   dnnl_sgemm n=1024   oneDNN's own fp32 GEMM on one thread, square, for comparison
// The fp32 attention targets are percentages of the FMA loop (docs/targets.md): on a CPU where
// even the 6x4 loop or oneDNN stay well below it, so will the attention kernels.
//
//   taskset -c 1 ./build/release/bench/bench_fp32_ceiling
//
// Times are the best of 7 rounds (the machine may be shared).
#include "cabm/kernels/aligned_vector.h"
#include "cabm/kernels/cpu_isa.h"

#include <dnnl.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <utility>

#if defined(__x86_64__)
#include "cabm/kernels/x86_intrinsics.h"

// The region opens before the header compiled inside it.
// clang-format off
#include "cabm/kernels/simd_set_avx512_begin.h"
#include "cabm/kernels/attention/tile_product.h"
// clang-format on

namespace cabm::simd_avx512::ceiling {
namespace {

using tile::Accum;
using tile::block_kernel;
using tile::tile_product;

double seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

using Floats = detail::AlignedVector<float>;  // 64-byte aligned, as the kernels' buffers

// n floats of small values that never overflow in the loops below.
Floats filled(int64_t n) {
  Floats x(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) x[static_cast<size_t>(i)] = 0.001f * static_cast<float>(1 + i % 7);
  return x;
}

template <class F>
double best_seconds(F&& f) {
  double best = 1e300;
  for (int round = 0; round < 7; ++round) {
    const double t0 = seconds();
    f();
    best = std::min(best, seconds() - t0);
  }
  return best;
}

__attribute__((noinline)) void fma_loop(int64_t steps, float* out) {
  __m512 acc[24];
#pragma GCC unroll 24
  for (int i = 0; i < 24; ++i) acc[i] = _mm512_set1_ps(0.001f * static_cast<float>(i));
  const __m512 x = _mm512_set1_ps(0.999f), y = _mm512_set1_ps(0.0001f);
  for (int64_t k = 0; k < steps; ++k) {
#pragma GCC unroll 24
    for (int i = 0; i < 24; ++i) {
      acc[i] = _mm512_fmadd_ps(acc[i], x, y);
      __asm__("" : "+v"(acc[i]));  // in registers, and no loop interchange
    }
  }
#pragma GCC unroll 24
  for (int i = 0; i < 24; ++i) _mm512_storeu_ps(out + 16 * i, acc[i]);
}

// The micro-kernel's k loop, 6 rows × 4 vectors; B's row k & row_mask (row_mask 0: always row 0).
__attribute__((noinline)) void loop_6x4(int64_t steps, const float* a, const float* b, int64_t row_mask, float* out) {
  __m512 acc[6][4];
  for (int r = 0; r < 6; ++r)
    for (int v = 0; v < 4; ++v) acc[r][v] = _mm512_setzero_ps();
  for (int64_t k = 0; k < steps; ++k) {
    __m512 bv[4];
    CABM_UNROLL
    for (int v = 0; v < 4; ++v) {
      bv[v] = _mm512_load_ps(b + (k & row_mask) * 64 + 16 * v);
      __asm__("" : "+v"(bv[v]));  // as block_kernel: B stays in registers, not in the FMAs' operands
    }
    CABM_UNROLL
    for (int r = 0; r < 6; ++r) {
      const __m512 ar = _mm512_set1_ps(a[(k & 63) + r * 64]);
      CABM_UNROLL
      for (int v = 0; v < 4; ++v) acc[r][v] = _mm512_fmadd_ps(ar, bv[v], acc[r][v]);
    }
  }
  for (int r = 0; r < 6; ++r)
    for (int v = 0; v < 4; ++v) _mm512_storeu_ps(out + 64 * r + 16 * v, acc[r][v]);
}

void line(const char* what, double gflops, double peak) {
  std::printf("%-36s %8.1f GFLOP/s %6.1f%%\n", what, gflops, 100.0 * gflops / peak);
}

void run() {
  Floats out = filled(24 * 16), a = filled(6 * 64 * 4), b = filled(64 * 64);
  const int64_t steps = 20'000'000;
  const double peak = 2.0 * 16 * 24 * steps / best_seconds([&] { fma_loop(steps, out.data()); }) / 1e9;
  line("fma loop (24 accumulators, no loads)", peak, peak);
  for (const auto& [mask, name] :
       {std::pair<int64_t, const char*>{0, "6x4 loop, B fixed"}, {63, "6x4 loop, B moving"}}) {
    const double t = best_seconds([&, mask = mask] { loop_6x4(steps, a.data(), b.data(), mask, out.data()); });
    line(name, 2.0 * 16 * 24 * steps / t / 1e9, peak);
  }
  // The library's micro-kernel on L1 operands, one call per K steps.
  for (const int64_t k : {32, 64, 128}) {
    const Floats ak = filled(6 * k), bk = filled(k * 64);
    Floats c = filled(6 * 64);
    const int64_t calls = 40'000'000 / k;
    const double t = best_seconds([&] {
      for (int64_t i = 0; i < calls; ++i)
        block_kernel<6, 4, Accum::kOverwrite>(k, {ak.data(), k, 1}, {bk.data(), 64}, {c.data(), 64}, nullptr);
    });
    char name[64];
    std::snprintf(name, sizeof name, "block_kernel 6x4, K = %ld", static_cast<long>(k));
    line(name, 2.0 * 6 * 64 * static_cast<double>(k * calls) / t / 1e9, peak);
  }
  // The forward's two tile products at d 64 on 64 × 64 tiles, K and V streamed from 1 MiB heads.
  const int64_t d = 64, tile = 64, keys = 4096;
  const Floats kh = filled(keys * d), vh = filled(keys * d), qt = filled(d * tile);
  Floats alpha(tile, 1.0f);  // O stays finite (tile_product takes it as float*)
  Floats s = filled(tile * tile), o = filled(d * tile), lane_max = filled(tile);
  const int64_t reps = 8;
  const double flops = 2.0 * static_cast<double>(tile * tile * d) * static_cast<double>(keys / tile * reps);
  // The best time of `product(j)` over every key tile j of a head, reps times.
  const auto over_head = [&](auto product) {
    return best_seconds([&] {
      for (int64_t r = 0; r < reps; ++r)
        for (int64_t j = 0; j < keys; j += tile) product(j);
    });
  };
  const double ts = over_head([&](int64_t j) {
    tile_product(tile, tile, d, {kh.data() + j * d, d, 1}, {qt.data(), tile}, {s.data(), tile}, Accum::kOverwriteMax,
                 lane_max.data());
  });
  line("tile 64x64x64, S = K Q^T and maximum", flops / ts / 1e9, peak);
  const double tp = over_head([&](int64_t j) {
    tile_product(d, tile, tile, {vh.data() + j * d, tile, 1}, {s.data(), tile}, {o.data(), tile}, Accum::kScaleAdd,
                 alpha.data());
  });
  line("tile 64x64x64, O = a O + V P^T", flops / tp / 1e9, peak);
  // oneDNN's fp32 GEMM on this thread.
  const int64_t n = 1024;
  const Floats ga = filled(n * n), gb = filled(n * n);
  Floats gc = filled(n * n);
  const double tg =
      best_seconds([&] { dnnl_sgemm('N', 'N', n, n, n, 1.0f, ga.data(), n, gb.data(), n, 0.0f, gc.data(), n); });
  line("dnnl_sgemm n = 1024, one thread", 2.0 * static_cast<double>(n * n * n) / tg / 1e9, peak);
}

}  // namespace
}  // namespace cabm::simd_avx512::ceiling

#include "cabm/kernels/simd_set_end.h"
#endif

int main() {
#if defined(__x86_64__)
  if (cabm::simd_isa() != cabm::SimdIsa::kAvx512) {
    std::printf("bench_fp32_ceiling: skipped, this CPU (or CABM_SIMD_ISA) does not run the AVX-512 set\n");
    return 0;
  }
  omp_set_num_threads(1);  // dnnl_sgemm: one thread, as the rest
  cabm::simd_avx512::ceiling::run();
#else
  std::printf("bench_fp32_ceiling: skipped, x86-64 only\n");
#endif
  return 0;
}
