// `cabm bench decode`: one-token decoding against a long KV cache (the split-key kernel,
// cabm/kernels/attention/decode.h), reported as GB/s of K and V read, beside the memory-copy
// bandwidth of this machine measured in the same run: bytes copied per second by a parallel
// memcpy of a buffer larger than the caches (each byte read once and written once; STREAM
// would count both and report twice this figure).
//
// Decoding reads every cached key and value once per key/value head (GQA: once per group of
// query heads, not once per query head) and does a few FLOPs per byte, so it is bounded by
// memory bandwidth: the ratio to the copy bandwidth is the figure of merit.
#include "cli/bench_util.h"
#include "cli/commands.h"
#include "cli/flags.h"
#include "cabm/core/memory.h"
#include "cabm/core/threads.h"
#include "cabm/kernels/attention/attention.h"
#include "cabm/kernels/bf16.h"

#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace cabm::cli {

namespace {

using Clock = std::chrono::steady_clock;

struct DecodeFlags {
  std::vector<int64_t> m = {4096, 16384, 65536};
  std::vector<int64_t> d = {64, 128};
  int64_t batch = 1, heads = 32, kv_heads = 8, repeats = 5;
  std::string precision = "both";
  int threads = 0;
  CLI::Option* threads_option = nullptr;
};

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Median seconds of `repeats` calls after one warm-up call.
template <typename F>
double time_median(int64_t repeats, F&& f) {
  f();
  std::vector<double> t;
  for (int64_t r = 0; r < repeats; ++r) {
    const auto t0 = Clock::now();
    f();
    t.push_back(seconds_since(t0));
  }
  return median(t);
}

// Bytes copied per second by memcpy over `bytes`, split between the threads as the kernel is.
double measure_copy_bandwidth(int64_t bytes, int64_t repeats) {
  const int64_t n = bytes / 4;
  std::vector<float> a(static_cast<size_t>(n), 1.0f), b(static_cast<size_t>(n), 0.0f);
  const double seconds = time_median(repeats, [&] {
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < 64; ++c) {
      const int64_t begin = n * c / 64, end = n * (c + 1) / 64;
      std::memcpy(b.data() + begin, a.data() + begin, static_cast<size_t>(end - begin) * 4);
    }
  });
  return static_cast<double>(bytes) / seconds;
}

Tensor random_tensor(const Shape& shape, uint64_t seed) {
  Tensor t = Tensor::empty(shape);
  fill_uniform(t, seed);
  return t;
}

void bench_decode(const DecodeFlags& f) {
  apply_threads(f.threads_option, f.threads);
  if (f.heads % f.kv_heads != 0)
    throw UsageError(fmt::format("--heads ({}) must be a multiple of --kv-heads ({})", f.heads, f.kv_heads));
  // Sizes are each in range; their product is checked before anything is allocated.
  double largest = 0;
  for (int64_t M : f.m)
    for (int64_t d : f.d)
      largest = std::max(largest, static_cast<double>(f.batch) * static_cast<double>(M) *
                                      static_cast<double>(f.kv_heads) * 2.0 * static_cast<double>(d) * 4.0);
  const double copy_bytes = std::max(largest, 256.0 * (1 << 20));
  check_fits_in_memory(1.5 * largest + 2.0 * copy_bytes,
                       fmt::format("bench decode --batch {} --kv-heads {} with the largest --m and --d", f.batch,
                                   f.kv_heads));
  const double copy = measure_copy_bandwidth(static_cast<int64_t>(copy_bytes), f.repeats);
  std::printf("decode: B %lld, N 1, H %lld query heads over %lld key/value heads, %d threads\n",
              static_cast<long long>(f.batch), static_cast<long long>(f.heads), static_cast<long long>(f.kv_heads),
              num_threads());
  std::printf("kernel: %s vectors (chosen at run time; CABM_SIMD_ISA=portable|avx2|avx512 pins it)\n",
              attention_decode_isa());
  std::printf("memory-copy bandwidth (same run, bytes copied per second): %.1f GB/s\n", copy * 1e-9);
  std::printf("GB/s: K and V bytes read per second; %%copy: of the copy bandwidth above\n\n");
  std::printf("%8s %5s %6s %10s %9s %8s %7s\n", "M", "d", "cache", "KV_MiB", "ms", "GB/s", "%copy");
  const bool fp32 = f.precision != "bf16", bf16 = f.precision != "fp32";
  for (int64_t d : f.d) {
    for (int64_t M : f.m) {
      const Tensor q = random_tensor({f.batch, 1, f.heads, d}, 1);
      const Tensor k = random_tensor({f.batch, M, f.kv_heads, d}, 2), v = random_tensor({f.batch, M, f.kv_heads, d}, 3);
      Tensor out = Tensor::empty({f.batch, 1, f.heads, d});
      AttentionOptions options;
      options.mask = Mask::causal();
      for (int which = 0; which < 2; ++which) {
        if ((which == 0 && !fp32) || (which == 1 && !bf16)) continue;
        const Tensor qa = which ? rounded_to_bf16(q) : q, ka = which ? rounded_to_bf16(k) : k,
                     va = which ? rounded_to_bf16(v) : v;
        const double s = time_median(f.repeats, [&] { attention_forward(qa, ka, va, options, out); });
        const double bytes = static_cast<double>(ka.nbytes() + va.nbytes());
        std::printf("%8lld %5lld %6s %10.1f %9.3f %8.1f %6.0f%%\n", static_cast<long long>(M),
                    static_cast<long long>(d), which ? "bf16" : "fp32", bytes / (1 << 20), s * 1e3, bytes / s * 1e-9,
                    100.0 * bytes / s / copy);
      }
    }
  }
}

}  // namespace

void register_bench_decode(CLI::App& app) {
  CLI::App* bench = app.get_subcommand("bench");
  auto f = std::make_shared<DecodeFlags>();
  CLI::App* cmd = bench->add_subcommand(
      "decode", "One-token decoding against a long KV cache: GB/s of K/V read beside this machine's memory bandwidth");
  cmd->add_option("--m", f->m, "cache lengths M (default 4096 16384 65536)")->delimiter(',')->check(integer_in(1, 1 << 22));
  cmd->add_option("--d", f->d, "head dims (default 64 128)")->delimiter(',')->check(integer_in(1, 1024));
  cmd->add_option("--heads", f->heads, "query heads (default 32)")->check(integer_in(1, 1024));
  cmd->add_option("--kv-heads", f->kv_heads, "key/value heads (default 8; must divide --heads)")
      ->check(integer_in(1, 1024));
  cmd->add_option("--batch", f->batch, "batch B (default 1)")->check(integer_in(1, 1024));
  cmd->add_option("--repeats", f->repeats, "timed calls per case, the median is reported (default 5)")
      ->check(integer_in(1, 1000));
  cmd->add_option("--precision", f->precision, "cache dtype: fp32, bf16 or both (default)")
      ->check(CLI::IsMember({"fp32", "bf16", "both"}));
  f->threads_option = add_threads_option(cmd, f->threads);
  cmd->callback([f] { bench_decode(*f); });
}

}  // namespace cabm::cli
