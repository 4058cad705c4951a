// Which library runs a gemm() product: decided on the machine it runs on, not by a rule measured
// on another CPU. (Measured with bench/bench_gemm_libraries: on an AMD Zen 3 in session 4 OpenBLAS
// beat oneDNN by 1.2–1.9× on the weight-gradient products Aᵀ·B, and lost on all but one product
// there in session 10 with Debian's current libraries; on an Intel Xeon with AVX-512 it lost by
// 2–30× on most of them. A threshold that was right on one was 4–6× wrong on the other.)
//
// The first product of a given form and class (transposes; M, N, K each rounded up to a
// power of two; the exact leading dimensions; thread count) that is large enough to matter is timed on both
// libraries, in alternation, and the faster one is kept for the rest of the process; OpenBLAS must win by 10% to be
// taken (oneDNN is the default and the one cabm's bf16 products use). Smaller products always run on oneDNN.
//
// The decisions are also kept on disk (machine_wisdom.h: the file, CABM_GEMM_WISDOM), so that every
// process on one machine makes the same choice (the two libraries round differently; a resumed
// training run must take the same routes as the uninterrupted one to reproduce it bit for bit).
//   CABM_GEMM=onednn|openblas|auto   pins every product to one library (default auto).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace cabm {

enum class GemmLibrary { kOneDnn, kOpenBlas };

std::string gemm_library_name(GemmLibrary library);  // "oneDNN" | "OpenBLAS"

// One product's form and shape, as the decision is keyed.
struct GemmShape {
  bool ta = false, tb = false;
  int64_t M = 0, N = 0, K = 0, lda = 0, ldb = 0, ldc = 0;
  int threads = 1;
  std::string key() const;  // the class: "TN M~1024 N~256 K~4096 ld 1024 256 256 t2"
};

// Products with fewer multiply-adds than this are not timed: they run on oneDNN.
inline constexpr int64_t kGemmRouteMinMacs = int64_t{1} << 24;
// OpenBLAS is taken only when its best time is below this fraction of oneDNN's and it was that
// much faster in at least kGemmRouteOpenBlasRoundWins of the kGemmRouteRounds rounds.
inline constexpr double kGemmRouteOpenBlasMargin = 0.9;
inline constexpr int kGemmRouteRounds = 4;
inline constexpr int kGemmRouteOpenBlasRoundWins = 3;

// Times one call of the product on `library` (seconds).
using GemmTrial = std::function<double(GemmLibrary)>;

// The library for `shape`: the pin, else the decision cached in memory or in the wisdom file,
// else a new decision made by timing `trial`: four rounds, each running both libraries twice in
// a row (the first call of a pair only warms up: a library called right after the other finds
// the threads and caches in the other's state), the order swapped every round; OpenBLAS must win
// on each library's best time and in three of the four rounds (on a shared machine one call
// slowed by another process made best times alone pick a library 2.4× slower; AMD Zen 3, session
// 10). Thread-safe; decisions are serialised.
GemmLibrary gemm_route(const GemmShape& shape, const GemmTrial& trial);

// Every decision this process made or loaded, for `cabm bench` and logs.
struct GemmRouteDecision {
  std::string key;
  GemmLibrary library;
  double onednn_seconds = 0, openblas_seconds = 0;  // best trial times (0 when loaded)
  bool from_wisdom = false;
  int openblas_round_wins = 0;  // rounds OpenBLAS won by the margin (0 when loaded)
};
std::vector<GemmRouteDecision> gemm_route_decisions();
// "gemm routes: 3 timed here, 2 from <file>: TN M768 ... -> OpenBLAS (1.21 vs 1.48 ms), ..." or
// the pin. One line.
std::string gemm_route_summary();

// Tests: replace the pin (nullopt: auto) and forget every decision; `wisdom` replaces the
// file's path for this process ("off": none) and forgets the machine values (wisdom::reset).
void set_gemm_library_override(std::optional<GemmLibrary> library);
void reset_gemm_routes(const std::optional<std::string>& wisdom = std::nullopt);
int64_t gemm_route_trials();  // how many decisions were timed in this process

}  // namespace cabm
