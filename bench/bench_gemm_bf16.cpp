// fp32 gemm against bf16 gemm (bf16 operands, fp32 accumulation), side by side, for the encoder's
// feed-forward shapes (rows = B·N tokens = 4096; E 256/512, F 1024/2048) in the three forms
// training needs: y = x·Wᵀ (form 0), dX = dY·W (form 1), dW += dYᵀ·X (form 2).
//
// Each iteration times one fp32 call and one bf16 call back to back (alternating, so both see the
// same machine load); the counters are the medians over the iterations: fp32 and bf16 GFLOP/s
// (2·M·N·K per call) and bf16/fp32 speed ratio. The label names gemm_bf16's implementation.
//
//   ./build/bf16/bench/bench_gemm_bf16 --benchmark_min_time=0.5
//   CABM_FORCE_PORTABLE=1 ./build/bf16/bench/bench_gemm_bf16    # converted-fp32 path
#include "cabm/core/tensor.h"
#include "cabm/kernels/bf16.h"
#include "cabm/kernels/gemm.h"

#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

namespace {

using cabm::bf16;
using cabm::MatrixRef;
using cabm::MatrixRefBf16;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

std::vector<bf16> to_bf16(const cabm::Tensor& t) {
  std::vector<bf16> out(static_cast<size_t>(t.numel()));
  cabm::float_to_bf16(t.data<float>(), out.data(), t.numel());
  return out;
}

// args: rows (tokens), in, out, form
void BM_GemmFp32VsBf16(benchmark::State& state) {
  const int64_t rows = state.range(0), in = state.range(1), out = state.range(2), form = state.range(3);
  const cabm::Tensor x = cabm::Tensor::full({rows, in}, 0.5f), w = cabm::Tensor::full({out, in}, 0.25f);
  const cabm::Tensor dy = cabm::Tensor::full({rows, out}, 0.125f);
  cabm::Tensor y = cabm::Tensor::zeros({rows, out}), dx = cabm::Tensor::zeros({rows, in});
  cabm::Tensor dw = cabm::Tensor::zeros({out, in});
  const std::vector<bf16> x16 = to_bf16(x), w16 = to_bf16(w), dy16 = to_bf16(dy);

  auto run_fp32 = [&] {
    if (form == 0)
      cabm::gemm({x.data<float>(), rows, in, in}, {w.data<float>(), in, out, in, true}, y.data<float>(), out);
    else if (form == 1)
      cabm::gemm({dy.data<float>(), rows, out, out}, {w.data<float>(), out, in, in}, dx.data<float>(), in);
    else
      cabm::gemm({dy.data<float>(), out, rows, out, true}, {x.data<float>(), rows, in, in}, dw.data<float>(), in,
                 1.0f, 1.0f);
  };
  const MatrixRefBf16 a = form == 0   ? MatrixRefBf16{x16.data(), rows, in, in}
                          : form == 1 ? MatrixRefBf16{dy16.data(), rows, out, out}
                                      : MatrixRefBf16{dy16.data(), out, rows, out, true};
  const MatrixRefBf16 b = form == 0   ? MatrixRefBf16{w16.data(), in, out, in, true}
                          : form == 1 ? MatrixRefBf16{w16.data(), out, in, in}
                                      : MatrixRefBf16{x16.data(), rows, in, in};
  float* c = form == 0 ? y.data<float>() : form == 1 ? dx.data<float>() : dw.data<float>();
  const int64_t ldc = form == 0 ? out : in;
  const float beta = form == 2 ? 1.0f : 0.0f;
  auto run_bf16 = [&] { cabm::gemm_bf16(a, b, c, ldc, 1.0f, beta); };
  run_fp32();  // warm-up: page faults, primitive creation
  run_bf16();

  using clock = std::chrono::steady_clock;
  std::vector<double> t32, t16;
  for (auto _ : state) {
    auto t0 = clock::now();
    run_fp32();
    auto t1 = clock::now();
    run_bf16();
    auto t2 = clock::now();
    benchmark::ClobberMemory();
    t32.push_back(std::chrono::duration<double>(t1 - t0).count());
    t16.push_back(std::chrono::duration<double>(t2 - t1).count());
    state.SetIterationTime(t32.back() + t16.back());
  }
  const double flops = 2.0 * static_cast<double>(rows * in * out);
  const double m32 = median(t32), m16 = median(t16);
  state.counters["fp32_GFLOP/s"] = flops / m32 * 1e-9;
  state.counters["bf16_GFLOP/s"] = flops / m16 * 1e-9;
  state.counters["bf16/fp32"] = m32 / m16;
  state.SetLabel(std::string(cabm::bf16_path_name()) + ", " + cabm::gemm_bf16_implementation(a, b, ldc));
}

void Shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"rows", "in", "out", "form"});
  for (int64_t form : {0, 1, 2}) {
    b->Args({4096, 256, 1024, form});   // linear1, E = 256, F = 1024
    b->Args({4096, 1024, 256, form});   // linear2
    b->Args({4096, 512, 2048, form});   // linear1, E = 512, F = 2048
    b->Args({4096, 2048, 512, form});   // linear2
  }
}

BENCHMARK(BM_GemmFp32VsBf16)->Apply(Shapes)->Unit(benchmark::kMillisecond)->UseManualTime();

}  // namespace

BENCHMARK_MAIN();
