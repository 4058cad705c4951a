// GEMM throughput for the shapes the encoder uses (rows = B·N tokens): the QKV projection,
// the output projection, and the two feed-forward maps, in the three forms training needs
// (y = x Wᵀ, dX = dY W, dW = dYᵀ X). Prints GFLOP/s (2·M·N·K per call).
//
//   ./build/release/bench/bench_gemm --benchmark_min_time=0.2
#include "cabm/kernels/gemm.h"
#include "cabm/core/tensor.h"

#include <benchmark/benchmark.h>

namespace {

using cabm::MatrixRef;

// args: rows (tokens), in, out, form (0: x·Wᵀ, 1: dY·W, 2: dYᵀ·X)
void BM_Gemm(benchmark::State& state) {
  const int64_t rows = state.range(0), in = state.range(1), out = state.range(2), form = state.range(3);
  cabm::Tensor x = cabm::Tensor::full({rows, in}, 0.5f), w = cabm::Tensor::full({out, in}, 0.25f);
  cabm::Tensor dy = cabm::Tensor::full({rows, out}, 0.125f);
  cabm::Tensor y = cabm::Tensor::zeros({rows, out}), dx = cabm::Tensor::zeros({rows, in});
  cabm::Tensor dw = cabm::Tensor::zeros({out, in});
  for (auto _ : state) {
    if (form == 0)
      cabm::gemm({x.data<float>(), rows, in, in}, {w.data<float>(), in, out, in, true}, y.data<float>(), out);
    else if (form == 1)
      cabm::gemm({dy.data<float>(), rows, out, out}, {w.data<float>(), out, in, in}, dx.data<float>(), in);
    else
      cabm::gemm({dy.data<float>(), out, rows, out, true}, {x.data<float>(), rows, in, in}, dw.data<float>(), in,
                 1.0f, 1.0f);
    benchmark::ClobberMemory();
  }
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * rows * in * out * state.iterations() / 1e9,
                                                 benchmark::Counter::kIsRate);
}

void Shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"rows", "in", "out", "form"});
  for (int64_t form : {0, 1, 2}) {
    b->Args({4096, 256, 768, form});   // QKV, E = 256
    b->Args({4096, 256, 256, form});   // out_proj
    b->Args({4096, 256, 1024, form});  // linear1, F = 4E
    b->Args({4096, 1024, 256, form});  // linear2
    b->Args({4096, 512, 1536, form});  // QKV, E = 512
  }
}

BENCHMARK(BM_Gemm)->Apply(Shapes)->Unit(benchmark::kMicrosecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
