// What the tiled attention kernel's entry points (attention/flash.cpp) share with its tile loops,
// which are compiled once per instruction set (attention/flash_{forward,backward}_body.h, included
// by attention/flash_{avx512,avx2,portable}.cpp and chosen at run time by cpu_isa.h, the scheme
// of attention/decode_body.h): the shapes of a call, per-thread scratch, head views, and the
// declarations of each set's drivers. Also every header the bodies need: the per-set files include
// this before their `#pragma GCC target` region, so that only the kernel's own code is compiled
// for a set (nothing here uses vector types: it is the same code in every file). Internal to
// kernels/.
#pragma once

#include "cabm/core/dtype.h"
#include "cabm/core/error.h"
#include "cabm/core/tensor.h"
#include "cabm/kernels/attention/backward_split.h"
#include "cabm/kernels/attention/flash.h"
#include "cabm/kernels/attention/flash_detail.h"
#include "cabm/kernels/attention/head_rows.h"
#include "cabm/kernels/attention/row_prefetch.h"
#include "cabm/kernels/attention/score_variants.h"
#include "cabm/kernels/bf16.h"
#include "cabm/kernels/attention/tile_mask.h"

#include <omp.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cfloat>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include "cabm/kernels/x86_intrinsics.h"
#endif

namespace cabm::flash {

inline constexpr float kLog2e = 1.4426950408889634f;
inline constexpr float kLn2 = 0.6931471805599453f;
inline constexpr int64_t kPackBytes = 16 << 20;  // the forward's packed K and V (attention_flash_forward)
// With the score variants, weights below 2^kNegligible of the row's maximum (forward) or sum
// (backward) are set to 0. ALiBi's biases put many scores there, and their products with dO,
// dP − D and V would be denormal floats, whose microcode assists made the backward 2× slower
// (N = 2048, paper slopes); they change no row sum (M · 2^−64 ≪ 2^−24).
inline constexpr float kNegligible = -64.0f;

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
inline int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }

// A 64-byte aligned float buffer, zero-initialised (so padding lanes never hold NaN).
class Floats {
 public:
  Floats() = default;
  explicit Floats(int64_t n) {
    const size_t bytes = static_cast<size_t>(round_up(std::max<int64_t>(n, 1) * 4, 64));
    data_.reset(static_cast<float*>(std::aligned_alloc(64, bytes)));
    CABM_CHECK(data_ != nullptr, "out of memory allocating {} bytes", bytes);
    std::fill_n(data_.get(), bytes / 4, 0.0f);
  }
  float* get() const { return data_.get(); }

 private:
  struct Free {
    void operator()(float* p) const { std::free(p); }
  };
  std::unique_ptr<float[], Free> data_;
};

// Per-thread buffers that outlive a call: OpenMP's threads are pooled, so a thread reuses its
// buffers from one call to the next instead of paying page faults for fresh memory every time
// (packed K/V and per-head backward buffers are megabytes). A buffer grows to the largest size a
// thread has needed and is freed when the thread ends. Contents are unspecified.
enum Slot { kPackedK, kPackedV, kQt, kS, kO, kMaskTile, kZ, kM, kL, kAlpha, kTileMax,
            kKt, kVt, kKs, kDKt, kDVt, kDP, kLse2, kDelta, kDQ, kHeadQ, kHeadG, kQOff, kKOff, kCapGrad,
            kSplitDq, kSlots };
inline float* scratch(Slot slot, int64_t n) {
  thread_local std::array<std::pair<int64_t, Floats>, kSlots> pool;
  auto& [capacity, buffer] = pool[slot];
  if (capacity < n) {
    buffer = Floats(n);
    capacity = n;
  }
  return buffer.get();
}

using detail::head_rows;
using detail::HeadRows;
using detail::prefetch_rows_for_write;
using detail::queue_backward_head;
using detail::RowPrefetch;

// The inputs q, k, v have elements of type T: float, or bf16 for the bf16 kernels' SIMD path
// (attention/flash_detail.h). bf16 is widened exactly (a 16-bit shift) whenever a tile is packed,
// so every block product runs on fp32 tiles. With T = bf16 the other operands of the products are
// rounded to bf16 values (kept in fp32) where attention/flash_bf16.h says: P before P·V in the
// forward; dO, P∘z and dS in the backward. Everything else (scores, softmax statistics, D, dP,
// the accumulators) is fp32 either way.
template <typename T>
struct InputRows {
  const T* data;
  int64_t stride;
  const T* row(int64_t r) const { return data + r * stride; }
};
template <typename T>
inline InputRows<T> input_rows(const Tensor& t, int64_t b, int64_t h) {
  return {t.data<T>() + b * t.stride(0) + h * t.stride(2), t.stride(1)};
}
inline float widen(float x) { return x; }
inline float widen(bf16 x) { return bf16_to_float(x); }
// dst[0, n) = src[0, n) for rows of a few hundred bytes, in 64-byte pieces that the compiler
// copies inline: std::copy_n called memmove once per row, which was 10% of a training-shape call
// (B 32, N 128, H 8, d 32, causal, forward and backward; perf, Intel Xeon, session 27).
inline void copy_row(const float* src, int64_t n, float* dst) {
  int64_t c = 0;
  for (; c + 16 <= n; c += 16) std::memcpy(dst + c, src + c, 64);
  for (; c < n; ++c) dst[c] = src[c];
}
template <typename T>
inline void widen_row(const T* src, int64_t n, float* dst) {
  if constexpr (std::is_same_v<T, float>) {
    copy_row(src, n, dst);
  } else {
    for (int64_t c = 0; c < n; ++c) dst[c] = widen(src[c]);
  }
}
template <typename T>
inline constexpr bool kRoundsProducts = std::is_same_v<T, bf16>;

// The shapes and constants of one call, shared by all threads.
struct Problem {
  int64_t B, N, H, M, d, dv;
  int64_t Hkv, group;  // key/value heads; query heads per key/value head (H / Hkv)
  int64_t block_q, block_k;
  float scale;          // of the scores
  float operand_scale;  // of the products' packed operand: ScoreVariants::operand_scale
  float keep_scale;     // 1 / (1 − dropout)
  bool dropout;
  bool bf16;  // bf16 inputs, products' operands rounded (see InputRows)
  ScoreVariants variants;
};

inline Problem make_problem(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& options,
                     const FlashConfig& config, bool backward) {
  CABM_CHECK(options.dropout >= 0.0f && options.dropout < 1.0f, "dropout {} outside [0, 1)", options.dropout);
  check_attention_variants(options, q.size(2), q.size(1), k.size(1));
  // The fp32 rules for bf16 inputs too: these are the fp32 bodies, on widened tiles.
  const FlashConfig tiles = flash_resolved_config(config, options, q.size(3), q.size(1), backward, DType::F32);
  Problem p{};
  p.B = q.size(0), p.N = q.size(1), p.H = q.size(2), p.M = k.size(1), p.d = q.size(3), p.dv = v.size(3);
  p.Hkv = k.size(2), p.group = p.H / p.Hkv;
  p.block_q = tiles.block_q, p.block_k = tiles.block_k;
  p.scale = attention_scale(options, q.size(3));
  p.variants = score_variants(options, p.N, p.M);
  p.operand_scale = p.variants.operand_scale(p.scale);
  p.keep_scale = 1.0f / (1.0f - options.dropout);
  p.dropout = options.dropout > 0.0f;
  p.bf16 = q.dtype() == DType::BF16;
  return p;
}

// The query rows of each query head a thread holds at once (detail::backward_chunk_rows; with
// long sequences N = 65536, d = 64: 48 MiB per thread without chunks). Rows are counted at the
// widest vector, 16 lanes, so that the chunks do not depend on the instruction set.
inline constexpr int64_t kMaxWidth = 16;
inline int64_t backward_chunk_rows(const Problem& p, const FlashConfig& config) {
  const int64_t row_bytes = 4 * p.group * (round_up(p.d, kMaxWidth) + p.d + p.dv + 2);
  return detail::backward_chunk_rows(p.N, p.block_q, row_bytes, config);
}

// The backward's split of few heads (attention/backward_split.h): the key tiles of each chunk are
// cut into runs of equal estimated cost, as many as the processors this process may use (at most
// 16), never as many as the threads, so that dq is the same bits for every thread count, as out,
// lse, dk and dv are. With fewer threads than runs a thread takes several runs.
using detail::backward_whole_heads;
using detail::split_costs;
using detail::split_key_tiles;
using detail::split_sum_floats;
using detail::SplitPartials;

// The drivers of one instruction set, for inputs of element type T (float, or bf16 for the bf16
// kernels' SIMD path; see InputRows), explicitly instantiated for both in each set's file. Shapes
// are checked by the caller (attention/flash.cpp).
#define CABM_FLASH_DECLARE_SET(set)                                                                      \
  namespace set {                                                                                        \
  template <typename T>                                                                                  \
  void forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& options,       \
               const Tensor& out, const Tensor* lse, const FlashConfig& config);                         \
  template <typename T>                                                                                  \
  void backward(const AttentionSaved& saved, const Tensor& dout, const AttentionOptions& options,        \
                const AttentionGrads& grads, const FlashConfig& config);                                 \
  }
CABM_FLASH_DECLARE_SET(avx512)
CABM_FLASH_DECLARE_SET(avx2)
CABM_FLASH_DECLARE_SET(portable)
#undef CABM_FLASH_DECLARE_SET

}  // namespace cabm::flash
