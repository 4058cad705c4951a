// bf16 flash attention (forward and backward) against the fp32 flash kernels, B=1, H=8, d=64
// (N = M given), and the vdpbf16ps peak of this machine measured in the same process.
//
// BM_Vdpbf16psPeak: a register-only loop of independent vdpbf16ps chains on every OpenMP thread
// (2·32 flops per instruction: 16 lanes × 2 products, each a multiply and an add).
// BM_FlashFp32VsBf16: each iteration times one fp32 and one bf16 forward back to back; counters are
// medians: GFLOP/s of both (FlashAttention's convention, 4·B·H·N·M·d), bf16/fp32 speed ratio, and
// the bf16 kernel's share of the peak measured by BM_Vdpbf16psPeak (run it first; same process).
// BM_FlashFp32VsBf16Backward: the same for one fp32 and one bf16 backward per iteration (from each
// kernel's own forward), FLOPs 2.5× the forward's.
// The label names the bf16 path that ran (avx512_bf16, avx2_fp32 or portable).
//
//   ./build/bf16/bench/bench_attention_bf16 --benchmark_min_time=1
//   CABM_FORCE_PORTABLE=1 ./build/bf16/bench/bench_attention_bf16
#include "cabm/core/tensor.h"
#include "cabm/core/threads.h"
#include "cabm/kernels/attention/flash.h"
#include "cabm/kernels/attention/flash_bf16.h"
#include "cabm/kernels/bf16.h"

#include <benchmark/benchmark.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#if defined(__x86_64__)
#include "cabm/kernels/x86_intrinsics.h"
#endif

namespace {

double g_peak_gflops = 0.0;  // from BM_Vdpbf16psPeak, when it ran

#if defined(__x86_64__)
// GCC 12 warns about the undefined vectors inside its AVX-512 reduce intrinsics (false positive).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
// 2 · 16 · 2 = 64 flops per vdpbf16ps; 12 independent accumulators cover the latency.
__attribute__((target("avx512f,avx512bf16"), noinline)) double vdpbf16ps_loop(int64_t iterations) {
  __m512 acc[12];
  for (auto& a : acc) a = _mm512_setzero_ps();
  __m512bh x = (__m512bh)_mm512_set1_epi32(0x3f803f80), y = (__m512bh)_mm512_set1_epi32(0x3c003c00);
  for (int64_t i = 0; i < iterations; ++i) {
#pragma GCC unroll 12
    for (auto& a : acc) a = _mm512_dpbf16_ps(a, x, y);
    __asm__("" : "+v"(x));  // keep the loop from being folded
  }
  __m512 s = acc[0];
  for (int n = 1; n < 12; ++n) s = _mm512_add_ps(s, acc[n]);
  return _mm512_reduce_add_ps(s);
}
#endif

void BM_Vdpbf16psPeak(benchmark::State& state) {
#if defined(__x86_64__)
  if (!cabm::cpu_has_avx512_bf16()) {
    state.SkipWithError("CPU has no avx512_bf16");
    return;
  }
  const int64_t iterations = 20'000'000;
  std::vector<double> gflops;
  for (auto _ : state) {
    double sink = 0;
    const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel reduction(+ : sink)
    sink += vdpbf16ps_loop(iterations);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    benchmark::DoNotOptimize(sink);
    gflops.push_back(64.0 * 12 * static_cast<double>(iterations) * cabm::num_threads() / s * 1e-9);
    state.SetIterationTime(s);
  }
  std::sort(gflops.begin(), gflops.end());
  g_peak_gflops = gflops[gflops.size() / 2];
  state.counters["GFLOP/s"] = g_peak_gflops;
  state.counters["threads"] = cabm::num_threads();
#else
  state.SkipWithError("not x86-64");
#endif
}

cabm::Tensor random_heads(int64_t N, int64_t H, int64_t d, uint64_t seed) {
  cabm::Tensor t = cabm::Tensor::empty({1, N, H, d});
  float* p = t.data<float>();
  uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
  for (int64_t i = 0; i < t.numel(); ++i) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    p[i] = static_cast<float>(x >> 40) / static_cast<float>(1 << 24) * 2.0f - 1.0f;
  }
  return t;
}

cabm::Tensor to_bf16(const cabm::Tensor& t) {
  cabm::Tensor out = cabm::Tensor::empty(t.shape(), cabm::DType::BF16);
  cabm::float_to_bf16(t.data<float>(), out.data<cabm::bf16>(), t.numel());
  return out;
}

// Times fp32 and bf16 calls back to back in each iteration and reports medians: GFLOP/s of both,
// the bf16/fp32 speed ratio, the bf16 kernel's share of the vdpbf16ps peak (when measured), and
// the paths that ran.
template <typename Fp32Call, typename Bf16Call>
void time_side_by_side(benchmark::State& state, Fp32Call fp32_call, Bf16Call bf16_call, double flops,
                       const char* bf16_path) {
  fp32_call();  // warm-up
  bf16_call();
  std::vector<double> t32, t16;
  using clock = std::chrono::steady_clock;
  for (auto _ : state) {
    const auto t0 = clock::now();
    fp32_call();
    const auto t1 = clock::now();
    bf16_call();
    const auto t2 = clock::now();
    t32.push_back(std::chrono::duration<double>(t1 - t0).count());
    t16.push_back(std::chrono::duration<double>(t2 - t1).count());
    state.SetIterationTime(t32.back() + t16.back());
  }
  std::sort(t32.begin(), t32.end());
  std::sort(t16.begin(), t16.end());
  const double m32 = t32[t32.size() / 2], m16 = t16[t16.size() / 2];
  state.counters["fp32_GFLOP/s"] = flops / m32 * 1e-9;
  state.counters["bf16_GFLOP/s"] = flops / m16 * 1e-9;
  state.counters["bf16/fp32"] = m32 / m16;
  if (g_peak_gflops > 0) state.counters["bf16_%peak"] = 100.0 * flops / m16 * 1e-9 / g_peak_gflops;
  state.SetLabel(std::string("bf16 path ") + bf16_path + ", fp32 " + cabm::flash_isa());
}

// args: N (= M), causal
void BM_FlashFp32VsBf16(benchmark::State& state) {
  const int64_t N = state.range(0), H = 8, d = 64;
  const bool causal = state.range(1) != 0;
  const cabm::Tensor q = random_heads(N, H, d, 1), k = random_heads(N, H, d, 2), v = random_heads(N, H, d, 3);
  const cabm::Tensor qb = to_bf16(q), kb = to_bf16(k), vb = to_bf16(v);
  cabm::Tensor out = cabm::Tensor::zeros({1, N, H, d}), out16 = cabm::Tensor::zeros({1, N, H, d});
  cabm::AttentionOptions options;
  if (causal) options.mask = cabm::Mask::causal();
  const double flops = 4.0 * H * static_cast<double>(N) * static_cast<double>(N) * d * (causal ? 0.5 : 1.0);
  time_side_by_side(
      state, [&] { cabm::attention_flash_forward(q, k, v, options, out); },
      [&] { cabm::attention_flash_bf16_forward(qb, kb, vb, options, out16); }, flops, cabm::attention_flash_bf16_path());
}

// args: N (= M), causal
void BM_FlashFp32VsBf16Backward(benchmark::State& state) {
  const int64_t N = state.range(0), H = 8, d = 64;
  const bool causal = state.range(1) != 0;
  const cabm::Tensor q = random_heads(N, H, d, 1), k = random_heads(N, H, d, 2), v = random_heads(N, H, d, 3);
  const cabm::Tensor g = random_heads(N, H, d, 4);
  const cabm::Tensor qb = to_bf16(q), kb = to_bf16(k), vb = to_bf16(v);
  cabm::Tensor out = cabm::Tensor::zeros({1, N, H, d}), out16 = cabm::Tensor::zeros({1, N, H, d});
  cabm::Tensor lse = cabm::Tensor::zeros({1, H, N}), lse16 = cabm::Tensor::zeros({1, H, N});
  cabm::AttentionOptions options;
  if (causal) options.mask = cabm::Mask::causal();
  cabm::attention_flash_forward(q, k, v, options, out, &lse);
  cabm::attention_flash_bf16_forward(qb, kb, vb, options, out16, &lse16);
  const cabm::AttentionGrads grads{cabm::Tensor::zeros(q.shape()), cabm::Tensor::zeros(k.shape()),
                                   cabm::Tensor::zeros(v.shape())};
  const cabm::AttentionSaved saved{q, k, v, out, lse}, saved16{qb, kb, vb, out16, lse16};
  const double flops = 2.5 * 4.0 * H * static_cast<double>(N) * static_cast<double>(N) * d * (causal ? 0.5 : 1.0);
  time_side_by_side(
      state, [&] { cabm::attention_flash_backward(saved, g, options, grads); },
      [&] { cabm::attention_flash_bf16_backward(saved16, g, options, grads); }, flops,
      cabm::attention_flash_bf16_backward_path());
}

BENCHMARK(BM_Vdpbf16psPeak)->UseManualTime()->Iterations(5)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_FlashFp32VsBf16)
    ->ArgNames({"N", "causal"})
    ->Args({4096, 0})
    ->Args({4096, 1})
    ->Args({1024, 0})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_FlashFp32VsBf16Backward)
    ->ArgNames({"N", "causal"})
    ->Args({4096, 0})
    ->Args({4096, 1})
    ->Args({1024, 0})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
