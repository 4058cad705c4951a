// One key tile of the AMX bf16 attention forward on one core, taken apart: S = Q·Kᵀ and
// O += P·V alone (detail::tile_gemm) and the whole tile (detail::amx_forward_tile: both products,
// the online softmax's row pass and the O rescale), against a loop of independent tdpbf16ps in
// the same process. What the whole tile costs beyond its two products is the per-row work that
// limits the AMX forward (docs/amx_attention.md). Data stays in cache (one tile, repeated): this is
// the kernel's floor, not the kernel.
//
//   taskset -c 0 ./build/release/bench/bench_amx_tile              (needs AMX-BF16)
//   ./build/release/bench/bench_amx_tile --emulated                (any AVX-512 BF16 CPU: the
//       scalar tile model, to check the benchmark itself; its times mean nothing)
//
// Times are the best of 7 rounds (the machine may be shared); GFLOP/s count 2·rows·keys·d per
// product, and the whole tile's count both.
#include "cabm/kernels/aligned_vector.h"
#include "cabm/kernels/attention/amx_tile_gemm.h"
#include "cabm/kernels/attention/flash_amx.h"
#include "cabm/kernels/bf16.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <utility>
#include <vector>

namespace cabm::detail {
namespace {

#if defined(__x86_64__)

template <class F>
double best_ns(F&& f, int64_t iterations) {
  double best = 1e300;
  for (int round = 0; round < 7; ++round) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < iterations; ++i) f();
    const double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
    best = std::min(best, ns / static_cast<double>(iterations));
  }
  return best;
}

// 4 accumulator tiles, 256 tdpbf16ps per call, each 16·16·32 multiply-adds.
template <class Tiles>
CABM_AMX void tdp_loop() {
  for (int i = 0; i < 64; ++i) {
    Tiles::template dpbf16ps<0, 4, 6>();
    Tiles::template dpbf16ps<1, 4, 7>();
    Tiles::template dpbf16ps<2, 5, 6>();
    Tiles::template dpbf16ps<3, 5, 7>();
  }
}

template <class Tiles>
CABM_AMX double loop_gflops(int64_t iterations) {
  [&]<int... T>(std::integer_sequence<int, T...>) {
    (Tiles::template zero<T>(), ...);
  }
  (std::make_integer_sequence<int, 8>{});
  const double ns = best_ns(tdp_loop<Tiles>, iterations);
  return 256.0 * 2 * 16 * 16 * 32 / ns;
}

// Buffers of one tile in the layouts of attention/flash_amx.h, filled with small finite values.
struct TileData {
  int64_t rows16, lds;
  // 64-byte aligned, as the kernel's (before session 31 neither was, and both ran slower).
  AlignedVector<bf16> q, k, v, p;
  AlignedVector<float> s, o, m, l, alpha;
  TileData(int64_t d, int64_t ni, int64_t nk) : rows16((ni + 15) / 16 * 16), lds((nk + 31) / 32 * 32) {
    const auto fill = [](AlignedVector<bf16>& x, int64_t n, int period) {
      x.resize(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) x[static_cast<size_t>(i)] = float_to_bf16(0.01f * static_cast<float>(i % period));
    };
    fill(q, rows16 * d, 7);
    fill(k, (nk + 32) * d, 5);  // P·V reads up to 16 keys past the tile: padding, as the kernel's
    fill(v, (nk + 32) * d, 3);
    fill(p, rows16 * lds, 11);
    s.assign(static_cast<size_t>(rows16 * lds), 0.0f);
    o.assign(static_cast<size_t>(rows16 * d), 0.0f);
    m.assign(static_cast<size_t>(rows16), 0.0f), l = m, alpha = m;
  }
};

template <class Tiles>
CABM_AMX void run(Bf16Products run_on, int64_t scale) {
  amx_tiles_begin(run_on);  // the hardware's tile configuration (the model needs none)
  std::printf("tdpbf16ps loop, 4 tiles, one core: %.0f GFLOP/s\n\n",
              loop_gflops<Tiles>(std::max<int64_t>(1, 200 / scale)));
  std::printf("%4s %5s %5s | %9s %8s | %9s %8s | %10s %8s %10s %9s\n", "d", "rows", "keys", "S=QK^T us", "GFLOP/s",
              "O+=PV us", "GFLOP/s", "tile us", "GFLOP/s", "rest us", "ns/pair");
  const std::pair<int64_t, int64_t> shapes[] = {{64, 96}, {32, 96}, {32, 384}, {32, 768}, {64, 768}};
  for (int64_t d : {64, 128})
    for (const auto& [ni, nk] : shapes) {
      TileData t(d, ni, nk);
      const int64_t nk16 = (nk + 15) / 16 * 16, iterations = std::max<int64_t>(2, 4000000 / (ni * nk) / scale);
      const double qk = best_ns(
          [&] {
            tile_gemm<Tiles>(t.rows16, nk16, d, t.q.data(), d, {t.k.data(), 32, 16 * d}, t.s.data(), t.lds, false);
          },
          iterations);
      const double pv = best_ns(
          [&] {
            tile_gemm<Tiles>(t.rows16, d, t.lds, t.p.data(), t.lds, {t.v.data(), 2 * d, 32}, t.o.data(), d, true);
          },
          iterations);
      const AmxForwardTile tile{t.q.data(), d,          ni,         t.k.data(),     t.v.data(), nk,
                                d,          nullptr,    nullptr,    t.s.data(),     t.p.data(), t.lds,
                                t.o.data(), t.m.data(), t.l.data(), t.alpha.data(), 0.1f,       nullptr,
                                0,          0,          nullptr};
      const double whole = best_ns(
          [&] {
            std::fill(t.m.begin(), t.m.end(), -1e30f);  // a first tile: every row rescales
            std::fill(t.o.begin(), t.o.end(), 0.0f);
            amx_forward_tile(tile, run_on);
          },
          iterations);
      const double flops = 2.0 * static_cast<double>(ni * nk * d);
      std::printf("%4ld %5ld %5ld | %9.2f %8.0f | %9.2f %8.0f | %10.2f %8.0f %10.2f %9.3f\n", static_cast<long>(d),
                  static_cast<long>(ni), static_cast<long>(nk), qk / 1e3, flops / qk, pv / 1e3, flops / pv, whole / 1e3,
                  2 * flops / whole, (whole - qk - pv) / 1e3, whole / static_cast<double>(ni * nk));
    }
  amx_tiles_end(run_on);
}

#endif

}  // namespace
}  // namespace cabm::detail

int main(int argc, char** argv) {
  using namespace cabm;
  const bool emulated = argc > 1 && std::strcmp(argv[1], "--emulated") == 0;
#if defined(__x86_64__)
  if (emulated) {
    if (!cpu_has_avx512_bf16()) {
      std::printf("bench_amx_tile --emulated: this CPU has no AVX-512 BF16, which the tile model's softmax needs\n");
      return 0;
    }
    std::printf("bench_amx_tile: the scalar tile model (times mean nothing)\n");
    detail::run<detail::EmulatedTiles>(detail::Bf16Products::kAmxEmulated, 1000);
    return 0;
  }
  if (!bf16_amx_active()) {
    std::printf("bench_amx_tile: skipped, this CPU (or OS) has no AMX-BF16 tiles, or CABM_NO_AMX is set\n");
    return 0;
  }
  detail::run<detail::HardwareTiles>(detail::Bf16Products::kAmxTiles, 1);
#else
  (void)emulated;
  std::printf("bench_amx_tile: skipped, not an x86-64 build\n");
#endif
  return 0;
}
