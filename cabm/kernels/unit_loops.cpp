#include "cabm/kernels/unit_loops.h"

#include "cabm/kernels/attention/amx_tiles.h"
#include "cabm/kernels/x86_intrinsics.h"

#include <algorithm>
#include <cstdint>

namespace cabm::detail {

// The FMA, vdpbf16ps and multiply loops are assembly, counter included, so that they time the unit
// whatever the compiler makes of C++: at -O0 or under AddressSanitizer (whose build kept the C++
// loops' accumulators in instrumented stack memory and read 0.07 FMAs per cycle) the same
// instructions run as at -O2. Each is one asm statement, "1:" ... "dec; jnz 1b", run max(1,
// iterations) times.

// The assembly keeps one line per group of instructions:
// clang-format off

// The block of 12 independent multiply-adds op acc, x, y (acc = x · acc + y for the FMAs) over
// operands named a0..a11, x and y.
#define CABM_OP12(op)                                                                                 \
  op " %[y], %[x], %[a0]\n\t" op " %[y], %[x], %[a1]\n\t" op " %[y], %[x], %[a2]\n\t"                  \
  op " %[y], %[x], %[a3]\n\t" op " %[y], %[x], %[a4]\n\t" op " %[y], %[x], %[a5]\n\t"                  \
  op " %[y], %[x], %[a6]\n\t" op " %[y], %[x], %[a7]\n\t" op " %[y], %[x], %[a8]\n\t"                  \
  op " %[y], %[x], %[a9]\n\t" op " %[y], %[x], %[a10]\n\t" op " %[y], %[x], %[a11]\n\t"
#define CABM_ACC12(acc, c)                                                                                 \
  [a0] c(acc[0]), [a1] c(acc[1]), [a2] c(acc[2]), [a3] c(acc[3]), [a4] c(acc[4]), [a5] c(acc[5]), [a6] c(acc[6]), \
      [a7] c(acc[7]), [a8] c(acc[8]), [a9] c(acc[9]), [a10] c(acc[10]), [a11] c(acc[11])
// n rounds of the 12 FMAs acc[a] = x · acc[a] + y, on ymm or zmm registers as the types say ("v":
// any vector register the function's target has).
#define CABM_FMA_LOOP(acc, x, y, n)                                                                  \
  __asm__ volatile("1:\n\t" CABM_OP12("vfmadd213ps") "dec %[n]\n\tjnz 1b"                              \
                   : CABM_ACC12(acc, "+v"), [n] "+r"(n)                                                \
                   : [x] "v"(x), [y] "v"(y)                                                            \
                   : "cc")

// Iterations of 12 independent FMAs: enough accumulators to cover latency × pipes (4 × 2 on Zen 3,
// 4 × 2 on Zen 5 / Intel), so the loop is throughput-bound. Returns FLOPs done by this thread. One
// loop per instruction set of the dispatched kernels (cpu_isa.h), each compiled for its set by
// target attribute whatever the build's flags, so that the peak is that of the set the kernels run.
__attribute__((target("avx512f"))) double fma_loop_avx512(int64_t iterations, float* sink) {
  constexpr int kAcc = 12;
  __m512 acc[kAcc];
  for (int a = 0; a < kAcc; ++a) acc[a] = _mm512_set1_ps(0.001f * a);
  const __m512 x = _mm512_set1_ps(0.999999f), y = _mm512_set1_ps(1e-7f);
  int64_t n = std::max<int64_t>(iterations, 1);
  const double flops = 2.0 * kAcc * 16 * static_cast<double>(n);
  CABM_FMA_LOOP(acc, x, y, n);
  float total = 0;
  for (int a = 0; a < kAcc; ++a) total += _mm512_reduce_add_ps(acc[a]);
  *sink = total;
  return flops;
}

__attribute__((target("avx2,fma"))) double fma_loop_avx2(int64_t iterations, float* sink) {
  constexpr int kAcc = 12;
  __m256 acc[kAcc];
  for (int a = 0; a < kAcc; ++a) acc[a] = _mm256_set1_ps(0.001f * a);
  const __m256 x = _mm256_set1_ps(0.999999f), y = _mm256_set1_ps(1e-7f);
  int64_t n = std::max<int64_t>(iterations, 1);
  const double flops = 2.0 * kAcc * 8 * static_cast<double>(n);
  CABM_FMA_LOOP(acc, x, y, n);
  alignas(32) float lanes[8];
  float total = 0;
  for (int a = 0; a < kAcc; ++a) {
    _mm256_store_ps(lanes, acc[a]);
    for (float l : lanes) total += l;
  }
  *sink = total;
  return flops;
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
// only where the CPU has it. Sixteen in-out operands are more than an asm statement takes (30), so
// the accumulators are zmm0-15, named and clobbered, zeroed and summed inside the statement.
#define CABM_DP4(a, b, c, d)                                                                    \
  "vdpbf16ps %[y], %[x], %%zmm" #a "\n\tvdpbf16ps %[y], %[x], %%zmm" #b "\n\tvdpbf16ps %[y], %[x], %%zmm" #c \
  "\n\tvdpbf16ps %[y], %[x], %%zmm" #d "\n\t"
#define CABM_ZERO4(a, b, c, d)                                                                                 \
  "vxorps %%xmm" #a ", %%xmm" #a ", %%xmm" #a "\n\tvxorps %%xmm" #b ", %%xmm" #b ", %%xmm" #b "\n\tvxorps %%xmm" #c \
  ", %%xmm" #c ", %%xmm" #c "\n\tvxorps %%xmm" #d ", %%xmm" #d ", %%xmm" #d "\n\t"
#define CABM_ADD(a, b) "vaddps %%zmm" #b ", %%zmm" #a ", %%zmm" #a "\n\t"
__attribute__((target("avx512f,avx512bf16"))) double vdpbf16ps_loop(int64_t iterations, float* sink) {
  constexpr int kAcc = 16;
  const __m512bh x = (__m512bh)_mm512_set1_epi16(0x3f80), y = (__m512bh)_mm512_set1_epi16(0x3380);  // 1, 6e-8
  alignas(64) float total[16];
  int64_t n = std::max<int64_t>(iterations, 1);
  const double flops = 64.0 * kAcc * static_cast<double>(n);
  __asm__ volatile(CABM_ZERO4(0, 1, 2, 3) CABM_ZERO4(4, 5, 6, 7) CABM_ZERO4(8, 9, 10, 11) CABM_ZERO4(12, 13, 14, 15)
                   "1:\n\t"
                   CABM_DP4(0, 1, 2, 3) CABM_DP4(4, 5, 6, 7) CABM_DP4(8, 9, 10, 11) CABM_DP4(12, 13, 14, 15)
                   "dec %[n]\n\tjnz 1b\n\t"
                   CABM_ADD(0, 1) CABM_ADD(2, 3) CABM_ADD(4, 5) CABM_ADD(6, 7)
                   CABM_ADD(8, 9) CABM_ADD(10, 11) CABM_ADD(12, 13) CABM_ADD(14, 15)
                   CABM_ADD(0, 2) CABM_ADD(4, 6) CABM_ADD(8, 10) CABM_ADD(12, 14)
                   CABM_ADD(0, 4) CABM_ADD(8, 12) CABM_ADD(0, 8)
                   "vmovaps %%zmm0, %[total]"
                   : [n] "+r"(n), [total] "=m"(total)
                   : [x] "v"(x), [y] "v"(y)
                   : "cc", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10",
                     "xmm11", "xmm12", "xmm13", "xmm14", "xmm15");
  float sum = 0;
  for (float t : total) sum += t;
  *sink = sum;
  return flops;
}

// clang-format on

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
  int64_t n = std::max<int64_t>(iterations, 1);
  const double cycles = 3.0 * 8 * static_cast<double>(n);
  __asm__ volatile(
      "1:\n\t"
      "imul %[one], %[x]\n\timul %[one], %[x]\n\timul %[one], %[x]\n\timul %[one], %[x]\n\t"
      "imul %[one], %[x]\n\timul %[one], %[x]\n\timul %[one], %[x]\n\timul %[one], %[x]\n\t"
      "dec %[n]\n\tjnz 1b"
      : [x] "+r"(x), [n] "+r"(n)
      : [one] "r"(one)
      : "cc");
  return cycles;
}

}  // namespace cabm::detail
