// Which library should back gemm()? oneDNN 2.6's sgemm against OpenBLAS 0.3.21's cblas_sgemm
// (Debian's OpenMP build, the one cabm links), and cabm's gemm() (which picks one per product, see
// cabm/kernels/gemm_route.h: timed on this machine), on the products one encoder layer's training step makes (rows = B·N tokens):
// y = x·Wᵀ, dX = dY·W and dW = dYᵀ·X for the QKV projection, the output projection and the two
// feed-forward maps of a model of width E and feed-forward width F.
//
//   OMP_NUM_THREADS=2 build/release/bench/bench_gemm_libraries [rows E F [rounds]]   (default 4096 256 1024 5)
//
// All three see the same operands (64-byte aligned, natural leading dimensions). Each runs a
// block of calls; blocks alternate, and the median call time of each is reported (GFLOP/s,
// 2·M·N·K per call). All three run on libgomp's one pool of threads (OpenBLAS's OpenMP build), so
// no library's threads spin beside another's. Blocks follow each other without the 50 ms pause
// they once had: after it, on a two-vCPU VM, about one block in five ran with both threads on one
// vCPU, 4-5× slower, which put some rows' medians at 0.2-0.3 of the faster library (session 29).
#include "cabm/core/threads.h"
#include "cabm/kernels/gemm.h"
#include "cabm/kernels/gemm_route.h"

#include <cblas.h>
#include <dnnl.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

namespace {

struct Product {
  const char* name;
  int M, N, K;
  bool ta, tb;  // op(A) = Aᵀ, op(B) = Bᵀ
};

struct FreeDeleter {
  void operator()(float* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<float, FreeDeleter>;

Buffer random_buffer(size_t n) {
  auto* p = static_cast<float*>(std::aligned_alloc(64, (n * sizeof(float) + 63) / 64 * 64));
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<float>(std::rand() % 1000) / 1000.0f - 0.5f;
  return Buffer(p);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  // Default: the big training preset, B·N = 32 · 128, E 256, F 1024.
  const int rows = argc > 3 ? std::atoi(argv[1]) : 4096, E = argc > 3 ? std::atoi(argv[2]) : 256;
  const int F = argc > 3 ? std::atoi(argv[3]) : 1024, rounds = argc > 4 ? std::atoi(argv[4]) : 5;
  if (rows <= 0 || E <= 0 || F <= 0 || rounds <= 0) {
    std::fprintf(stderr, "usage: bench_gemm_libraries [rows E F [rounds]] (positive integers)\n");
    return 2;
  }
  constexpr int kCallsPerBlock = 4;
  std::vector<Product> products;
  const int layers[][2] = {{E, 3 * E}, {E, E}, {E, F}, {F, E}};  // in, out
  const char* names[] = {"QKV", "out_proj", "linear1", "linear2"};
  for (int l = 0; l < 4; ++l) {
    const int in = layers[l][0], out = layers[l][1];
    products.push_back({names[l], rows, out, in, false, true});   // y = x·Wᵀ
    products.push_back({names[l], rows, in, out, false, false});  // dX = dY·W
    products.push_back({names[l], out, in, rows, true, false});   // dW = dYᵀ·X
  }
  const char* forms[] = {"y = x.W^T", "dX = dY.W", "dW = dY^T.X"};

  std::printf("rows %d, E %d, F %d, %d threads\n\n", rows, E, F, omp_get_max_threads());
  std::printf("| map | product | M | N | K | oneDNN sgemm | cabm gemm() | OpenBLAS | gemm() / faster | gemm() route |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|\n");
  for (size_t i = 0; i < products.size(); ++i) {
    const Product& s = products[i];
    const int lda = s.ta ? s.M : s.K, ldb = s.tb ? s.K : s.N;
    const Buffer a = random_buffer(static_cast<size_t>(s.M) * s.K), b = random_buffer(static_cast<size_t>(s.K) * s.N);
    const Buffer c = random_buffer(static_cast<size_t>(s.M) * s.N);
    const cabm::MatrixRef a_ref{a.get(), s.M, s.K, lda, s.ta}, b_ref{b.get(), s.K, s.N, ldb, s.tb};
    std::vector<double> times[3];
    for (int round = 0; round < rounds + 1; ++round) {
      for (int lib = 0; lib < 3; ++lib) {
        for (int call = 0; call < kCallsPerBlock; ++call) {
          const auto t0 = std::chrono::steady_clock::now();
          if (lib == 0)
            dnnl_sgemm(s.ta ? 'T' : 'N', s.tb ? 'T' : 'N', s.M, s.N, s.K, 1.0f, a.get(), lda, b.get(), ldb, 0.0f,
                       c.get(), s.N);
          else if (lib == 1)
            cabm::gemm(a_ref, b_ref, c.get(), s.N);
          else
            cblas_sgemm(CblasRowMajor, s.ta ? CblasTrans : CblasNoTrans, s.tb ? CblasTrans : CblasNoTrans, s.M, s.N,
                        s.K, 1.0f, a.get(), lda, b.get(), ldb, 0.0f, c.get(), s.N);
          const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          if (round > 0 && call > 0) times[lib].push_back(t);  // round 0 and each block's first call: warm-up
        }
      }
    }
    const double gflop = 2.0 * s.M * s.N * s.K / 1e9;
    const double onednn = gflop / median(times[0]), wrapped = gflop / median(times[1]);
    const double openblas = gflop / median(times[2]);
    const std::string key = cabm::GemmShape{s.ta, s.tb, s.M, s.N, s.K, lda, ldb, s.N, cabm::num_threads()}.key();
    std::string route = "oneDNN (not timed: small)";
    for (const auto& d : cabm::gemm_route_decisions())
      if (d.key == key) route = cabm::gemm_library_name(d.library) + (d.from_wisdom ? " (wisdom)" : " (timed)");
    std::printf("| %s | %s | %d | %d | %d | %.1f | %.1f | %.1f | %.2f | %s |\n", s.name, forms[i % 3], s.M, s.N, s.K,
                onednn, wrapped, openblas, wrapped / std::max(onednn, openblas), route.c_str());
  }
  std::printf("\n%s\n", cabm::gemm_route_summary().c_str());
  return 0;
}
