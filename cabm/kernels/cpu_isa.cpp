#include "cabm/kernels/cpu_isa.h"

#include "cabm/core/error.h"
#include "cabm/kernels/machine_wisdom.h"
#include "cabm/kernels/unit_loops.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <string_view>

namespace cabm {
namespace {

// A cache size the OS reports (glibc reads it from CPUID), or `fallback` where it reports none.
[[maybe_unused]] int64_t sysconf_bytes(int name, int64_t fallback) {
  const long b = sysconf(name);
  return b > 0 ? static_cast<int64_t>(b) : fallback;
}

// -1: no override; else the SimdIsa value.
std::atomic<int> g_override{-1};

// CABM_SIMD_ISA, read once; an unknown or unsupported value is a usage error naming the variable.
SimdIsa from_environment() {
  const char* env = std::getenv("CABM_SIMD_ISA");
  if (env == nullptr || *env == '\0') return widest_simd_isa();
  const std::string_view name(env);
  for (SimdIsa isa : {SimdIsa::kPortable, SimdIsa::kAvx2, SimdIsa::kAvx512}) {
    if (name != simd_isa_name(isa)) continue;
    if (!cpu_supports(isa))
      throw UsageError(fmt::format("CABM_SIMD_ISA={}: this CPU does not run {} code", name, name));
    return isa;
  }
  throw UsageError(
      fmt::format("CABM_SIMD_ISA={}: expected portable, avx2 or avx512 (or unset: the widest this CPU runs)", name));
}

constexpr CpuIsaCap kCaps[] = {CpuIsaCap::kPortable, CpuIsaCap::kAvx2, CpuIsaCap::kAvx512, CpuIsaCap::kAvx512Bf16,
                               CpuIsaCap::kAmxBf16};

CpuIsaCap cap_from_environment() {
  const char* env = std::getenv("CABM_MAX_CPU_ISA");
  if (env == nullptr || *env == '\0') return CpuIsaCap::kNone;
  const std::string_view name(env);
  for (CpuIsaCap cap : kCaps)
    if (name == cpu_isa_cap_name(cap)) return cap;
  throw UsageError(fmt::format(
      "CABM_MAX_CPU_ISA={}: expected portable, avx2, avx512, avx512_bf16 or amx_bf16 (or unset: no cap)", name));
}

}  // namespace

static_assert(static_cast<int>(CpuIsaCap::kPortable) == static_cast<int>(SimdIsa::kPortable) &&
              static_cast<int>(CpuIsaCap::kAvx2) == static_cast<int>(SimdIsa::kAvx2) &&
              static_cast<int>(CpuIsaCap::kAvx512) == static_cast<int>(SimdIsa::kAvx512));

CpuIsaCap cpu_isa_cap() {
  static const CpuIsaCap cap = cap_from_environment();
  return cap;
}

const char* cpu_isa_cap_name(CpuIsaCap cap) {
  switch (cap) {
    case CpuIsaCap::kPortable:
      return "portable";
    case CpuIsaCap::kAvx2:
      return "avx2";
    case CpuIsaCap::kAvx512:
      return "avx512";
    case CpuIsaCap::kAvx512Bf16:
      return "avx512_bf16";
    case CpuIsaCap::kAmxBf16:
      return "amx_bf16";
    case CpuIsaCap::kNone:
      return "none";
  }
  return "?";
}

bool cpu_supports(SimdIsa isa) {
  // The cap's first three values are the SimdIsa sets, in the same order.
  if (static_cast<int>(cpu_isa_cap()) < static_cast<int>(isa)) return false;
#if defined(__x86_64__) || defined(__i386__)
  switch (isa) {
    case SimdIsa::kPortable:
      return true;
    case SimdIsa::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case SimdIsa::kAvx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") && cpu_supports(SimdIsa::kAvx2);
  }
  return false;
#else
  return isa == SimdIsa::kPortable;
#endif
}

SimdIsa widest_simd_isa() {
  if (cpu_supports(SimdIsa::kAvx512)) return SimdIsa::kAvx512;
  if (cpu_supports(SimdIsa::kAvx2)) return SimdIsa::kAvx2;
  return SimdIsa::kPortable;
}

SimdIsa simd_isa() {
  const int pinned = g_override.load(std::memory_order_relaxed);
  if (pinned >= 0) return static_cast<SimdIsa>(pinned);
  static const SimdIsa chosen = from_environment();
  return chosen;
}

void set_simd_isa_override(std::optional<SimdIsa> isa) {
  if (isa) CABM_CHECK(cpu_supports(*isa), "set_simd_isa_override: this CPU does not run {} code", simd_isa_name(*isa));
  g_override.store(isa ? static_cast<int>(*isa) : -1, std::memory_order_relaxed);
}

const char* simd_isa_name(SimdIsa isa) {
  // The sets' names are the cap's first three (same order: static_assert above).
  return cpu_isa_cap_name(static_cast<CpuIsaCap>(static_cast<int>(isa)));
}

int64_t cpu_l1d_bytes() {
#if defined(_SC_LEVEL1_DCACHE_SIZE)
  static const int64_t bytes = sysconf_bytes(_SC_LEVEL1_DCACHE_SIZE, int64_t{32} << 10);
#else
  static const int64_t bytes = int64_t{32} << 10;
#endif
  return bytes;
}

namespace {

double measure_avx512_fmas_per_cycle() {
  using Clock = std::chrono::steady_clock;
  // About 0.1 ms each: 12 FMAs per iteration at one or two per cycle, 8 multiplies at 3 cycles.
  constexpr int64_t kFmaIterations = 20000, kChainIterations = 10000;
  float sink = 0;
  double fmas = 0, cycles = 0;  // best per second
  for (int round = 0; round < 8; ++round) {
    auto t0 = Clock::now();
    const double flops = detail::fma_loop_avx512(kFmaIterations, &sink);
    fmas = std::max(fmas, flops / 32 / std::chrono::duration<double>(Clock::now() - t0).count());
    t0 = Clock::now();
    const double n = detail::imul_chain_cycles(kChainIterations);
    cycles = std::max(cycles, n / std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return cycles > 0 ? fmas / cycles : 0.0;
}

}  // namespace

// Kept in the wisdom file: the tile sizes of the fp32 attention kernels follow it (flash.cpp).
double avx512_fmas_per_cycle() {
  static const double rate =
      cpu_supports(SimdIsa::kAvx512) ? machine_value("avx512_fmas_per_cycle", measure_avx512_fmas_per_cycle) : 0.0;
  return rate;
}

int64_t cpu_l2_bytes() {
#if defined(_SC_LEVEL2_CACHE_SIZE)
  static const int64_t bytes = sysconf_bytes(_SC_LEVEL2_CACHE_SIZE, int64_t{1} << 20);
#else
  static const int64_t bytes = int64_t{1} << 20;
#endif
  return bytes;
}

}  // namespace cabm
