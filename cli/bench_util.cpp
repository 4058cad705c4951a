#include "cli/bench_util.h"

#include "cabm/core/rng.h"
#include "cabm/core/threads.h"
#include "cabm/kernels/bf16.h"
#include "cabm/kernels/cpu_isa.h"

#include <omp.h>

#include "cabm/kernels/x86_intrinsics.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

namespace cabm::cli {

namespace {

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

struct alignas(64) AmxTileConfig {
  uint8_t palette_id = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Four C tiles (0-3) fed by two A (4, 5) and two B (6, 7) tiles loaded once: 4 tdpbf16ps of
// 16 · 16 · 32 multiply-adds per iteration. The tile configuration is per thread.
__attribute__((target("amx-tile,amx-bf16"))) double amx_loop(int64_t iterations, float* sink) {
  alignas(64) static const uint16_t ones[16 * 32] = {};  // bf16 zeros: the values do not matter
  alignas(64) float out[16 * 16];
  AmxTileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = 16;
    cfg.colsb[t] = 64;
  }
  _tile_loadconfig(&cfg);
  __asm__ volatile("" ::: "memory");  // GCC's tile asm has no memory operands
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_loadd(4, ones, 64);
  _tile_loadd(5, ones, 64);
  _tile_loadd(6, ones, 64);
  _tile_loadd(7, ones, 64);
  for (int64_t it = 0; it < iterations; ++it) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, out, 64);
  __asm__ volatile("" ::: "memory");
  _tile_release();
  *sink = out[0];
  return 4.0 * 2 * 16 * 16 * 32 * static_cast<double>(iterations);
}

// Peak FLOP/s of `loop` on num_threads() threads: one chunk calibrated on one thread to take
// about seconds / 3, then all threads together, the best of three rounds (the machine may be
// shared: the peak is what the cores can do, not what we got once).
template <typename Loop>
double measure_peak(Loop loop, double seconds) {
  using Clock = std::chrono::steady_clock;
  const int threads = num_threads();
  std::vector<float> sinks(static_cast<size_t>(threads) * 16);
  int64_t chunk = 1 << 10;
  for (;;) {
    const auto t0 = Clock::now();
    loop(chunk, sinks.data());
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    if (dt > 0.01 || chunk > (int64_t{1} << 30)) {
      chunk = std::max<int64_t>(1, static_cast<int64_t>(static_cast<double>(chunk) * (seconds / 3) / dt));
      break;
    }
    chunk *= 4;
  }
  double best = 0;
  for (int round = 0; round < 3; ++round) {
    double flops = 0;
    const auto t0 = Clock::now();
#pragma omp parallel num_threads(threads) reduction(+ : flops)
    flops += loop(chunk, sinks.data() + 16 * omp_get_thread_num());
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    best = std::max(best, flops / dt);
  }
  return best;
}

int64_t status_field_kb(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  const size_t n = std::strlen(field);
  while (std::getline(in, line)) {
    if (line.compare(0, n, field) == 0 && line.size() > n && line[n] == ':') return std::stoll(line.substr(n + 1));
  }
  return 0;
}

}  // namespace

const char* fma_peak_isa() {
  switch (simd_isa()) {
    case SimdIsa::kAvx512:
      return "avx512";
    case SimdIsa::kAvx2:
      return "avx2+fma";
    case SimdIsa::kPortable:
      break;
  }
  return "scalar";
}

double measure_fma_peak(double seconds) {
  switch (simd_isa()) {
    case SimdIsa::kAvx512:
      return measure_peak(fma_loop_avx512, seconds);
    case SimdIsa::kAvx2:
      return measure_peak(fma_loop_avx2, seconds);
    case SimdIsa::kPortable:
      break;
  }
  return measure_peak(fma_loop_scalar, seconds);
}

double measure_vdpbf16ps_peak(double seconds) {
  return cpu_has_avx512_bf16() ? measure_peak(vdpbf16ps_loop, seconds) : 0.0;
}

double measure_amx_bf16_peak(double seconds) {
  return cpu_has_amx_bf16() ? measure_peak(amx_loop, seconds) : 0.0;
}

int64_t current_rss_bytes() {
  return status_field_kb("VmRSS") * 1024;
}
int64_t peak_rss_bytes() {
  return status_field_kb("VmHWM") * 1024;
}

void MemoryProbe::start() {
  std::FILE* f = std::fopen("/proc/self/clear_refs", "w");
  reset_ok_ = f != nullptr && std::fputs("5", f) >= 0;
  if (f != nullptr) reset_ok_ = std::fclose(f) == 0 && reset_ok_;
  base_ = current_rss_bytes();
}

int64_t MemoryProbe::peak_increase() const {
  return std::max<int64_t>(0, peak_rss_bytes() - base_);
}

double median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

void fill_uniform(const Tensor& t, uint64_t seed) {
  float* p = t.data<float>();
  Rng rng(seed);
  for (int64_t n = 0; n < t.numel(); ++n) p[n] = 2.0f * rng.next_uniform() - 1.0f;
}

}  // namespace cabm::cli
