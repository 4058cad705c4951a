// Measurement helpers shared by `cabm bench` and `cabm memory`: this machine's FMA peak, a
// resident-memory probe and medians. Benchmarks are not kernels, so these live in cli/.
#pragma once

#include "cabm/core/tensor.h"

#include <cstdint>
#include <string>
#include <vector>

namespace cabm::cli {

// FP32 FLOP/s of a register-only FMA loop on num_threads() threads, in the instruction set the
// dispatched kernels run (cpu_isa.h's simd_isa(); see fma_peak_isa()). Runs for about `seconds`.
double measure_fma_peak(double seconds = 0.3);
const char* fma_peak_isa();  // "avx512", "avx2+fma" or "scalar" (the portable set)

// The peaks of the bf16 product units the bf16 kernels use, measured the same way (FLOPs of
// bf16 pairs: 2 per multiply-add, accumulated in fp32); 0 where the CPU lacks the unit.
//   vdpbf16ps (AVX512_BF16): 16 lanes × 2 pairs per instruction, register-only loop
//   AMX tdpbf16ps (AMX-BF16): 16 × 16 × 32 multiply-adds per instruction on four C tiles
double measure_vdpbf16ps_peak(double seconds = 0.3);
double measure_amx_bf16_peak(double seconds = 0.3);

// "CABM_MAX_CPU_ISA=avx2: ..." where the environment caps what cabm takes the CPU to have
// (cpu_isa.h), so that a table says it ran an older CPU's paths; "" otherwise.
std::string cpu_isa_cap_line();

// Resident memory of this process, from /proc/self/status.
struct MemoryProbe {
  // Resets the peak (VmHWM) to the current RSS by writing 5 to /proc/self/clear_refs (Linux >= 4.0)
  // and records the current RSS. If the reset is not allowed, falls back to the process peak.
  void start();
  // Bytes by which the peak RSS since start() exceeds the RSS at start().
  int64_t peak_increase() const;
  bool reset_worked() const { return reset_ok_; }

 private:
  int64_t base_ = 0;
  bool reset_ok_ = false;
};
int64_t current_rss_bytes();
int64_t peak_rss_bytes();

double median(std::vector<double> values);

// Fills a contiguous F32 tensor with uniform values in [-1, 1) from `seed`: the benchmarks' inputs.
void fill_uniform(const Tensor& t, uint64_t seed);

}  // namespace cabm::cli
