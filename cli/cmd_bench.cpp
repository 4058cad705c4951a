// `cabm bench attention`: times the attention kernels on this machine and puts the numbers in
// context: GFLOP/s, the fraction of this machine's FMA peak (measured by the same command), the
// memory the call touched, and the speed-up over the reference kernel.
//
// FLOP convention (FlashAttention's): forward 4·B·H·d·pairs, backward 2.5× that, where pairs
// counts only the (query, key) pairs the mask allows: N·M without a mask, N(N+1)/2 causal,
// Σ min(i+1, 256) for the sliding window, the allowed blocks' areas for BigBird, N·(N − N/4) for
// padding. So a masked case is credited only with the work it must do; skipped tiles earn nothing.
// `padding` is PyTorch's float key_padding_mask as cabm's interop turns it into a mask: an additive
// tensor [B, 1, 1, N], 0 for the first N − N/4 keys and −inf for the rest. It is per element, so
// no tile is skipped: it measures what a tensor mask costs.
//
// The inputs are head views of one fused [B, N, 3·H·d] projection, as nn/ produces them (the
// same setup as bench/bench_attention.cpp, which has the Google Benchmark form of these cases).
//
// --precision bf16 times attention_flash_bf16_forward / _backward instead (the same values rounded
// to bf16, out / lse / gradients F32); --precision both times fp32 and bf16 back to back for each
// case and prints them side by side with the speed ratio (bf16 time / fp32 time inverted) and the
// bf16 path that ran (amx_bf16, avx512_bf16, avx2_fp32 / avx512_fp32 or portable), and its speed
// as a fraction of the peak of the unit that path uses: the header prints the FMA peak and, on
// CPUs that have them, the vdpbf16ps and AMX tdpbf16ps peaks, each measured by a register-only
// loop in the same run (cli/bench_util.h).
#include "cabm/core/error.h"
#include "cabm/core/memory.h"
#include "cabm/core/tensor.h"
#include "cabm/core/threads.h"
#include "cabm/kernels/attention/attention.h"
#include "cabm/kernels/attention/block_sparse.h"
#include "cabm/kernels/attention/flash_bf16.h"
#include "cabm/kernels/bf16.h"
#include "cabm/kernels/cpu_isa.h"
#include "cabm/kernels/machine_wisdom.h"
#include "cli/bench_util.h"
#include "cli/commands.h"
#include "cli/flags.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace cabm::cli {

namespace {

constexpr int64_t kWindow = 256;          // keys per query in the "window" case, own position included
constexpr int64_t kReferenceMaxN = 2048;  // the reference is O(N·M) work per row and slow: skipped above
// Flag ranges: far beyond a useful benchmark, small enough that B·N·H·d and B·H·N·N stay exact
// in double and int64; memory is checked separately (validate).
constexpr int64_t kMaxN = 1 << 20;
constexpr int64_t kMaxHeadDim = 1024;
constexpr int64_t kMaxHeads = 1024;
constexpr int64_t kMaxBatch = 1 << 16;
constexpr int64_t kMaxRepeats = 1 << 20;

struct BenchFlags {
  std::vector<int64_t> n{256, 1024};
  std::vector<int64_t> d{64};
  std::vector<std::string> masks{"none", "causal", "window", "bigbird"};
  int64_t heads = 8;
  int64_t batch = 1;
  int64_t repeats = 5;
  int threads = 0;
  bool json = false;
  bool backward = false;
  std::string precision = "fp32";  // fp32, bf16 or both
  FlashConfig tiles;                // 0: the kernels' defaults (flash_resolved_config)
  // Variants (issue 13): key/value heads (0 = H), soft-capping (0 = off), ALiBi (paper slopes).
  int64_t kv_heads = 0;
  float softcap = 0.0f;
  bool alibi = false;
  CLI::Option* threads_option = nullptr;
  bool fp32() const { return precision != "bf16"; }
  bool bf16() const { return precision != "fp32"; }
};

struct Problem {
  int64_t B, H, N, d;
  std::string mask_name;
  Tensor qkv, q, k, v, out, lse, dout, grad_buffer;
  Tensor qkv16, q16, k16, v16, out16, lse16;  // bf16 copies of q, k, v (when timing bf16)
  AttentionOptions options;
  AttentionGrads grads;
  double pairs = 0;  // attended (query, key) pairs, summed over heads and batch

  Problem(int64_t B_, int64_t H_, int64_t N_, int64_t d_, const std::string& mask, bool with_bf16)
      : B(B_), H(H_), N(N_), d(d_), mask_name(mask) {
    const int64_t E = H * d;
    qkv = Tensor::empty({B, N, 3 * E});
    fill_uniform(qkv, 1);
    const Tensor heads = qkv.view({B, N, 3, H, d});
    q = heads.select(2, 0);
    k = heads.select(2, 1);
    v = heads.select(2, 2);
    // Outputs and gradients are zero-filled (touched) here, like the inputs, so that the memory
    // measured during the calls is the kernels' working memory only.
    out = Tensor::zeros({B, N, H, d});
    lse = Tensor::zeros({B, H, N});
    dout = Tensor::empty({B, N, H, d});
    fill_uniform(dout, 2);
    grad_buffer = Tensor::zeros({B, N, 3, H, d});
    grads = {grad_buffer.select(2, 0), grad_buffer.select(2, 1), grad_buffer.select(2, 2)};
    if (with_bf16) {
      qkv16 = Tensor::empty({B, N, 3 * E}, DType::BF16);
      float_to_bf16(qkv.data<float>(), qkv16.data<bf16>(), qkv.numel());
      const Tensor heads16 = qkv16.view({B, N, 3, H, d});
      q16 = heads16.select(2, 0);
      k16 = heads16.select(2, 1);
      v16 = heads16.select(2, 2);
      out16 = Tensor::zeros({B, N, H, d});
      lse16 = Tensor::zeros({B, H, N});
    }
    double per_head = 0;
    if (mask == "none") {
      per_head = static_cast<double>(N) * static_cast<double>(N);
    } else if (mask == "causal") {
      options.mask = Mask::causal();
      per_head = 0.5 * static_cast<double>(N) * static_cast<double>(N + 1);
    } else if (mask == "window") {
      options.mask = Mask::sliding_window(kWindow - 1, 0);
      for (int64_t i = 0; i < N; ++i) per_head += static_cast<double>(std::min(i + 1, kWindow));
    } else if (mask == "bigbird") {
      BigBirdConfig config;  // blocks of 64: 1 local block each side, 1 global, 2 random
      BlockSparseLayout layout = bigbird_layout(N, N, config);
      const int64_t nb = layout.blocks.size(1), mb = layout.blocks.size(2), blk = layout.block_q;
      const uint8_t* allowed = layout.blocks.data<uint8_t>();
      for (int64_t qb = 0; qb < nb; ++qb)
        for (int64_t kb = 0; kb < mb; ++kb)
          if (allowed[qb * mb + kb])
            per_head +=
                static_cast<double>(std::min(blk, N - qb * blk)) * static_cast<double>(std::min(blk, N - kb * blk));
      options.mask = Mask::block_sparse(std::move(layout));
    } else if (mask == "padding") {
      const int64_t valid = N - N / 4;
      Tensor bias = Tensor::zeros({B, 1, 1, N});
      float* row = bias.data<float>();
      for (int64_t b = 0; b < B; ++b) std::fill(row + b * N + valid, row + (b + 1) * N, -INFINITY);
      options.mask = Mask::additive(bias);
      per_head = static_cast<double>(N) * static_cast<double>(valid);
    } else {
      throw Error(fmt::format("--masks: unknown mask '{}' (expected none, causal, window, bigbird or padding)", mask));
    }
    pairs = per_head * static_cast<double>(B * H);
  }

  // GQA: K and V (and their gradients and bf16 copies) keep the first kv_heads heads of the
  // packed buffers; soft-capping and ALiBi go into the options. The FLOPs are the same.
  void apply_variants(const BenchFlags& f) {
    if (f.kv_heads > 0 && f.kv_heads != H) {
      for (Tensor* t : {&k, &v, &k16, &v16, &grads.dk, &grads.dv})
        if (t->defined()) *t = t->narrow(2, 0, f.kv_heads);
    }
    options.softcap = f.softcap;
    if (f.alibi) options.alibi_slopes = alibi_paper_slopes(H);
  }

  double forward_flops() const { return 4.0 * pairs * static_cast<double>(d); }
};

struct Timing {
  double seconds = 0;  // median
  int64_t memory = 0;  // peak RSS increase during the calls, bytes
};

Timing time_calls(int64_t repeats, const std::function<void()>& call) {
  using Clock = std::chrono::steady_clock;
  MemoryProbe probe;
  probe.start();
  call();  // warm-up (first-touch of buffers, thread pool start)
  std::vector<double> seconds;
  for (int64_t r = 0; r < repeats; ++r) {
    const auto t0 = Clock::now();
    call();
    seconds.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return {median(seconds), probe.peak_increase()};
}

struct Row {
  int64_t N, d;
  std::string mask, direction;
  std::string precision;  // of the kernel the main columns measured: fp32, or bf16 under --precision bf16
  double flops, seconds, gflops, percent_peak;
  int64_t memory;
  std::optional<double> reference_seconds;
  std::optional<int64_t> reference_memory;
  std::optional<Timing> bf16;  // --precision both: the bf16 kernel, timed after the fp32 one
  std::string bf16_path;       // the bf16 path that ran, when bf16 was timed
};

std::vector<Row> run_case(const BenchFlags& f, int64_t N, int64_t d, const std::string& mask, double peak) {
  Problem p(f.batch, f.heads, N, d, mask, f.bf16());
  p.apply_variants(f);
  const bool with_reference = N <= kReferenceMaxN;
  const int64_t reference_repeats = std::min<int64_t>(f.repeats, 3);
  std::vector<Row> rows;
  // main: the fp32 kernel (or the bf16 one under --precision bf16); bf16: --precision both.
  auto add = [&](const std::string& direction, double flops, const Timing& t, const std::optional<Timing>& ref,
                 const std::optional<Timing>& bf16, const char* bf16_path) {
    Row row{N,
            d,
            mask,
            direction,
            f.fp32() ? "fp32" : "bf16",
            flops,
            t.seconds,
            flops / t.seconds * 1e-9,
            100.0 * flops / t.seconds / peak,
            t.memory,
            std::nullopt,
            std::nullopt,
            bf16,
            f.bf16() ? bf16_path : ""};
    if (ref) {
      row.reference_seconds = ref->seconds;
      row.reference_memory = ref->memory;
    }
    rows.push_back(row);
  };

  std::optional<Timing> fwd16;
  if (f.bf16()) {
    fwd16 = time_calls(f.repeats,
                       [&] { attention_flash_bf16_forward(p.q16, p.k16, p.v16, p.options, p.out16, &p.lse16, f.tiles); });
  }
  const Timing fwd =
      f.fp32() ? time_calls(f.repeats, [&] { attention_flash_forward(p.q, p.k, p.v, p.options, p.out, &p.lse, f.tiles); })
               : *fwd16;
  std::optional<Timing> fwd_ref;
  if (with_reference) {
    fwd_ref = time_calls(reference_repeats,
                         [&] { attention_reference_forward(p.q, p.k, p.v, p.options, p.out, nullptr, &p.lse); });
  }
  add("forward", p.forward_flops(), fwd, fwd_ref, f.fp32() ? fwd16 : std::nullopt, attention_flash_bf16_path());

  if (f.backward) {
    std::optional<Timing> bwd16;
    if (f.bf16()) {
      attention_flash_bf16_forward(p.q16, p.k16, p.v16, p.options, p.out16, &p.lse16, f.tiles);
      const AttentionSaved saved16{p.q16, p.k16, p.v16, p.out16, p.lse16};
      bwd16 = time_calls(f.repeats, [&] { attention_flash_bf16_backward(saved16, p.dout, p.options, p.grads, f.tiles); });
    }
    attention_flash_forward(p.q, p.k, p.v, p.options, p.out, &p.lse, f.tiles);
    const AttentionSaved saved{p.q, p.k, p.v, p.out, p.lse};
    const Timing bwd =
        f.fp32() ? time_calls(f.repeats, [&] { attention_flash_backward(saved, p.dout, p.options, p.grads, f.tiles); }) : *bwd16;
    std::optional<Timing> bwd_ref;
    if (with_reference) {
      const AttentionSaved ref_saved{p.q, p.k, p.v, p.out, Tensor()};
      bwd_ref =
          time_calls(reference_repeats, [&] { attention_reference_backward(ref_saved, p.dout, p.options, p.grads); });
    }
    add("backward", 2.5 * p.forward_flops(), bwd, bwd_ref, f.fp32() ? bwd16 : std::nullopt,
        attention_flash_bf16_backward_path());
  }
  return rows;
}

std::string mib(int64_t bytes) {
  return fmt::format("{:.1f}", static_cast<double>(bytes) / (1024.0 * 1024.0));
}

void check_mask(const std::string& m) {
  if (m != "none" && m != "causal" && m != "window" && m != "bigbird" && m != "padding")
    throw Error(fmt::format("unknown mask '{}' (expected none, causal, window, bigbird or padding)", m));
}

void check_precision(const std::string& p) {
  if (p != "fp32" && p != "bf16" && p != "both")
    throw Error(fmt::format("unknown precision '{}' (expected fp32, bf16 or both)", p));
}

// The flags' ranges are checked as they are parsed (register_bench); what remains is whether
// the largest case fits in memory: q, k, v, out, dout and three gradients of B·N·H·d floats
// (bf16 copies besides), and the reference kernel's B·H·N·N weights up to kReferenceMaxN.
void validate(const BenchFlags& f) {
  if (f.n.empty() || f.d.empty() || f.masks.empty())
    throw UsageError("--n, --d and --masks need at least one value each");
  if (f.kv_heads > 0 && f.heads % f.kv_heads != 0)
    throw UsageError(fmt::format("--heads ({}) must be a multiple of --kv-heads ({})", f.heads, f.kv_heads));
  const double n = static_cast<double>(*std::max_element(f.n.begin(), f.n.end()));
  const double d = static_cast<double>(*std::max_element(f.d.begin(), f.d.end()));
  const double bh = static_cast<double>(f.batch) * static_cast<double>(f.heads);
  const double reference_n = std::min(n, static_cast<double>(kReferenceMaxN));
  check_fits_in_memory(bh * n * d * 4 * (8 + (f.bf16() ? 3 : 0)) + bh * reference_n * reference_n * 4,
                       fmt::format("bench attention --batch {} --heads {} --n {} --d {}", f.batch, f.heads, n, d));
}

// The peak of the unit a bf16 path runs its products on (FLOP/s): the AMX tiles, vdpbf16ps, or
// the fp32 FMAs (the paths that widen bf16 to fp32).
struct Peaks {
  double fma = 0, vdpbf16ps = 0, amx = 0;
  double of_path(const std::string& path) const {
    if (path == "amx_bf16" && amx > 0) return amx;
    if (path == "avx512_bf16" && vdpbf16ps > 0) return vdpbf16ps;
    return fma;
  }
};

void bench_attention(const BenchFlags& f) {
  apply_threads(f.threads_option, f.threads);
  validate(f);
  const double peak = measure_fma_peak();
  Peaks peaks{peak, 0, 0};
  if (f.bf16()) {
    peaks.vdpbf16ps = measure_vdpbf16ps_peak();
    peaks.amx = measure_amx_bf16_peak();
  }
  std::vector<Row> rows;
  const bool side_by_side = f.fp32() && f.bf16();
  if (!f.json) {
    if (f.fp32()) {
      std::printf("attention kernel: flash (%s), threads %d, B %lld, H %lld, repeats %lld (median)\n", flash_isa(),
                  num_threads(), static_cast<long long>(f.batch), static_cast<long long>(f.heads),
                  static_cast<long long>(f.repeats));
    } else {
      std::printf("attention kernel: flash bf16 (forward %s, backward %s), threads %d, B %lld, H %lld, repeats %lld "
                  "(median)\n",
                  attention_flash_bf16_path(), attention_flash_bf16_backward_path(), num_threads(),
                  static_cast<long long>(f.batch), static_cast<long long>(f.heads), static_cast<long long>(f.repeats));
    }
    if (f.kv_heads > 0 || f.softcap > 0 || f.alibi)
      std::printf("variants: %lld key/value heads, softcap %g, alibi %s\n",
                  static_cast<long long>(f.kv_heads > 0 ? f.kv_heads : f.heads), f.softcap, f.alibi ? "paper slopes" : "off");
    if (side_by_side)
      std::printf("bf16: attention_flash_bf16 on the same values rounded to bf16, timed after fp32 in the same run; "
                  "bf16/fp32 = fp32 time / bf16 time\n");
    if (side_by_side) std::printf("bf16 products: %s\n", bf16_products_summary().c_str());
    std::printf("FMA peak (%s loop, %d threads): %.1f GFLOP/s\n", fma_peak_isa(), num_threads(), peak * 1e-9);
    if (peaks.vdpbf16ps > 0)
      std::printf("vdpbf16ps peak (AVX512_BF16 loop, %d threads): %.1f GFLOP/s\n", num_threads(), peaks.vdpbf16ps * 1e-9);
    if (peaks.amx > 0)
      std::printf("AMX tdpbf16ps peak (4 tiles, %d threads): %.1f GFLOP/s\n", num_threads(), peaks.amx * 1e-9);
    if (side_by_side) std::printf("bf16_%%unit: bf16 GFLOP/s as %% of the peak of the unit its path uses\n");
    std::printf("GFLOP/s: forward 4*B*H*d*pairs, backward 2.5x, pairs = attended (query, key) pairs only\n");
    std::printf(
        "mem: peak RSS increase during the calls (inputs, outputs, gradients excluded); ref: reference kernel, skipped for N > %lld\n\n",
        static_cast<long long>(kReferenceMaxN));
    std::printf("%6s %5s %-8s %-8s %10s %9s %6s %8s %10s %8s %8s", "N", "d", "mask", "pass", "time_ms", "GFLOP/s",
                "%peak", "mem_MiB", "ref_ms", "ref_MiB", "speedup");
    if (side_by_side)
      std::printf(" %10s %9s %9s %10s %-12s", "bf16_ms", "bf16_GF/s", "bf16/fp32", "bf16_%unit", "bf16_path");
    std::printf("\n");
    std::fflush(stdout);
  }
  for (int64_t d : f.d)
    for (const std::string& mask : f.masks)
      for (int64_t N : f.n)
        for (const Row& r : run_case(f, N, d, mask, peak)) {
          rows.push_back(r);
          if (!f.json) {
            std::printf("%6lld %5lld %-8s %-8s %10.3f %9.2f %6.1f %8s %10s %8s %8s", static_cast<long long>(r.N),
                        static_cast<long long>(r.d), r.mask.c_str(), r.direction.c_str(), r.seconds * 1e3, r.gflops,
                        r.percent_peak, mib(r.memory).c_str(),
                        r.reference_seconds ? fmt::format("{:.3f}", *r.reference_seconds * 1e3).c_str() : "-",
                        r.reference_memory ? mib(*r.reference_memory).c_str() : "-",
                        r.reference_seconds ? fmt::format("{:.1f}x", *r.reference_seconds / r.seconds).c_str() : "-");
            if (r.bf16)
              std::printf(" %10.3f %9.2f %9.2f %10.1f %-12s", r.bf16->seconds * 1e3, r.flops / r.bf16->seconds * 1e-9,
                          r.seconds / r.bf16->seconds, 100.0 * r.flops / r.bf16->seconds / peaks.of_path(r.bf16_path),
                          r.bf16_path.c_str());
            std::printf("\n");
            std::fflush(stdout);
          }
        }
  if (f.json) {
    nlohmann::json j;
    j["kernel_isa"] = flash_isa();
    j["precision"] = f.precision;
    if (f.bf16()) {
      j["bf16_path"] = attention_flash_bf16_path();
      j["bf16_backward_path"] = attention_flash_bf16_backward_path();
      j["bf16_products"] = bf16_products_summary();
    }
    j["peak_isa"] = fma_peak_isa();
    j["threads"] = num_threads();
    j["batch"] = f.batch;
    j["heads"] = f.heads;
    j["kv_heads"] = f.kv_heads > 0 ? f.kv_heads : f.heads;
    j["softcap"] = f.softcap;
    j["alibi"] = f.alibi;
    j["repeats"] = f.repeats;
    j["peak_gflops"] = peak * 1e-9;
    if (peaks.vdpbf16ps > 0) j["vdpbf16ps_peak_gflops"] = peaks.vdpbf16ps * 1e-9;
    if (peaks.amx > 0) j["amx_bf16_peak_gflops"] = peaks.amx * 1e-9;
    j["flop_convention"] = "forward 4*B*H*d*attended_pairs, backward 2.5x forward";
    j["memory"] = "peak RSS increase during the timed calls, bytes (inputs, outputs and gradients excluded)";
    j["cases"] = nlohmann::json::array();
    for (const Row& r : rows) {
      nlohmann::json c;
      c["N"] = r.N;
      c["d"] = r.d;
      c["mask"] = r.mask;
      c["pass"] = r.direction;
      c["precision"] = r.precision;
      if (!r.bf16_path.empty()) c["bf16_path"] = r.bf16_path;
      c["flops"] = r.flops;
      c["time_ms"] = r.seconds * 1e3;
      c["gflops"] = r.gflops;
      c["percent_peak"] = r.percent_peak;
      c["memory_bytes"] = r.memory;
      c["reference_time_ms"] = r.reference_seconds ? nlohmann::json(*r.reference_seconds * 1e3) : nlohmann::json();
      c["reference_memory_bytes"] = r.reference_memory ? nlohmann::json(*r.reference_memory) : nlohmann::json();
      c["speedup_vs_reference"] =
          r.reference_seconds ? nlohmann::json(*r.reference_seconds / r.seconds) : nlohmann::json();
      if (r.bf16) {
        c["bf16_time_ms"] = r.bf16->seconds * 1e3;
        c["bf16_gflops"] = r.flops / r.bf16->seconds * 1e-9;
        c["bf16_percent_peak"] = 100.0 * r.flops / r.bf16->seconds / peak;
        c["bf16_percent_unit_peak"] = 100.0 * r.flops / r.bf16->seconds / peaks.of_path(r.bf16_path);
        c["bf16_memory_bytes"] = r.bf16->memory;
        c["bf16_speed_vs_fp32"] = r.seconds / r.bf16->seconds;
      }
      j["cases"].push_back(c);
    }
    j["machine_values"] = machine_values_summary();
    j["max_cpu_isa"] = cpu_isa_cap_name(cpu_isa_cap());
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("%s\n", machine_values_summary().c_str());  // what chose the tiles and the bf16 unit
    if (!cpu_isa_cap_line().empty()) std::printf("%s\n", cpu_isa_cap_line().c_str());
  }
}

}  // namespace

void register_bench(CLI::App& app) {
  CLI::App* bench = app.add_subcommand("bench", "Benchmarks of the kernels on this machine");
  bench->require_subcommand(1);
  CLI::App* cmd = bench->add_subcommand(
      "attention", "Time the flash attention kernel (and the reference) over sizes and masks: GFLOP/s, % of FMA peak");
  auto f = std::make_shared<BenchFlags>();
  cmd->add_option("--n", f->n, "sequence lengths N = M (default 256 1024)")
      ->delimiter(',')
      ->check(integer_in(1, kMaxN));
  cmd->add_option("--d", f->d, "head dims (default 64)")->delimiter(',')->check(integer_in(1, kMaxHeadDim));
  cmd->add_option("--masks", f->masks,
                  "none, causal, window (256 keys, causal side), bigbird (blocks of 64), padding (an additive "
                  "[B, 1, 1, N] tensor, the last N/4 keys -inf); default none, causal, window, bigbird")
      ->delimiter(',')
      ->check(accepted_by(check_mask, "none, causal, window, bigbird or padding"));
  cmd->add_option("--heads", f->heads, "heads H (default 8)")->check(integer_in(1, kMaxHeads));
  cmd->add_option("--batch", f->batch, "batch B (default 1)")->check(integer_in(1, kMaxBatch));
  cmd->add_option("--repeats", f->repeats,
                  "timed calls per case, the median is reported (default 5; reference: at most 3)")
      ->check(integer_in(1, kMaxRepeats));
  f->threads_option = add_threads_option(cmd, f->threads);
  cmd->add_flag("--json", f->json, "machine-readable output (one JSON object)");
  cmd->add_option("--block-q", f->tiles.block_q, "flash tile: query rows (default: the kernels' choice)")
      ->check(integer_in(0, 4096));
  cmd->add_option("--block-k", f->tiles.block_k, "flash tile: keys (default: the kernels' choice)")
      ->check(integer_in(0, 4096));
  cmd->add_flag("--backward", f->backward, "also time the backward pass");
  cmd->add_option("--kv-heads", f->kv_heads, "key/value heads for grouped-query attention (default: --heads)")
      ->check(integer_in(1, kMaxHeads));
  cmd->add_option("--softcap", f->softcap, "logit soft-capping c (default 0: off)")->check(real_in({0.0, 1e30}));
  cmd->add_flag("--alibi", f->alibi, "ALiBi with the paper's slopes");
  cmd->add_option("--precision", f->precision,
                  "fp32 (default), bf16 (attention_flash_bf16 kernels) or both (side by side, with the ratio)")
      ->check(accepted_by(check_precision, "fp32, bf16 or both"));
  cmd->callback([f] { bench_attention(*f); });
}

}  // namespace cabm::cli
