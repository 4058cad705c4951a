#include "cabm/kernels/unit_loops.h"

#include "cabm/kernels/attention/amx_tiles.h"
#include "cabm/kernels/x86_intrinsics.h"

#include <cstdint>

namespace cabm::detail {

// Iterations of 12 independent FMAs: enough accumulators to cover latency × pipes (4 × 2 on Zen 3,
// 4 × 2 on Zen 5 / Intel), so the loop is throughput-bound. Returns FLOPs done by this thread. One
// loop per instruction set of the dispatched kernels (cpu_isa.h), each compiled for its set by
// target attribute whatever the build's flags, so that the peak is that of the set the kernels run.
__attribute__((target("avx512f"))) double fma_loop_avx512(int64_t iterations, float* sink) {
  constexpr int kAcc = 12;
  __m512 acc[kAcc];
  for (int a = 0; a < kAcc; ++a) acc[a] = _mm512_set1_ps(0.001f * a);
  const __m512 x = _mm512_set1_ps(0.999999f), y = _mm512_set1_ps(1e-7f);
  for (int64_t it = 0; it < iterations; ++it) {
    for (int a = 0; a < kAcc; ++a) acc[a] = _mm512_fmadd_ps(acc[a], x, y);
  }
  float total = 0;
  for (int a = 0; a < kAcc; ++a) total += _mm512_reduce_add_ps(acc[a]);
  *sink = total;
  return 2.0 * kAcc * 16 * static_cast<double>(iterations);
}

__attribute__((target("avx2,fma"))) double fma_loop_avx2(int64_t iterations, float* sink) {
  constexpr int kAcc = 12;
  __m256 acc[kAcc];
  for (int a = 0; a < kAcc; ++a) acc[a] = _mm256_set1_ps(0.001f * a);
  const __m256 x = _mm256_set1_ps(0.999999f), y = _mm256_set1_ps(1e-7f);
  for (int64_t it = 0; it < iterations; ++it) {
    for (int a = 0; a < kAcc; ++a) acc[a] = _mm256_fmadd_ps(acc[a], x, y);
  }
  alignas(32) float lanes[8];
  float total = 0;
  for (int a = 0; a < kAcc; ++a) {
    _mm256_store_ps(lanes, acc[a]);
    for (float l : lanes) total += l;
  }
  *sink = total;
  return 2.0 * kAcc * 8 * static_cast<double>(iterations);
}

// The portable set: one multiply and one add per element (the compiler may vectorise it for the
// build's flags; it is the peak of the code the portable kernels are).
double fma_loop_scalar(int64_t iterations, float* sink) {
  constexpr int kAcc = 12;
  float acc[kAcc];
  for (int a = 0; a < kAcc; ++a) acc[a] = 0.001f * a;
  for (int64_t it = 0; it < iterations; ++it) {
    for (int a = 0; a < kAcc; ++a) acc[a] = acc[a] * 0.999999f + 1e-7f;
  }
  float total = 0;
  for (int a = 0; a < kAcc; ++a) total += acc[a];
  *sink = total;
  return 2.0 * kAcc * static_cast<double>(iterations);
}

// 16 independent vdpbf16ps accumulators: 64 FLOPs each per iteration. 12 were enough for the
// Zen 4 but not for the Zen 5, whose two 512-bit pipes need more chains in flight (a standalone
// loop on the Zen 5 of session 13: 12 chains 440, 16 chains 480 GFLOP/s per core, 2.0× its FMA
// loop's 240). Compiled for AVX512_BF16 by target attribute whatever the build's flags; called
// only where the CPU has it.
__attribute__((target("avx512f,avx512bf16"))) double vdpbf16ps_loop(int64_t iterations, float* sink) {
  constexpr int kAcc = 16;
  __m512 acc[kAcc];
  for (int a = 0; a < kAcc; ++a) acc[a] = _mm512_set1_ps(0.001f * a);
  const __m512bh x = (__m512bh)_mm512_set1_epi16(0x3f80), y = (__m512bh)_mm512_set1_epi16(0x3380);  // 1, 6e-8
  for (int64_t it = 0; it < iterations; ++it) {
    for (int a = 0; a < kAcc; ++a) acc[a] = _mm512_dpbf16_ps(acc[a], x, y);
  }
  float total = 0;
  for (int a = 0; a < kAcc; ++a) total += _mm512_reduce_add_ps(acc[a]);
  *sink = total;
  return 64.0 * kAcc * static_cast<double>(iterations);
}

// Four C tiles (0-3) fed by two A (4, 5) and two B (6, 7) tiles loaded once: 4 tdpbf16ps of
// 16 · 16 · 32 multiply-adds per iteration. The tile configuration is per thread.
CABM_AMX double amx_loop(int64_t iterations, float* sink) {
  alignas(64) static const uint16_t zeros[16 * 32] = {};  // bf16 zeros: the values do not matter
  alignas(64) float out[16 * 16];
  HardwareTiles::configure();
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_loadd(4, zeros, 64);
  _tile_loadd(5, zeros, 64);
  _tile_loadd(6, zeros, 64);
  _tile_loadd(7, zeros, 64);
  for (int64_t it = 0; it < iterations; ++it) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, out, 64);
  memory_barrier();
  HardwareTiles::release();
  *sink = out[0];
  return 4.0 * 2 * 16 * 16 * 32 * static_cast<double>(iterations);
}

double imul_chain_cycles(int64_t iterations) {
  uint64_t x = 3, one = 1;
  for (int64_t it = 0; it < iterations; ++it)
    __asm__ volatile(
        "imul %1, %0\n\timul %1, %0\n\timul %1, %0\n\timul %1, %0\n\t"
        "imul %1, %0\n\timul %1, %0\n\timul %1, %0\n\timul %1, %0"
        : "+r"(x)
        : "r"(one));
  return 3.0 * 8 * static_cast<double>(iterations);
}

}  // namespace cabm::detail
