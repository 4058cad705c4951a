// Attention kernels: flash (tiled, O(N) memory) against the reference (row at a time, scalar) and
// against "materialise S": S = Q Kᵀ with gemm(), softmax in place, O = P V with gemm(), one head at
// a time. Inputs are head views of one fused [B, N, 3·H·d] projection, as nn/ produces them.
//
// Counter GFLOP/s follows FlashAttention's convention: forward 4·B·H·N·M·d, backward 2.5× that,
// counting only attended pairs: causal halves it, a sliding window of w keys counts N·w pairs.
//
//   OMP_NUM_THREADS=2 build/release/bench/bench_attention --benchmark_filter=Flash
//       --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
//
// Args: {d, N, mask} with mask 0 none, 1 causal, 2 sliding window (kWindow keys to the left, incl.
// the query's own position). M = N, B = 1, H = 8.
#include "cabm/core/rng.h"
#include "cabm/core/tensor.h"
#include "cabm/kernels/attention/flash.h"
#include "cabm/kernels/attention/reference.h"
#include "cabm/kernels/gemm.h"

#include <benchmark/benchmark.h>

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace cabm {
namespace {

constexpr int64_t kB = 1, kH = 8, kWindow = 256;

struct Problem {
  int64_t d, N, mask_kind;
  Tensor qkv, q, k, v, out, lse, dout;
  AttentionOptions options;
  AttentionGrads grads;
  Tensor grad_buffer;

  explicit Problem(const benchmark::State& state)
      : d(state.range(0)), N(state.range(1)), mask_kind(state.range(2)) {
    const int64_t E = kH * d;
    qkv = Tensor::empty({kB, N, 3 * E});
    fill_random(qkv, 1);
    const Tensor heads = qkv.view({kB, N, 3, kH, d});
    q = heads.select(2, 0);
    k = heads.select(2, 1);
    v = heads.select(2, 2);
    out = Tensor::empty({kB, N, kH, d});
    lse = Tensor::empty({kB, kH, N});
    dout = Tensor::empty({kB, N, kH, d});
    fill_random(dout, 2);
    grad_buffer = Tensor::empty({kB, N, 3, kH, d});
    grads = {grad_buffer.select(2, 0), grad_buffer.select(2, 1), grad_buffer.select(2, 2)};
    if (mask_kind == 1) options.mask = Mask::causal();
    if (mask_kind == 2) options.mask = Mask::sliding_window(kWindow - 1, 0);
  }

  static void fill_random(const Tensor& t, uint64_t seed) {
    float* p = t.data<float>();
    Rng rng(seed);
    for (int64_t n = 0; n < t.numel(); ++n) p[n] = 2.0f * rng.next_uniform() - 1.0f;
  }

  // Attended (query, key) pairs.
  double pairs() const {
    if (mask_kind == 1) return 0.5 * static_cast<double>(N) * static_cast<double>(N + 1);
    if (mask_kind == 2) {
      double total = 0;
      for (int64_t i = 0; i < N; ++i) total += static_cast<double>(std::min(i + 1, kWindow));
      return total;
    }
    return static_cast<double>(N) * static_cast<double>(N);
  }
  double forward_flops() const { return 4.0 * kB * kH * pairs() * static_cast<double>(d); }
};

// max |a − b| over two [B, N, H, d] outputs: each baseline is checked against flash once.
double max_diff(const Tensor& a, const Tensor& b) {
  const std::vector<float> x = a.to_vector(), y = b.to_vector();
  double m = 0;
  for (size_t n = 0; n < x.size(); ++n) m = std::max(m, static_cast<double>(std::fabs(x[n] - y[n])));
  return m;
}

Tensor flash_output(const Problem& p) {
  Tensor out = Tensor::empty(p.out.shape());
  attention_flash_forward(p.q, p.k, p.v, p.options, out);
  return out;
}

void set_counters(benchmark::State& state, double flops_per_iteration) {
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops_per_iteration * 1e-9 * static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
  state.counters["threads"] = omp_get_max_threads();
}

void BM_FlashForward(benchmark::State& state) {
  Problem p(state);
  for (auto _ : state) {
    attention_flash_forward(p.q, p.k, p.v, p.options, p.out, &p.lse);
    benchmark::ClobberMemory();
  }
  set_counters(state, p.forward_flops());
}

void BM_FlashBackward(benchmark::State& state) {
  Problem p(state);
  attention_flash_forward(p.q, p.k, p.v, p.options, p.out, &p.lse);
  const AttentionSaved saved{p.q, p.k, p.v, p.out, p.lse};
  for (auto _ : state) {
    attention_flash_backward(saved, p.dout, p.options, p.grads);
    benchmark::ClobberMemory();
  }
  set_counters(state, 2.5 * p.forward_flops());
}

void BM_ReferenceForward(benchmark::State& state) {
  Problem p(state);
  for (auto _ : state) {
    attention_reference_forward(p.q, p.k, p.v, p.options, p.out, nullptr, &p.lse);
    benchmark::ClobberMemory();
  }
  set_counters(state, p.forward_flops());
  state.counters["diff_vs_flash"] = max_diff(p.out, flash_output(p));
}

void BM_ReferenceBackward(benchmark::State& state) {
  Problem p(state);
  attention_reference_forward(p.q, p.k, p.v, p.options, p.out);
  const AttentionSaved saved{p.q, p.k, p.v, p.out, Tensor()};
  for (auto _ : state) {
    attention_reference_backward(saved, p.dout, p.options, p.grads);
    benchmark::ClobberMemory();
  }
  set_counters(state, 2.5 * p.forward_flops());
}

// S = scale·Q Kᵀ (gemm), masked, row softmax (threads over rows), O = P V (gemm); per head, with
// the N×N matrix in memory. gemm parallelises internally.
void BM_GemmMaterialisedForward(benchmark::State& state) {
  Problem p(state);
  const int64_t N = p.N, d = p.d, ld = 3 * kH * d;
  std::vector<float> s(static_cast<size_t>(N * N));
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  for (auto _ : state) {
    for (int64_t h = 0; h < kH; ++h) {
      const float* qh = p.q.data<float>() + h * d;
      const float* kh = p.k.data<float>() + h * d;
      const float* vh = p.v.data<float>() + h * d;
      gemm({qh, N, d, ld}, {kh, d, N, ld, true}, s.data(), N, scale);
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < N; ++i) {
        float* row = s.data() + i * N;
        int64_t lo = 0, hi = N;  // attended keys [lo, hi)
        if (p.mask_kind >= 1) hi = i + 1;
        if (p.mask_kind == 2) lo = std::max<int64_t>(0, i - kWindow + 1);
        float mx = -INFINITY;
        for (int64_t j = lo; j < hi; ++j) mx = std::max(mx, row[j]);
        float sum = 0;
        for (int64_t j = 0; j < N; ++j) {
          row[j] = j >= lo && j < hi ? std::exp(row[j] - mx) : 0.0f;
          sum += row[j];
        }
        const float inv = 1.0f / sum;
        for (int64_t j = lo; j < hi; ++j) row[j] *= inv;
      }
      gemm({s.data(), N, N, N}, {vh, N, d, ld}, p.out.data<float>() + h * d, kH * d);
    }
    benchmark::ClobberMemory();
  }
  set_counters(state, p.forward_flops());
  state.counters["diff_vs_flash"] = max_diff(p.out, flash_output(p));
}

void all_sizes(benchmark::internal::Benchmark* b, int64_t max_n) {
  for (int64_t mask : {0, 1, 2})
    for (int64_t d : {64, 128})
      for (int64_t n : {512, 1024, 2048, 4096})
        if (n <= max_n) b->Args({d, n, mask});
  b->ArgNames({"d", "N", "mask"})->Unit(benchmark::kMillisecond)->UseRealTime();
}

BENCHMARK(BM_FlashForward)->Apply([](auto* b) { all_sizes(b, 4096); });
BENCHMARK(BM_FlashBackward)->Apply([](auto* b) { all_sizes(b, 4096); });
BENCHMARK(BM_GemmMaterialisedForward)->Apply([](auto* b) { all_sizes(b, 4096); });
// The scalar reference is ~50× slower: sizes up to 1024 keep a run short.
BENCHMARK(BM_ReferenceForward)->Apply([](auto* b) { all_sizes(b, 1024); });
BENCHMARK(BM_ReferenceBackward)->Apply([](auto* b) { all_sizes(b, 512); });

}  // namespace
}  // namespace cabm

BENCHMARK_MAIN();
