#include "cli/bench_util.h"

#include "cabm/core/rng.h"
#include "cabm/core/threads.h"
#include "cabm/kernels/bf16.h"
#include "cabm/kernels/cpu_isa.h"
#include "cabm/kernels/unit_loops.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

namespace cabm::cli {

namespace {

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

std::string cpu_isa_cap_line() {
  if (cpu_isa_cap() == CpuIsaCap::kNone) return "";
  const char* cap = cpu_isa_cap_name(cpu_isa_cap());
  return std::string("CABM_MAX_CPU_ISA=") + cap + ": cabm takes this CPU for one with no more than " + cap +
         " (the libraries have their own: ONEDNN_MAX_CPU_ISA, OPENBLAS_CORETYPE)";
}

double measure_fma_peak(double seconds) {
  switch (simd_isa()) {
    case SimdIsa::kAvx512:
      return measure_peak(detail::fma_loop_avx512, seconds);
    case SimdIsa::kAvx2:
      return measure_peak(detail::fma_loop_avx2, seconds);
    case SimdIsa::kPortable:
      break;
  }
  return measure_peak(detail::fma_loop_scalar, seconds);
}

double measure_vdpbf16ps_peak(double seconds) {
  return cpu_has_avx512_bf16() ? measure_peak(detail::vdpbf16ps_loop, seconds) : 0.0;
}

double measure_amx_bf16_peak(double seconds) {
  return cpu_has_amx_bf16() ? measure_peak(detail::amx_loop, seconds) : 0.0;
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
