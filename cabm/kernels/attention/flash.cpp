// The tiled attention kernel's entry points: shape checks, tile sizes, and the choice of the
// instruction set whose tile loops run (attention/flash_{forward,backward}_body.h, compiled once
// per set in attention/flash_{avx512,avx2,portable}.cpp; cpu_isa.h chooses, once per process).
#include "cabm/kernels/attention/flash.h"
#include "cabm/kernels/attention/flash_detail.h"
#include "cabm/kernels/attention/flash_item.h"
#include "cabm/kernels/bf16.h"
#include "cabm/kernels/cpu_isa.h"

#include <omp.h>

#include <algorithm>
#include <atomic>

namespace cabm {
namespace {

template <typename T>
void flash_forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& options,
                   const Tensor& out, const Tensor* lse, const FlashConfig& config) {
  switch (simd_isa()) {
    case SimdIsa::kAvx512:
      return flash::avx512::forward<T>(q, k, v, options, out, lse, config);
    case SimdIsa::kAvx2:
      return flash::avx2::forward<T>(q, k, v, options, out, lse, config);
    case SimdIsa::kPortable:
      break;
  }
  flash::portable::forward<T>(q, k, v, options, out, lse, config);
}

template <typename T>
void flash_backward(const AttentionSaved& saved, const Tensor& dout, const AttentionOptions& options,
                    const AttentionGrads& grads, const FlashConfig& config) {
  switch (simd_isa()) {
    case SimdIsa::kAvx512:
      return flash::avx512::backward<T>(saved, dout, options, grads, config);
    case SimdIsa::kAvx2:
      return flash::avx2::backward<T>(saved, dout, options, grads, config);
    case SimdIsa::kPortable:
      break;
  }
  flash::portable::backward<T>(saved, dout, options, grads, config);
}

}  // namespace

bool flash_square_fp32_tiles() {
  return cpu_l1d_bytes() >= kFlashSquareTilesMinL1dBytes && avx512_fmas_per_cycle() >= kFlashSquareTilesMinFmasPerCycle;
}

const char* flash_isa() {
  return simd_isa_name(simd_isa());
}

bool flash_supports_variants(int64_t H, int64_t Hkv, const AttentionOptions& options) {
  (void)H, (void)Hkv, (void)options;
  return true;  // GQA/MQA, soft-capping and ALiBi, with every mask kind and dropout
}

FlashConfig flash_resolved_config(const FlashConfig& config, const AttentionOptions& options, int64_t d, int64_t n,
                                  bool backward, DType dtype) {
  FlashConfig c = config;
  CABM_CHECK(c.block_q >= 0 && c.block_k >= 0, "flash tile sizes must be >= 0, got {}x{}", c.block_q, c.block_k);
  // Chosen on Zen 3 with AVX2 (32 KiB L1d, 512 KiB L2); differences between neighbouring choices
  // were within the measurement noise of a shared machine (±10%), so the rules are structural:
  //  - the broadcast dimension of the big products (keys in the forward's S = K·Qᵀ, queries in the
  //    backward's S and dP) is a multiple of the micro-kernel's 6 rows: no tail blocks;
  //  - the lane dimension is a multiple of 16 (two AVX2 vectors, a quarter of an AVX-512 chunk);
  //  - for d > 64 the forward takes 32 query rows so that Qᵀ and Oᵀ stay at 16 KiB each.
  //  - short sequences (N <= 256) with a diagonal (causal, sliding window) take 32 × 32 tiles:
  //    there nearly every tile of the default size straddles the diagonal and pays for a mask.
  //    Measured (B·N = 4096, H 8, 2 threads, causal; tile sizes interleaved in one process):
  //    N = 128, d 32: forward +24–31%, backward +12–24%; N = 256: +17% and +9–11%; at N = 512
  //    the gain is down to ≈ 5% and the defaults stay.
  //  - the forward takes 192 keys per tile (96 before): half the tiles, so half the rescales of Oᵀ
  //    and the per-tile bookkeeping of the online softmax. The Zen 5 (session 13, nine pairs 32–128
  //    × 48–192) ran 192 best in 3 of 4 cases (+3–5%, then inside its noise); the Zen 4 (session
  //    24, N 4096, H 8, 2 threads, three interleaved rounds, d 64 and 128, with and without a
  //    causal mask) ran it ahead of 96 in all 24 pairs of measurements, on the avx2 and the avx512
  //    set alike (+0.2 to +2.6 points of the FMA peak); 384 did as well but on avx2 at d 128
  //    (−1.5 to −3.3). The backward stays at 96 × 96. (Not for one query row, KV-cache decoding:
  //    its row sees whole tiles, no diagonal.)
  //  - fp32 inputs on cores with two 512-bit FMA pipes and a 48 KiB L1d (avx512_fmas_per_cycle()
  //    ≥ 1.5, measured; cpu_l1d_bytes()) take 64 × 64 tiles, forward and backward, on the avx512
  //    set. Measured on an Intel Xeon family 6 model 167 (session 27, docs/attention_performance.md:
  //    N 4096, H 8, 2 threads, three interleaved rounds of 10 forward and 8 backward shapes), 64 × 64
  //    was the best forward in all of d 64 / 128 × none / causal (+1.3 to +2.2 points of the FMA
  //    peak over 64 × 192 at d 64, +9.6 to +11.5 over 32 × 192 at d 128) and the best or within 0.5
  //    of it backward (+2.6 to +7.4 over 96 × 96). 32-lane tiles lost most (a 12 × 2 micro-kernel
  //    for them, as many accumulators as 6 × 4, did no better), and 192 keys of scores (48 KiB at
  //    64 lanes) do not stay in L1 between the products. The rule first keyed on AMX, which such
  //    Xeons have but a VM may hide: on a model 207 Xeon without AMX exposed (session 34, five
  //    interleaved rounds) the forward ran 1.02–1.24× as fast at 64 × 64 (1.24× at d 128 without a
  //    mask), the backward 0.90–1.10× (inside that host's noise). Other CPUs keep the rules above
  //    (the Zen 4, one 512-bit FMA per cycle, ran 192 keys best; the Zen 5, 48 KiB L1d and two
  //    512-bit FMA pipes by AMD's description, should meet the rule, where 64 × 64 is unmeasured),
  //    and so do the bf16 kernels' packed and portable paths (their AMX backward ran 7–18% slower
  //    at 64 × 64 on the model 167); their fp32 SIMD path asks for the fp32 rules (flash_item.h).
  const bool short_diagonal =
      n > 1 && n <= 256 && (options.mask.causal_align() != CausalAlign::kNone || options.mask.has_window());
  const bool square_fp32 = dtype == DType::F32 && simd_isa() == SimdIsa::kAvx512 && flash_square_fp32_tiles();
  const int64_t default_q = short_diagonal ? 32 : square_fp32 ? 64 : backward ? 96 : (d > 64 ? 32 : 64);
  const int64_t default_k = short_diagonal ? 32 : square_fp32 ? 64 : backward ? 96 : 192;
  // With a block-sparse layout, tiles that coincide with its blocks let whole blocks be skipped.
  const auto& layouts = options.mask.block_layouts();
  if (c.block_q == 0) {
    c.block_q = default_q;
    if (!layouts.empty() && layouts[0].block_q >= 8 && layouts[0].block_q <= 256) c.block_q = layouts[0].block_q;
  }
  if (c.block_k == 0) {
    c.block_k = default_k;
    if (!layouts.empty() && layouts[0].block_k >= 8 && layouts[0].block_k <= 256) c.block_k = layouts[0].block_k;
  }
  return c;
}

void attention_flash_forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& options,
                             const Tensor& out, const Tensor* lse, const FlashConfig& config) {
  check_attention_shapes(q, k, v, out);
  flash_forward<float>(q, k, v, options, out, lse, config);
}

void attention_flash_backward(const AttentionSaved& saved, const Tensor& dout, const AttentionOptions& options,
                              const AttentionGrads& grads, const FlashConfig& config) {
  check_attention_backward_shapes(saved, dout, grads, DType::F32, /*need_lse=*/true);
  flash_backward<float>(saved, dout, options, grads, config);
}

namespace detail {

namespace {
std::atomic<int> g_split_runs_pin{0};
}  // namespace

int backward_split_runs() {
  const int pinned = g_split_runs_pin.load(std::memory_order_relaxed);
  if (pinned > 0) return pinned;
  static const int runs = std::clamp(omp_get_num_procs(), 1, kMaxSplitRuns);
  return runs;
}

int64_t backward_chunk_rows(int64_t N, int64_t block_q, int64_t row_bytes, const FlashConfig& config) {
  CABM_CHECK(config.backward_rows >= 0, "backward_rows must be >= 0, got {}", config.backward_rows);
  if (config.backward_rows > 0) return std::min(N, (config.backward_rows + block_q - 1) / block_q * block_q);
  if (N * row_bytes <= kBackwardChunkBytes) return N;
  return std::max<int64_t>(1, kBackwardChunkBytes / row_bytes / block_q) * block_q;
}

void set_backward_split_runs(int runs) {
  CABM_CHECK(runs >= 0 && runs <= kMaxSplitRuns, "set_backward_split_runs: {} is not in [0, {}]", runs, kMaxSplitRuns);
  g_split_runs_pin.store(runs, std::memory_order_relaxed);
}

void attention_flash_bf16_forward_simd(const Tensor& q, const Tensor& k, const Tensor& v,
                                       const AttentionOptions& options, const Tensor& out, const Tensor* lse,
                                       const FlashConfig& config) {
  flash_forward<bf16>(q, k, v, options, out, lse, config);
}

void attention_flash_bf16_backward_simd(const AttentionSaved& saved, const Tensor& dout,
                                        const AttentionOptions& options, const AttentionGrads& grads,
                                        const FlashConfig& config) {
  flash_backward<bf16>(saved, dout, options, grads, config);
}

}  // namespace detail

}  // namespace cabm